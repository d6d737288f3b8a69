"""What a person sees of a schedule and its occurrences."""

from __future__ import annotations

from cairn.daemon.schedules.store import OccurrenceRow, ScheduleRow, Store
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.replies import OccurrenceView, ScheduleView
from cairn.schedules import ScheduleSpec, elapses_after, format_instant, render_timer, timer_name

OCCURRENCE_LIMIT = 50


def used(store: Store, schedule_id: str, revision: int | None) -> int:
    if revision is None:
        return 0
    return int(
        store.db.execute(
            "SELECT count(*) FROM occurrences WHERE schedule_id=? AND revision=?"
            " AND state IN ('queued','preparing','launched')",
            (schedule_id, revision),
        ).fetchone()[0]
    )


def occurrence(occ: OccurrenceRow) -> OccurrenceView:
    return OccurrenceView(
        key=occ.key,
        trigger=occ.trigger,
        nominal=format_instant(occ.nominal),
        revision=occ.revision,
        state=occ.state,
        reason=occ.reason,
        run_id=occ.run_id,
        run_state=occ.run_state,
        at=format_instant(occ.created_at),
    )


def occurrence_view(occ: OccurrenceRow) -> JSONObject:
    """:func:`occurrence` as cairnd sends it."""
    return occurrence(occ).model_dump(mode="json")


def schedule_view(store: Store, row: ScheduleRow) -> ScheduleView:
    """What a person sees of one schedule; ``timer`` is the exact unit file the caller's
    user manager must hold (None when no timer should exist)."""
    revision = row.confirmed_revision if row.status == "enabled" else row.revision
    spec = store.spec(row.schedule_id, revision or row.revision)
    last = store.occurrences(row.schedule_id, limit=1)
    return ScheduleView(
        schedule_id=row.schedule_id,
        name=row.name,
        status=row.status,
        revision=row.revision,
        confirmed_revision=row.confirmed_revision,
        awaiting_confirmation=row.confirmed_revision != row.revision,
        definition=spec.definition,
        project=spec.project,
        calendar=spec.calendar,
        timezone=spec.timezone,
        catch_up=spec.catch_up,
        overlap=spec.overlap,
        min_spacing_sec=spec.min_spacing_sec,
        max_runs=spec.max_runs,
        runs_used=used(store, row.schedule_id, row.confirmed_revision),
        valid_until=format_instant(spec.valid_until),
        launch_failures=row.launch_failures,
        blocked_reason=row.blocked_reason,
        timer_unit=timer_name(row.schedule_id),
        timer=(
            render_timer(row.schedule_id, revision, spec)
            if row.status == "enabled" and revision is not None
            else None
        ),
        last_occurrence=occurrence(last[0]) if last else None,
    )


def view(store: Store, row: ScheduleRow) -> JSONObject:
    """:func:`schedule_view` as cairnd sends it."""
    return schedule_view(store, row).model_dump(mode="json")


def next_elapses(spec: ScheduleSpec, now: float, count: int = 3) -> list[str]:
    return [format_instant(t) for t in elapses_after(spec.calendar, now, count)]
