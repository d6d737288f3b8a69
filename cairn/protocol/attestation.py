"""The owner's attestation of a launch (ARCHITECTURE §7): how the run's owner, and no one
else, tells root which launch description it asked for.

The owner's CLI makes a socketpair and passes one end to cairnd with its request. cairnd
writes the frozen description to it (one JSON line, :data:`DESCRIPTION_LIMIT` bytes at
most) and hands the same end to the broker with ``launch-v1 <run>``. The CLI checks the
description against what it asked for, hashes it itself and writes one
:func:`attestation_line`, which only the broker reads. The kernel names the socketpair's
creator (``SO_PEERCRED``): cairn can pass the end on, read from it or withhold it, but
cannot write a line that arrives from the owner's side.
"""

from __future__ import annotations

from cairn.canonical import canonical_json, sha256_hex
from cairn.protocol.names import is_hash, is_run_id

TYPE_CHECKING = False  # typing is for type checkers only: a launch imports this module
if TYPE_CHECKING:
    from collections.abc import Mapping

# The one line: "attest-v1 <run ID> sha256:<64 lowercase hex digits>\n", and nothing else.
ATTESTATION_VERB = "attest-v1"
ATTESTATION_LENGTH = len(ATTESTATION_VERB) + 1 + 37 + 1 + 71 + 1
ATTESTATION_LIMIT = 128
# How long the broker waits for the owner's line after cairnd handed it the channel.
ATTESTATION_TIMEOUT_SEC = 60.0
DESCRIPTION_LIMIT = 16 << 20


def launch_hash_of(description: Mapping[str, object]) -> str:
    """The launch hash of a description in its JSON form (``model_dump(mode="json")``, or
    the description line as parsed): the owner hashes what it read, root what it validated,
    and the two agree only when they are the same description."""
    data = _unset(description, ("replay",))
    limits, evaluators, routes = data.get("limits"), data.get("evaluators"), data.get("routes")
    if isinstance(limits, dict):
        data["limits"] = _unset(limits, ("model_cost_cents", "daily_cost_cents"))
    if isinstance(evaluators, list):
        data["evaluators"] = [
            _unset(spec, ("allowlist",)) if isinstance(spec, dict) else spec
            for spec in evaluators
        ]
    if isinstance(routes, dict):
        data["routes"] = {
            name: _unset(route, ("input_price_per_million", "output_price_per_million"))
            if isinstance(route, dict) else route
            for name, route in routes.items()
        }
    return "sha256:" + sha256_hex(canonical_json(data))


def _unset(data: Mapping[str, object], later: tuple[str, ...]) -> dict[str, object]:
    """``data`` without the keys of ``later`` (fields added after runs were launched) that
    are None: a run launched before them keeps its hash."""
    return {key: value for key, value in data.items() if not (key in later and value is None)}


def attestation_line(run_id: str, launch_hash: str) -> bytes:
    """The one line the owner writes: the run and the hash of the description it checked."""
    if not (is_run_id(run_id) and is_hash(launch_hash)):
        raise ValueError(f"not an attestation: {run_id!r} {launch_hash!r}")
    return f"{ATTESTATION_VERB} {run_id} {launch_hash}\n".encode()


def parse_attestation(line: bytes) -> tuple[str, str] | None:
    """(run ID, launch hash) of an exact attestation line, else None."""
    if len(line) != ATTESTATION_LENGTH or not line.endswith(b"\n") or not line.isascii():
        return None
    words = line[:-1].decode().split(" ")
    if len(words) != 3 or words[0] != ATTESTATION_VERB:
        return None
    _, run_id, launch_hash = words
    if not (is_run_id(run_id) and is_hash(launch_hash)):
        return None
    return run_id, launch_hash

