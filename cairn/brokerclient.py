"""Client side of the broker socket: one ``<verb> <run-id>`` line, one JSON reply."""

from __future__ import annotations

import socket

from cairn import paths
from cairn.errors import BrokerRefused, CairnError
from cairn.models import BrokerReply, Verb

REPLY_LIMIT = 16 << 20


def call_broker(verb: Verb, run_id: str, *, timeout: float = 3600.0) -> BrokerReply:
    """Ask the broker to carry out the run's pending intents of ``verb``.

    Raises :class:`BrokerRefused` when the broker answers with an error.
    """
    if not paths.RUN_ID_RE.match(run_id):
        raise CairnError(f"not a run ID: {run_id!r}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(paths.broker_socket()))
        except OSError as exc:
            raise BrokerRefused(
                f"cannot reach the broker at {paths.broker_socket()}: {exc.strerror}",
                hint="is cairn-broker.socket active? (systemctl status cairn-broker.socket)",
            ) from exc
        sock.sendall(f"{verb} {run_id}\n".encode())
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > REPLY_LIMIT:
                raise BrokerRefused("broker reply too large")
    raw = b"".join(chunks).strip()
    if not raw:
        raise BrokerRefused(f"broker closed the connection without a reply to {verb}")
    reply = BrokerReply.model_validate_json(raw)
    if not reply.ok:
        raise BrokerRefused(f"broker refused {verb} for {run_id}: {reply.error}")
    return reply
