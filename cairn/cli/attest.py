"""The owner's side of a launch's attestation (ARCHITECTURE §7, :mod:`cairn.protocol.attestation`).

A request that may start a run carries one end of a socketpair this process made. cairnd
writes the description it froze to it; this side checks that description against what the
person asked for, hashes it itself, and writes the one line the broker pins the run by. A
description that is not what was asked for is never attested: root starts nothing.
"""

from __future__ import annotations

import os
import select

from cairn import leanjson
from cairn.errors import PermissionDenied
from cairn.protocol.attestation import DESCRIPTION_LIMIT, attestation_line, launch_hash_of
from cairn.protocol.names import is_run_id

TYPE_CHECKING = False  # typing is for type checkers only: every launch imports this module
if TYPE_CHECKING:
    from _socket import socket
    from collections.abc import Mapping

    from cairn.protocol.jsonvalue import JSONObject


class Expected:
    """What the person asked for; each field given must hold in the description. (A plain
    class: a NamedTuple loads typing and a dataclass inspect, and every launch would pay.)"""

    __slots__ = (
        "project", "definition", "review_hash", "source", "run_id", "schedule_id",
        "replay_of", "apply_mode", "args", "scripted",
    )

    def __init__(
        self,
        *,
        project: str | None = None,
        definition: str | None = None,
        review_hash: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        schedule_id: str | None = None,
        replay_of: str | None = None,
        apply_mode: str | None = None,
        args: Mapping[str, object] | None = None,
        scripted: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        self.project = project
        self.definition = definition
        self.review_hash = review_hash
        self.source = source
        self.run_id = run_id
        self.schedule_id = schedule_id
        self.replay_of = replay_of
        self.apply_mode = apply_mode
        # The arguments sent (the description may add the input model's defaults).
        self.args = args
        # The scripted profiles sent, as JSON; None: the run keeps those recorded earlier
        # (a schedule, a replayed run, an upgraded run).
        self.scripted = scripted

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"Expected({given})"

    def replace(self, **changes: object) -> Expected:
        """A copy with ``changes`` (field names as the constructor takes them)."""
        return Expected(**{**{k: getattr(self, k) for k in self.__slots__}, **changes})

    def check(self, raw: bytes) -> tuple[str, str]:
        """(run ID, launch hash) of the description in ``raw`` if it is what was asked
        for; otherwise :class:`PermissionDenied` naming the first difference.

        The description is read as JSON, not through its model (a launch loads no pydantic):
        the hash is taken over exactly what was checked, and root starts the run only if
        the description it validated hashes the same, so a field this side did not read as
        root will (another type, a key root drops) is a refusal, never a different run."""
        try:
            desc = leanjson.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser
            raise refusal("cairnd", f"sent a description this CLI cannot read ({exc})") from None
        if not isinstance(desc, dict):
            raise refusal("cairnd", "sent a description that is not a JSON object")
        run_id = desc.get("run_id")
        if not is_run_id(run_id):
            raise refusal("cairnd", f"sent a description with the run ID {run_id!r}")
        uid = os.getuid()
        project = _mapping(desc.get("project"))
        schedule = _mapping(desc.get("schedule"))
        replay = _mapping(desc.get("replay"))
        wrong = [
            f"{what} is {actual!r}, not {wanted!r}"
            for what, actual, wanted in (
                ("the owner", desc.get("owner_uid"), uid),
                ("the project's owner", project.get("owner_uid"), uid),
                ("the project", project.get("root"), self.project),
                ("the definition", desc.get("definition"), self.definition),
                ("the review hash", desc.get("review_hash"), self.review_hash),
                ("the run", run_id, self.run_id),
                ("the schedule", schedule.get("id"), self.schedule_id),
                ("the replayed run", replay.get("source_run"), self.replay_of),
                ("the apply mode", desc.get("apply_mode"), self.apply_mode),
            )
            if wanted is not None and not _identical(actual, wanted)
        ]
        if self.source is not None and desc.get("source") != self.source:
            wrong.append("the source is not the one sent")
        frozen_args = _mapping(desc.get("args"))
        changed = sorted(
            k for k, v in (self.args or {}).items() if not _same(frozen_args.get(k), v)
        )
        if changed:
            wrong.append(f"the arguments {', '.join(changed)} are not the ones sent")
        if self.scripted is not None:
            frozen = {
                name: {k: v for k, v in profile.items() if k != "name"}
                for name, profile in _mapping(desc.get("profiles")).items()
                if isinstance(profile, dict) and profile.get("kind") == "scripted"
            }
            sent = {
                name: {k: v for k, v in spec.items() if k != "name"}
                for name, spec in self.scripted.items()
            }
            if frozen != sent:
                wrong.append("the scripted profiles are not the ones sent")
        if wrong:
            raise refusal(run_id, "; ".join(wrong))
        return run_id, launch_hash_of(desc)


def _mapping(value: object) -> JSONObject:
    """A JSON object of the description, or an empty one in place of anything else (its
    fields then differ from what was asked for, or root refuses the description)."""
    return value if isinstance(value, dict) else {}


def _identical(actual: object, wanted: object) -> bool:
    """Equal with the same JSON type: the owner ``"1000"`` or ``True`` is not ``1000``."""
    return type(actual) is type(wanted) and actual == wanted


def _same(frozen: object, sent: object) -> bool:
    """An argument as sent and as frozen: equal, or a scalar the input model coerced
    (``"5"`` to ``5``)."""
    scalars = (str, int, float, bool)
    return frozen == sent or (
        isinstance(frozen, scalars) and isinstance(sent, scalars) and str(frozen) == str(sent)
    )


def refusal(run: str, why: str) -> PermissionDenied:
    return PermissionDenied(
        f"not attesting {run}: {why}",
        hint="nothing was started; if this repeats, cairnd is not the installed one: "
        "'systemctl status cairn.service'",
    )


def exchange(sock: socket, channel: socket, expected: Expected) -> bytes:
    """Read cairnd's reply on ``sock`` while answering the description that arrives on
    ``channel`` (at most one) with this process's attestation."""
    poller = select.poll()  # not selectors: a launch would pay for importing it
    poller.register(sock, select.POLLIN)
    poller.register(channel, select.POLLIN)
    from_channel = channel.fileno()
    timeout = sock.gettimeout()
    reply: list[bytes] = []
    description = b""
    try:
        while True:
            ready = poller.poll(None if timeout is None else timeout * 1000)
            if not ready:
                raise TimeoutError("cairnd did not answer in time")
            for fd, _ in ready:
                if fd == from_channel:
                    chunk = channel.recv(1 << 16)
                    description += chunk
                    if not chunk or len(description) > DESCRIPTION_LIMIT:
                        poller.unregister(from_channel)
                        channel.close()
                    elif description.endswith(b"\n"):
                        poller.unregister(from_channel)
                        run_id, launch_hash = expected.check(description)
                        channel.sendall(attestation_line(run_id, launch_hash))
                        channel.close()
                    continue
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return b"".join(reply)
                reply.append(chunk)
    finally:
        channel.close()
