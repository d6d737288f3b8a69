"""The owner's side of a launch's attestation (ARCHITECTURE §7, :mod:`cairn.protocol.attestation`).

A request that may start a run carries one end of a socketpair this process made. cairnd
writes the description it froze to it; this side checks that description against what the
person asked for, hashes it itself, and writes the one line the broker pins the run by. A
description that is not what was asked for is never attested: root starts nothing.
"""

from __future__ import annotations

import os
import selectors
import socket
from dataclasses import dataclass
from typing import Any

from cairn.errors import PermissionDenied
from cairn.protocol.attestation import DESCRIPTION_LIMIT, attestation_line


@dataclass(frozen=True)
class Expected:
    """What the person asked for; each field given must hold in the description."""

    project: str | None = None
    definition: str | None = None
    review_hash: str | None = None
    source: str | None = None
    run_id: str | None = None
    schedule_id: str | None = None
    replay_of: str | None = None
    apply_mode: str | None = None
    # The arguments sent (the description may add the input model's defaults).
    args: dict[str, Any] | None = None
    # The scripted profiles sent, as JSON; None: the run keeps those recorded earlier (a
    # schedule, a replayed run, an upgraded run).
    scripted: dict[str, dict[str, Any]] | None = None

    def check(self, raw: bytes) -> tuple[str, str]:
        """(run ID, launch hash) of the description in ``raw`` if it is what was asked
        for; otherwise :class:`PermissionDenied` naming the first difference."""
        from cairn.protocol.launch import LaunchDescription  # only a launch pays for it

        try:
            desc = LaunchDescription.model_validate_json(raw)
        except ValueError as exc:
            raise refusal("cairnd", f"sent a description this CLI cannot read ({exc})") from None
        uid = os.getuid()
        wrong = [
            f"{what} is {actual!r}, not {wanted!r}"
            for what, actual, wanted in (
                ("the owner", desc.owner_uid, uid),
                ("the project's owner", desc.project.owner_uid, uid),
                ("the project", desc.project.root, self.project),
                ("the definition", desc.definition, self.definition),
                ("the review hash", desc.review_hash, self.review_hash),
                ("the run", desc.run_id, self.run_id),
                ("the schedule", (desc.schedule or {}).get("id"), self.schedule_id),
                ("the replayed run", desc.replay and desc.replay.source_run, self.replay_of),
                ("the apply mode", desc.apply_mode, self.apply_mode),
            )
            if wanted is not None and actual != wanted
        ]
        if self.source is not None and desc.source != self.source:
            wrong.append("the source is not the one sent")
        changed = sorted(k for k, v in (self.args or {}).items() if not _same(desc.args.get(k), v))
        if changed:
            wrong.append(f"the arguments {', '.join(changed)} are not the ones sent")
        if self.scripted is not None:
            frozen = {
                name: profile.model_dump(mode="json", exclude={"name"})
                for name, profile in desc.profiles.items()
                if profile.kind == "scripted"
            }
            sent = {
                name: {k: v for k, v in spec.items() if k != "name"}
                for name, spec in self.scripted.items()
            }
            if frozen != sent:
                wrong.append("the scripted profiles are not the ones sent")
        if wrong:
            raise refusal(desc.run_id, "; ".join(wrong))
        return desc.run_id, desc.launch_hash()


def _same(frozen: Any, sent: Any) -> bool:
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


def exchange(sock: socket.socket, channel: socket.socket, expected: Expected) -> bytes:
    """Read cairnd's reply on ``sock`` while answering the description that arrives on
    ``channel`` (at most one) with this process's attestation."""
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(channel, selectors.EVENT_READ)
    reply: list[bytes] = []
    description = b""
    watching = True
    try:
        while True:
            ready = selector.select(sock.gettimeout())
            if not ready:
                raise TimeoutError("cairnd did not answer in time")
            for key, _ in ready:
                if key.fileobj is channel:
                    chunk = channel.recv(1 << 16)
                    description += chunk
                    if not chunk or len(description) > DESCRIPTION_LIMIT:
                        selector.unregister(channel)
                        watching = False
                    elif description.endswith(b"\n"):
                        selector.unregister(channel)
                        watching = False
                        run_id, launch_hash = expected.check(description)
                        channel.sendall(attestation_line(run_id, launch_hash))
                    if not watching:
                        channel.close()
                    continue
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return b"".join(reply)
                reply.append(chunk)
    finally:
        selector.close()
        channel.close()
