"""cairnd's socket: a JSON request line (plus an optional directory fd and attestation
channel) per connection.

Every request is authorized by the peer's UID from SO_PEERCRED; the client's claims
about who it is are never read.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from cairn import paths
from cairn.daemon import (
    artifacts,
    attest,
    checkpoints,
    decisions,
    doctor,
    interactions,
    launch,
    lifecycle,
    replay,
    revert,
    schedules,
    upgrade,
    views,
)
from cairn.daemon.notifications import handle as _notifications
from cairn.daemon.runref import resolve_run
from cairn.errors import CairnError, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import (
    ArtifactsRequest,
    CheckpointsRequest,
    DaemonReply,
    DiffRequest,
    DoctorRequest,
    ErrorBody,
    LaunchRequest,
    LogsRequest,
    NotificationsRequest,
    OpRequest,
    PingRequest,
    PruneRequest,
    PsRequest,
    ReconcileRequest,
    ReplayRequest,
    RequestEnvelope,
    RetryRequest,
    RevertRequest,
    RmRequest,
    RunRequest,
    ShowRequest,
    StorageDfRequest,
    UpgradeRequest,
)
from cairn.protocol.run_replies import PingReply

log = logging.getLogger(__name__)

REQUEST_LIMIT = 4 << 20


def receive(conn: socket.socket) -> tuple[bytes, int | None, int | None]:
    """Read one request line, and of the passed descriptors at most one directory (a
    project the caller proves access to) and one socket (the caller's attestation
    channel, :mod:`cairn.daemon.attest`); any other descriptor is closed."""
    data = b""
    passed: list[int] = []
    fds = array.array("i")
    try:
        while not data.endswith(b"\n") and len(data) < REQUEST_LIMIT:
            msg, ancdata, _flags, _addr = conn.recvmsg(
                65536, socket.CMSG_SPACE(fds.itemsize * 4)
            )
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - (len(payload) % got.itemsize)])
                    passed.extend(got)
            if not msg:
                break
            data += msg
    except BaseException:
        for fd in passed:
            os.close(fd)
        raise
    directory: int | None = None
    channel: int | None = None
    for fd in passed:
        mode = os.fstat(fd).st_mode
        if directory is None and stat.S_ISDIR(mode):
            directory = fd
        elif channel is None and stat.S_ISSOCK(mode):
            channel = fd
        else:
            os.close(fd)
    return data, directory, channel


def dispatch(request: OpRequest, uid: int, fd: int | None) -> Any:
    """Answer ``request`` with the handler of its op. A run named by a prefix or ``@last``
    is resolved here, for every op, so a handler only ever sees a full run ID."""
    route = ROUTES.get(request.op)
    if route is None or not isinstance(request, route[0]):
        raise unknown_op(request.op)
    journal = Journal(paths.journal_path(), create=True)
    try:
        if isinstance(request, RunRequest) and request.run_id is not None:
            request = request.model_copy(
                update={"run_id": resolve_run(journal, uid, request.run_id)}
            )
        return route[1](journal, request, uid, fd)
    finally:
        journal.close()


def unknown_op(op: object) -> UsageError:
    """A request cairnd does not serve: most likely a CLI from another cairn version."""
    return UsageError(
        f"cairnd does not know the request {op!r}",
        hint="use the cairn CLI of the installed package; after an upgrade, "
        "'systemctl restart cairn.service'",
    )


def parse(raw: bytes) -> OpRequest:
    """The request model of one request line; a request cairnd cannot read is a
    UsageError (an unknown op says so, with a hint)."""
    try:
        envelope = RequestEnvelope.model_validate_json(raw)
        # the op's own model checks what the envelope types loosely (a field several ops
        # share, such as op_id): refused the same way, never an internal error
        request: OpRequest = envelope.request()
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["loc"] == ("op",) and first["type"] == "unknown_op":
            raise unknown_op(first["input"]) from None
        if first["type"] == "run_ref":
            raise UsageError(first["msg"], hint="list your runs with 'cairn ps'") from None
        if first["type"] == "run_key":
            raise UsageError(first["msg"], hint="e.g. --run-key nightly-2026-12-06") from None
        raise UsageError(f"malformed request: {first['loc']}: {first['msg']}") from None
    return request


# --- handlers: op -> (model, handler) -------------------------------------------------

Handler = Callable[[Journal, OpRequest, int, int | None], object]
R = TypeVar("R", bound=OpRequest)


def route(
    model: type[R], handler: Callable[[Journal, R, int, int | None], object]
) -> tuple[type[OpRequest], Handler]:
    """``(model, handler)`` for :data:`ROUTES`: the handler of requests of ``model``
    (:func:`dispatch` has checked the request is one)."""

    def checked(journal: Journal, request: OpRequest, uid: int, fd: int | None) -> object:
        if not isinstance(request, model):
            raise unknown_op(request.op)
        return handler(journal, request, uid, fd)

    return model, checked


def _ping(_journal: Journal, _request: PingRequest, uid: int, _fd: int | None) -> object:
    return PingReply(uid=uid, admin=views.is_admin(uid)).model_dump(mode="json")


def _launch(journal: Journal, request: LaunchRequest, uid: int, fd: int | None) -> object:
    return launch.launch(journal, request, uid, fd)


def _upgrade(journal: Journal, request: UpgradeRequest, uid: int, _fd: int | None) -> object:
    return upgrade.upgrade(journal, request, uid)


def _doctor(journal: Journal, request: DoctorRequest, uid: int, _fd: int | None) -> object:
    return doctor.doctor(journal, request.run_id, uid)


def _revert(journal: Journal, request: RevertRequest, uid: int, _fd: int | None) -> object:
    return revert.revert(journal, request.run_id, uid)


def _replay(journal: Journal, request: ReplayRequest, uid: int, _fd: int | None) -> object:
    return replay.replay(journal, request.run_id, request.op_id, uid)


def _checkpoints(
    journal: Journal, request: CheckpointsRequest, uid: int, _fd: int | None
) -> object:
    return checkpoints.checkpoints(journal, request.run_id, uid)


def _artifacts(
    journal: Journal, request: ArtifactsRequest, uid: int, _fd: int | None
) -> object:
    return artifacts.artifacts(journal, request, uid)


def _decide(
    journal: Journal, request: ReconcileRequest | RetryRequest, uid: int, _fd: int | None
) -> object:
    return decisions.decide(journal, request, uid)


def _ps(journal: Journal, request: PsRequest, uid: int, _fd: int | None) -> object:
    return views.ps(journal, uid, request.all_users)


def _show(journal: Journal, request: ShowRequest, uid: int, _fd: int | None) -> object:
    return views.show(journal, request.run_id, uid)


def _logs(journal: Journal, request: LogsRequest, uid: int, _fd: int | None) -> object:
    return views.logs(journal, request, uid)


def _diff(journal: Journal, request: DiffRequest, uid: int, _fd: int | None) -> object:
    return views.diff(journal, request.run_id, uid)


def _df(journal: Journal, request: StorageDfRequest, uid: int, _fd: int | None) -> object:
    return lifecycle.df(journal, request, uid)


def _rm(journal: Journal, request: RmRequest, uid: int, _fd: int | None) -> object:
    return lifecycle.rm(journal, request, uid)


def _prune(journal: Journal, request: PruneRequest, uid: int, _fd: int | None) -> object:
    return lifecycle.prune(journal, request, uid)


def _person(journal: Journal, request: OpRequest, uid: int, _fd: int | None) -> object:
    return interactions.dispatch(journal, request, uid)


def _schedule(journal: Journal, request: OpRequest, uid: int, fd: int | None) -> object:
    return schedules.dispatch(journal, request, uid, fd)


ROUTES: dict[str, tuple[type[OpRequest], Handler]] = {
    "ping": route(PingRequest, _ping),
    "launch": route(LaunchRequest, _launch),
    "upgrade": route(UpgradeRequest, _upgrade),
    "doctor": route(DoctorRequest, _doctor),
    "revert": route(RevertRequest, _revert),
    "replay": route(ReplayRequest, _replay),
    "checkpoints": route(CheckpointsRequest, _checkpoints),
    "artifacts": route(ArtifactsRequest, _artifacts),
    "reconcile": route(ReconcileRequest, _decide),
    "retry": route(RetryRequest, _decide),
    "ps": route(PsRequest, _ps),
    "show": route(ShowRequest, _show),
    "logs": route(LogsRequest, _logs),
    "diff": route(DiffRequest, _diff),
    "notifications": route(NotificationsRequest, _notifications),
    "storage-df": route(StorageDfRequest, _df),
    "rm": route(RmRequest, _rm),
    "prune": route(PruneRequest, _prune),
    **{op: (model, _person) for op, model in interactions.MODELS.items()},
    **{op: (model, _schedule) for op, model in schedules.MODELS.items()},
}


def handle(conn: socket.socket) -> None:
    with conn:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        fd: int | None = None
        channel: int | None = None
        try:
            raw, fd, channel = receive(conn)
            with attest.serving(channel):
                reply = DaemonReply(ok=True, result=dispatch(parse(raw), uid, fd))
        except ValidationError as exc:  # a handler's own validation
            first = exc.errors()[0]
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
            for passed in (fd, channel):
                if passed is not None:
                    os.close(passed)
        with contextlib.suppress(OSError):
            conn.sendall(reply.model_dump_json().encode() + b"\n")


def serve(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()
