"""Schedules in cairnd, by concern:

- :mod:`.store`: the schedule database (its own SQLite file, owned by cairnd), its rows and
  the per-schedule locks;
- :mod:`.admission`: deciding an occurrence under the schedule and machine-wide locks,
  launching it as an ordinary run, following its outcome, repairing half-prepared ones;
- :mod:`.verbs`: create, confirm, resume, pause, delete, list, inspect, inbox, reconcile;
- :mod:`.views`: what a person sees of a schedule and its occurrences.

:func:`dispatch` serves one ``schedule-*`` request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from cairn.daemon.schedules.admission import (
    admit,
    repair_half_prepared,
    sync_outcomes,
)
from cairn.daemon.schedules.store import (
    COUNTED_STATES,
    SCHEMA_VERSION,
    OccurrenceRow,
    OccurrenceState,
    ScheduleRow,
    Store,
    Trigger,
    schedule_lock,
    store_path,
)
from cairn.daemon.schedules.verbs import (
    confirm,
    create,
    inbox,
    inspect,
    list_schedules,
    reconcile,
    resume,
    set_status,
)
from cairn.daemon.schedules.views import OCCURRENCE_LIMIT, view
from cairn.errors import UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.store import Clock
from cairn.protocol import daemon as protocol
from cairn.protocol.daemon import OpRequest
from cairn.protocol.jsonvalue import JSONObject
from cairn.schedules import HostScheduleConfig, host_config

__all__ = [
    "COUNTED_STATES",
    "OCCURRENCE_LIMIT",
    "SCHEMA_VERSION",
    "HostScheduleConfig",
    "OccurrenceRow",
    "OccurrenceState",
    "ScheduleRow",
    "Store",
    "Trigger",
    "admit",
    "blocked_schedules",
    "confirm",
    "create",
    "dispatch",
    "host_config",
    "inbox",
    "inspect",
    "list_schedules",
    "reconcile",
    "repair_half_prepared",
    "resume",
    "schedule_lock",
    "set_status",
    "store_path",
    "sync_outcomes",
    "view",
]


def dispatch(
    journal: Journal,
    request: OpRequest,
    uid: int,
    fd: int | None,
    *,
    clock: Clock = time.time,
) -> Any:
    """Handle one ``schedule-*`` request for the caller ``uid``; ``clock`` is the time the
    schedule store stamps and decides with."""
    route = ROUTES.get(request.op)
    if route is None or not isinstance(request, route[0]):
        raise UsageError(f"unknown schedule operation {request.op}")
    store = Store(store_path(), clock=clock)
    try:
        return route[1](store, journal, request, uid, fd)
    finally:
        store.close()


def blocked_schedules(owner: int | None) -> list[JSONObject]:
    """``cairn inbox`` items for the schedules of ``owner`` (everyone's when None) that
    repeated launch failures blocked: nothing launches until a person resumes them."""
    if not store_path().exists():
        return []
    store = Store(store_path())
    try:
        rows = store.db.execute(
            "SELECT * FROM schedules WHERE status='blocked'"
            + ("" if owner is None else " AND owner_uid=?")
            + " ORDER BY updated_at",
            () if owner is None else (owner,),
        ).fetchall()
    finally:
        store.close()
    return [
        {
            "kind": "schedule-blocked",
            "schedule_id": r["schedule_id"],
            "name": r["name"],
            "owner_uid": r["owner_uid"],
            "reason": r["blocked_reason"],
            "created_at": r["updated_at"],
            "commands": [
                f"cairn schedule inspect {r['schedule_id']}",
                f"cairn schedule resume {r['schedule_id']}",
            ],
        }
        for r in rows
    ]


_Handler = Callable[[Store, Journal, OpRequest, int, int | None], object]
R = TypeVar("R", bound=OpRequest)


def route(
    model: type[R], handler: Callable[[Store, Journal, R, int, int | None], object]
) -> tuple[type[OpRequest], _Handler]:
    """``(model, handler)`` for :data:`ROUTES`: the handler of requests of ``model``
    (:func:`dispatch` has checked the request is one)."""

    def checked(
        store: Store, journal: Journal, request: OpRequest, uid: int, fd: int | None
    ) -> object:
        if not isinstance(request, model):
            raise UsageError(f"unknown schedule operation {request.op}")
        return handler(store, journal, request, uid, fd)

    return model, checked

# op -> (request model, handler) of the schedule requests
ROUTES: dict[str, tuple[type[OpRequest], _Handler]] = {
    "schedule-create": route(
        protocol.ScheduleCreateRequest,
        lambda store, _journal, request, uid, fd: create(store, request, uid, fd),
    ),
    "schedule-confirm": route(
        protocol.ScheduleConfirmRequest,
        lambda store, _journal, request, uid, _fd: confirm(store, request, uid),
    ),
    "schedule-resume": route(protocol.ScheduleResumeRequest, resume),
    "schedule-pause": route(
        protocol.SchedulePauseRequest,
        lambda store, _journal, request, uid, _fd: set_status(store, request, uid, "paused"),
    ),
    "schedule-delete": route(
        protocol.ScheduleDeleteRequest,
        lambda store, _journal, request, uid, _fd: set_status(store, request, uid, "deleted"),
    ),
    "schedule-list": route(
        protocol.ScheduleListRequest,
        lambda store, journal, _request, uid, _fd: list_schedules(store, journal, uid),
    ),
    "schedule-inspect": route(
        protocol.ScheduleInspectRequest,
        lambda store, journal, request, uid, _fd: inspect(store, journal, request, uid),
    ),
    "schedule-fire": route(
        protocol.ScheduleFireRequest,
        lambda store, journal, request, uid, fd: admit(store, journal, request, uid, fd, "timer"),
    ),
    "schedule-run-now": route(
        protocol.ScheduleRunNowRequest,
        lambda store, journal, request, uid, fd: admit(
            store, journal, request, uid, fd, "run-now"
        ),
    ),
    "schedule-inbox": route(
        protocol.ScheduleInboxRequest,
        lambda store, journal, _request, uid, _fd: inbox(store, journal, uid),
    ),
    "schedule-reconcile": route(
        protocol.ScheduleReconcileRequest,
        lambda store, journal, _request, uid, _fd: reconcile(store, journal, uid),
    ),
}
MODELS = {op: model for op, (model, _handler) in ROUTES.items()}
