"""The broker's socket: one ``<verb> <run-id>\\n`` per connection, nothing else.

Accepted only from root or the ``cairn`` user (SO_PEERCRED). The request line is read
with a hard size limit and must match exactly; anything else is refused without reading
further. A ``launch-v1`` may carry one file descriptor (SCM_RIGHTS): the run owner's
attestation channel (:mod:`cairn.protocol.attestation`), whose creator the kernel names and
from which only the owner's one line is read. The reply is one JSON line
(:class:`cairn.protocol.broker.BrokerReply`).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import pwd
import re
import socket
import struct
import threading
from collections import defaultdict
from collections.abc import Callable

from cairn.broker.pins import Attestation
from cairn.errors import BrokerRefused, CairnError
from cairn.protocol.attestation import (
    ATTESTATION_LIMIT,
    ATTESTATION_TIMEOUT_SEC,
    parse_attestation,
)
from cairn.protocol.broker import BrokerReply, Receipt

log = logging.getLogger(__name__)

REQUEST_RE = re.compile(rb"^(launch-v1|storage-v1|delete-v1) (flow_[0-9a-f]{32})\n\Z")
MAX_REQUEST = 64
_CREDS = struct.Struct("3i")

# What the server runs for one request: carry out the verb's pending intents for the run,
# with the owner's attestation if the request carried one, never letting these UIDs attest.
CarryOut = Callable[[str, str, Attestation | None, frozenset[int]], list[Receipt]]


def allowed_uids() -> set[int]:
    uids = {0}
    with contextlib.suppress(KeyError):
        uids.add(pwd.getpwnam("cairn").pw_uid)
    return uids


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel."""
    pid, uid, gid = _CREDS.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    )
    return pid, uid, gid


def read_request(conn: socket.socket) -> tuple[str, str, int | None] | None:
    """Read at most one short line and at most one passed descriptor; return (verb,
    run_id, descriptor) only for an exact match. Every descriptor is closed unless it is
    returned."""
    data = b""
    fds: list[int] = []
    try:
        while len(data) <= MAX_REQUEST and not data.endswith(b"\n"):
            chunk, ancillary, _flags, _addr = conn.recvmsg(
                MAX_REQUEST + 1 - len(data), socket.CMSG_SPACE(4 * 4)
            )
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                    fds.extend(got)
            if not chunk:
                break
            data += chunk
    except BaseException:
        _close_all(fds)
        raise
    match = REQUEST_RE.match(data)
    if match is None or len(fds) > 1 or (fds and match.group(1) != b"launch-v1"):
        _close_all(fds)
        return None
    return match.group(1).decode(), match.group(2).decode(), fds[0] if fds else None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def read_attestation(fd: int) -> Attestation:
    """The owner's attestation from its channel (closed here): the channel's creator as
    the kernel names it, and the one exact line it wrote."""
    try:
        channel = socket.socket(fileno=fd)
    except OSError as exc:
        os.close(fd)
        raise BrokerRefused("the attestation channel is not a socket") from exc
    with channel:
        if channel.family != socket.AF_UNIX or channel.type != socket.SOCK_STREAM:
            raise BrokerRefused("the attestation channel is not a local stream socket")
        pid, uid, gid = peer_credentials(channel)
        channel.settimeout(ATTESTATION_TIMEOUT_SEC)
        data = b""
        try:
            while len(data) <= ATTESTATION_LIMIT and not data.endswith(b"\n"):
                chunk = channel.recv(ATTESTATION_LIMIT + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise BrokerRefused(f"no attestation from the run's owner: {exc}") from exc
    parsed = parse_attestation(data)
    if parsed is None:
        raise BrokerRefused("the run's owner sent no valid attestation")
    return Attestation(pid=pid, uid=uid, gid=gid, run_id=parsed[0], launch_hash=parsed[1])


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
            pid, uid, _gid = peer_credentials(conn)
            if uid not in self.uids:
                log.warning("refused connection from uid %d (pid %d)", uid, pid)
                # Take the (bounded) request line first: closing on unread data resets
                # the connection, and the caller would hear "unreachable", not why.
                refused = read_request(conn)
                if refused is not None and refused[2] is not None:
                    os.close(refused[2])
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
                        error="expected '<launch-v1|storage-v1|delete-v1> flow_<32 hex>' "
                        "(and at most one descriptor, with launch-v1 only)",
                    ),
                )
                return
            verb, run_id, channel = request
            conn.settimeout(None)
            attested = " with the owner's attestation" if channel is not None else ""
            log.info("%s %s from uid %d%s", verb, run_id, uid, attested)
            try:
                # read before the run's lock: the owner may take a while to check
                attestation = None if channel is None else read_attestation(channel)
                with self.locks[run_id]:
                    receipts = self.carry_out(verb, run_id, attestation, frozenset(self.uids))
                self.reply(conn, BrokerReply(ok=True, receipts=receipts))
            except CairnError as exc:
                log.error("%s %s: %s", verb, run_id, exc)
                self.reply(
                    conn, BrokerReply(ok=False, code=exc.code, error=exc.message, hint=exc.hint)
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
        with contextlib.suppress(OSError):
            conn.sendall(reply.model_dump_json(exclude=exclude).encode() + b"\n")
