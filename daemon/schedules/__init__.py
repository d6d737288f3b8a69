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
from typing import Any

from cairn.daemon.schedules.admission import (
    HostScheduleConfig,
    admit,
    host_config,
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
from cairn.journal import Journal
from cairn.journal.store import Clock
from cairn.protocol.daemon import DaemonRequest

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
    request: DaemonRequest,
    uid: int,
    fd: int | None,
    *,
    clock: Clock = time.time,
) -> Any:
    """Handle one ``schedule-*`` request for the caller ``uid``; ``clock`` is the time the
    schedule store stamps and decides with."""
    store = Store(store_path(), clock=clock)
    try:
        op = request.op
        if op == "schedule-create":
            return create(store, request, uid, fd)
        if op == "schedule-confirm":
            return confirm(store, request, uid)
        if op == "schedule-resume":
            return resume(store, journal, request, uid, fd)
        if op == "schedule-pause":
            return set_status(store, request, uid, "paused")
        if op == "schedule-delete":
            return set_status(store, request, uid, "deleted")
        if op == "schedule-list":
            return list_schedules(store, journal, uid)
        if op == "schedule-inspect":
            return inspect(store, journal, request, uid)
        if op == "schedule-fire":
            return admit(store, journal, request, uid, fd, "timer")
        if op == "schedule-run-now":
            return admit(store, journal, request, uid, fd, "run-now")
        if op == "schedule-inbox":
            return inbox(store, journal, uid)
        if op == "schedule-reconcile":
            return reconcile(store, journal, uid)
        raise UsageError(f"unknown schedule operation {op}")
    finally:
        store.close()
