"""cairnd's socket: a JSON request line (plus an optional directory fd) per connection.

Every request is authorized by the peer's UID from SO_PEERCRED; the client's claims
about who it is are never read.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import struct
import threading
from typing import Any

from pydantic import ValidationError

from cairn import paths
from cairn.daemon import decisions, doctor, interactions, launch, schedules, upgrade, views
from cairn.errors import CairnError, UsageError
from cairn.journal import Journal
from cairn.protocol.daemon import DaemonReply, DaemonRequest, ErrorBody

log = logging.getLogger(__name__)

REQUEST_LIMIT = 4 << 20


def receive(conn: socket.socket) -> tuple[bytes, int | None]:
    """Read one request line and at most one passed file descriptor."""
    data = b""
    fd: int | None = None
    fds = array.array("i")
    while not data.endswith(b"\n") and len(data) < REQUEST_LIMIT:
        msg, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(fds.itemsize * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - (len(payload) % got.itemsize)])
                for extra in got[1:] if fd is None else got:
                    os.close(extra)
                if fd is None and len(got):
                    fd = got[0]
        if not msg:
            break
        data += msg
    return data, fd


def dispatch(request: DaemonRequest, uid: int, fd: int | None) -> Any:
    journal = Journal(paths.journal_path(), create=True)
    try:
        if request.op == "ping":
            return {"uid": uid, "admin": views.is_admin(uid)}
        if request.op.startswith("schedule-"):
            return schedules.dispatch(journal, request, uid, fd)
        if request.op in interactions.OPS:
            return interactions.dispatch(journal, request, uid)
        if request.op == "launch":
            return launch.launch(journal, request, uid, fd)
        if request.op == "upgrade":
            return upgrade.upgrade(journal, request, uid)
        if request.op == "doctor":
            return doctor.doctor(journal, request.run_id, uid)
        if request.op in ("reconcile", "retry"):
            return decisions.decide(journal, request, uid)
        if request.op == "ps":
            return views.ps(journal, uid, request.all_users)
        if request.op == "show":
            return views.show(journal, request.run_id, uid)
        if request.op == "logs":
            return views.logs(journal, request.run_id, uid)
        if request.op == "diff":
            return views.diff(journal, request.run_id, uid)
        raise unknown_op(request.op)
    finally:
        journal.close()


def unknown_op(op: object) -> UsageError:
    """A request cairnd does not serve: most likely a CLI from another cairn version."""
    return UsageError(
        f"cairnd does not know the request {op!r}",
        hint="use the cairn CLI of the installed package; after an upgrade, "
        "'systemctl restart cairn.service'",
    )


def handle(conn: socket.socket) -> None:
    with conn:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        fd: int | None = None
        try:
            raw, fd = receive(conn)
            request = DaemonRequest.model_validate_json(raw)
            reply = DaemonReply(ok=True, result=dispatch(request, uid, fd))
        except ValidationError as exc:
            first = exc.errors()[0]
            if first["loc"] == ("op",) and first["type"] == "literal_error":
                error = unknown_op(first["input"])
                body = ErrorBody(code=error.code, message=error.message, hint=error.hint)
            else:
                body = ErrorBody(
                    code="usage", message=f"malformed request: {first['loc']}: {first['msg']}"
                )
            reply = DaemonReply(ok=False, error=body)
        except CairnError as exc:
            reply = DaemonReply(
                ok=False, error=ErrorBody(code=exc.code, message=exc.message, hint=exc.hint)
            )
        except Exception as exc:
            log.exception("request from uid %d failed", uid)
            reply = DaemonReply(
                ok=False,
                error=ErrorBody(
                    code="internal",
                    message=f"internal error in cairnd: {exc}",
                    hint="see 'journalctl -u cairn.service'",
                ),
            )
        finally:
            if fd is not None:
                os.close(fd)
        try:
            conn.sendall(reply.model_dump_json().encode() + b"\n")
        except OSError:
            pass


def serve(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()
