"""The broker's socket: one ``<verb> <run-id>\\n`` per connection, nothing else.

Accepted only from root or the ``cairn`` user (SO_PEERCRED). The request line is read
with a hard size limit and must match exactly; anything else is refused without reading
further. The reply is one JSON line (:class:`cairn.protocol.broker.BrokerReply`).
"""

from __future__ import annotations

import logging
import pwd
import re
import socket
import struct
import threading
from collections import defaultdict
from collections.abc import Callable

from cairn.errors import CairnError
from cairn.protocol.broker import BrokerReply, Receipt

log = logging.getLogger(__name__)

REQUEST_RE = re.compile(rb"^(launch-v1|storage-v1|delete-v1) (flow_[0-9a-f]{32})\n$")
MAX_REQUEST = 64

# What the server runs for one request: carry out the verb's pending intents for the run.
CarryOut = Callable[[str, str], list[Receipt]]


def allowed_uids() -> set[int]:
    uids = {0}
    try:
        uids.add(pwd.getpwnam("cairn").pw_uid)
    except KeyError:
        pass
    return uids


def read_request(conn: socket.socket) -> tuple[str, str] | None:
    """Read at most one short line; return (verb, run_id) only for an exact match."""
    data = b""
    while len(data) <= MAX_REQUEST and not data.endswith(b"\n"):
        chunk = conn.recv(MAX_REQUEST + 1 - len(data))
        if not chunk:
            break
        data += chunk
    match = REQUEST_RE.match(data)
    if match is None:
        return None
    return match.group(1).decode(), match.group(2).decode()


class BrokerServer:
    """Serve connections; one thread each, one lock per run so a run's verbs serialize."""

    def __init__(self, listener: socket.socket, carry_out: CarryOut) -> None:
        self.listener = listener
        self.carry_out = carry_out
        self.locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self.uids = allowed_uids()

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", creds)
            if uid not in self.uids:
                log.warning("refused connection from uid %d (pid %d)", uid, pid)
                # Take the (bounded) request line first: closing on unread data resets
                # the connection, and the caller would hear "unreachable", not why.
                read_request(conn)
                self.reply(
                    conn,
                    BrokerReply(
                        ok=False,
                        code="permission-denied",
                        error="only root and the cairn user may call",
                    ),
                )
                return
            request = read_request(conn)
            if request is None:
                log.warning("refused malformed request from uid %d (pid %d)", uid, pid)
                self.reply(
                    conn,
                    BrokerReply(
                        ok=False,
                        code="usage",
                        error="expected '<launch-v1|storage-v1|delete-v1> flow_<32 hex>'",
                    ),
                )
                return
            verb, run_id = request
            conn.settimeout(None)
            log.info("%s %s from uid %d", verb, run_id, uid)
            with self.locks[run_id]:
                try:
                    receipts = self.carry_out(verb, run_id)
                    self.reply(conn, BrokerReply(ok=True, receipts=receipts))
                except CairnError as exc:
                    log.error("%s %s: %s", verb, run_id, exc)
                    self.reply(
                        conn,
                        BrokerReply(ok=False, code=exc.code, error=exc.message, hint=exc.hint),
                    )
                except Exception as exc:  # a broker bug must still answer, then be visible
                    log.exception("%s %s crashed", verb, run_id)
                    self.reply(
                        conn, BrokerReply(ok=False, code="internal", error=f"internal error: {exc}")
                    )

    @staticmethod
    def reply(conn: socket.socket, reply: BrokerReply) -> None:
        # No "hint" key unless there is a hint: a client older than the field (a coordinator
        # started before an upgrade) refuses keys it does not know.
        exclude = {"hint"} if reply.hint is None else None
        try:
            conn.sendall(reply.model_dump_json(exclude=exclude).encode() + b"\n")
        except OSError:
            pass
