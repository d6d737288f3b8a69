"""Client side of the broker socket: one ``<verb> <run-id>`` line, one JSON reply.

Verbs are idempotent (intents carry IDs, the broker keeps receipts), so a call that lost
its connection — the broker restarted or crashed mid-verb — is simply repeated.
"""

from __future__ import annotations

import logging
import socket
import sys
import time

from cairn import paths
from cairn.errors import BrokerRefused, CairnError, Unavailable
from cairn.protocol.broker import BrokerReply, Verb
from cairn.protocol.names import is_run_id

log = logging.getLogger(__name__)

REPLY_LIMIT = 16 << 20
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)


class _Unreachable(Exception):
    """The connection failed or closed without a reply: safe to repeat. ``sent``: the
    request (and any descriptor) reached the broker's socket."""

    def __init__(self, problem: str, *, sent: bool) -> None:
        super().__init__(problem)
        self.sent = sent


def _exchange(verb: Verb, run_id: str, timeout: float, channel: int | None) -> bytes:
    sent = False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(paths.broker_socket()))
            line = f"{verb} {run_id}\n".encode()
            if channel is None:
                sock.sendall(line)
            else:
                fd = channel.to_bytes(4, sys.byteorder)
                sock.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd)])
            sent = True
            chunks: list[bytes] = []
            size = 0
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > REPLY_LIMIT:
                    raise BrokerRefused("broker reply too large")
        except OSError as exc:
            raise _Unreachable(exc.strerror or str(exc), sent=sent) from exc
    raw = b"".join(chunks).strip()
    if not raw:
        raise _Unreachable("connection closed without a reply", sent=True)
    return raw


def call_broker(
    verb: Verb, run_id: str, *, timeout: float = 3600.0, attestation: int | None = None
) -> BrokerReply:
    """Ask the broker to carry out the run's pending intents of ``verb``.

    ``attestation``: the run owner's attestation channel (:mod:`cairn.protocol.attestation`),
    passed with the first try only: its one line is read once, and a repeated call finds
    the run pinned or not.

    Repeats the call while the broker cannot be reached; raises :class:`BrokerRefused`
    when it answers with an error (carrying the broker's code and hint) and
    :class:`Unavailable` when it stays unreachable.
    """
    if not is_run_id(run_id):
        raise CairnError(f"not a run ID: {run_id!r}")
    problem = ""
    for delay in (*RETRY_DELAYS, None):
        try:
            raw = _exchange(verb, run_id, timeout, attestation)
            break
        except _Unreachable as exc:
            problem = str(exc)
            if delay is None:
                raise Unavailable(
                    f"cannot reach the broker at {paths.broker_socket()}: {problem}",
                    hint="is cairn-broker.socket active? (systemctl status cairn-broker.socket)",
                ) from exc
            log.warning("%s %s: %s; retrying in %.1fs", verb, run_id, problem, delay)
            if exc.sent:
                attestation = None
            time.sleep(delay)
    reply = BrokerReply.model_validate_json(raw)
    if not reply.ok:
        error = BrokerRefused(f"broker refused {verb} for {run_id}: {reply.error}", hint=reply.hint)
        if reply.code:
            error.code = reply.code  # the broker's own code, e.g. "storage" or "not-found"
        raise error
    return reply
