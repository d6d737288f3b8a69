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

import re

from cairn.canonical import canonical_json, sha256_hex

TYPE_CHECKING = False  # typing is for type checkers only: a launch imports this module
if TYPE_CHECKING:
    from typing import Any

ATTESTATION_RE = re.compile(rb"^attest-v1 (flow_[0-9a-f]{32}) (sha256:[0-9a-f]{64})\n\Z")
ATTESTATION_LIMIT = 128
# How long the broker waits for the owner's line after cairnd handed it the channel.
ATTESTATION_TIMEOUT_SEC = 60.0
DESCRIPTION_LIMIT = 16 << 20


def launch_hash_of(description: dict[str, Any]) -> str:
    """The launch hash of a description in its JSON form (``model_dump(mode="json")``, or
    the description line as parsed): the owner hashes what it read, root what it validated,
    and the two agree only when they are the same description."""
    data = dict(description)
    if data.get("replay", ...) is None:  # added later: a launched run's hash stays what it was
        del data["replay"]
    return "sha256:" + sha256_hex(canonical_json(data))


def attestation_line(run_id: str, launch_hash: str) -> bytes:
    """The one line the owner writes: the run and the hash of the description it checked."""
    line = f"attest-v1 {run_id} {launch_hash}\n".encode()
    if ATTESTATION_RE.match(line) is None:
        raise ValueError(f"not an attestation: {line!r}")
    return line


def parse_attestation(line: bytes) -> tuple[str, str] | None:
    """(run ID, launch hash) of an exact attestation line, else None."""
    match = ATTESTATION_RE.match(line)
    if match is None:
        return None
    return match.group(1).decode(), match.group(2).decode()
