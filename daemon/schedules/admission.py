"""Admission of schedule occurrences, and following what became of them.

A timer wakeup is only a reminder: admission runs here, under the schedule's lock and (for
the decision) the machine-wide lock, and an admitted occurrence becomes an ordinary run
through :func:`cairn.daemon.launch.launch` — and so through the one machine-wide
admission of every launch (:mod:`cairn.daemon.admission`): a launched occurrence's run may
be ``queued`` for a slot, which counts as active here. Launch failures and workflow
outcomes are kept
apart: repeated launch failures block the schedule; a launched run that fails or waits
becomes an inbox item.

cairnd is one process (``Accept=no``) serving each connection in a thread, so the locks
are in-process locks; an occurrence found ``preparing`` while its schedule lock is held
was left by a cairnd that died mid-launch and is repaired before any new decision.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading

from cairn.daemon import launch
from cairn.daemon.schedules.store import (
    COUNTED_STATES,
    OccurrenceState,
    ScheduleRow,
    Store,
    Trigger,
    schedule_lock,
)
from cairn.daemon.schedules.views import occurrence_view
from cairn.errors import CairnError, NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import LaunchRequest, ScheduleAdmission
from cairn.protocol.jsonvalue import JSONObject, json_str
from cairn.protocol.replies import OccurrenceDecision
from cairn.schedules import (
    ACTIVE_RUN_STATES,
    AdmissionFacts,
    ScheduleSpec,
    decide,
    format_instant,
    host_config,
    latest_elapse,
    project_identity,
)
from cairn.workflow.review import Review, review_source

log = logging.getLogger(__name__)

_machine_lock = threading.Lock()


def _active(state: str | None) -> bool:
    return state is None or state in ACTIVE_RUN_STATES


# --- outcomes and repair ----------------------------------------------------------------


def sync_outcomes(store: Store, journal: Journal) -> None:
    """Follow every launched, unfinished occurrence's run in the journal. A run that
    failed, was cancelled or waits for a person becomes an inbox item (once)."""
    rows = store.db.execute(
        "SELECT o.schedule_id, o.key, o.run_id, o.run_state FROM occurrences o"
        " WHERE o.state='launched' AND (o.run_state IS NULL OR o.run_state IN (?,?,?,?))",
        ACTIVE_RUN_STATES,
    ).fetchall()
    for r in rows:
        try:
            run = journal.get_run(r["run_id"])
        except NotFound:
            continue
        if run.state == r["run_state"]:
            continue
        with store.transaction() as db:
            db.execute(
                "UPDATE occurrences SET run_state=?, updated_at=? WHERE schedule_id=? AND key=?",
                (run.state, store.clock(), r["schedule_id"], r["key"]),
            )
            owner = ScheduleRow.model_validate(
                dict(
                    db.execute(
                        "SELECT * FROM schedules WHERE schedule_id=?", (r["schedule_id"],)
                    ).fetchone()
                )
            )
            if run.state in ("failed", "cancelled"):
                store.add_inbox(
                    db,
                    owner,
                    run.run_id,
                    "run-failed",
                    f"run {run.run_id} {run.state}: {run.error or 'no error recorded'}",
                )
            elif run.state == "waiting":
                store.add_inbox(
                    db, owner, run.run_id, "run-waiting", f"run {run.run_id} waits for you"
                )


def record_launch_failure(
    store: Store, row: ScheduleRow, spec: ScheduleSpec, key: str, ref: str, message: str
) -> None:
    with store.transaction() as db:
        db.execute(
            "UPDATE occurrences SET state='launch-failed', reason=?, updated_at=?"
            " WHERE schedule_id=? AND key=?",
            (message, store.clock(), row.schedule_id, key),
        )
        failures = row.launch_failures + 1
        store.add_inbox(db, row, ref, "launch-failed", f"launch failed: {message}")
        if failures >= spec.max_launch_failures and row.status == "enabled":
            reason = f"{failures} consecutive launch failures, last: {message}"
            db.execute(
                "UPDATE schedules SET launch_failures=?, status='blocked', blocked_reason=?,"
                " updated_at=? WHERE schedule_id=?",
                (failures, reason, store.clock(), row.schedule_id),
            )
            store.add_inbox(db, row, f"blocked-{failures}-{key}", "blocked", reason)
            log.warning("schedule %s blocked: %s", row.schedule_id, reason)
        else:
            db.execute(
                "UPDATE schedules SET launch_failures=?, updated_at=? WHERE schedule_id=?",
                (failures, store.clock(), row.schedule_id),
            )


def block(store: Store, db: sqlite3.Connection, row: ScheduleRow, key: str, reason: str) -> None:
    """Block an enabled schedule with ``reason`` (and say so in its owner's inbox): nothing
    launches until a person renews or resumes it."""
    if row.status != "enabled":
        return
    db.execute(
        "UPDATE schedules SET status='blocked', blocked_reason=?, updated_at=?"
        " WHERE schedule_id=?",
        (reason, store.clock(), row.schedule_id),
    )
    store.add_inbox(db, row, f"blocked-{key}", "blocked", reason)
    log.warning("schedule %s blocked: %s", row.schedule_id, reason)


def record_launched(store: Store, schedule_id: str, key: str) -> None:
    with store.transaction() as db:
        db.execute(
            "UPDATE occurrences SET state='launched', reason='launched', updated_at=?"
            " WHERE schedule_id=? AND key=?",
            (store.clock(), schedule_id, key),
        )
        db.execute(
            "UPDATE schedules SET launch_failures=0, updated_at=? WHERE schedule_id=?",
            (store.clock(), schedule_id),
        )


def repair_half_prepared(store: Store, journal: Journal, row: ScheduleRow) -> int:
    """Settle occurrences a dead cairnd left ``preparing``: launched if their run exists,
    otherwise a launch failure. Call only with the schedule's lock held."""
    repaired = 0
    for occ in store.occurrences(row.schedule_id, states=("preparing",)):
        assert occ.run_id is not None
        try:
            journal.get_run(occ.run_id)
        except NotFound:
            spec = store.spec(row.schedule_id, occ.revision)
            record_launch_failure(
                store, row, spec, occ.key, occ.run_id, "interrupted before its run was created"
            )
            row = store.owned(row.schedule_id, row.owner_uid)
        else:
            record_launched(store, row.schedule_id, occ.key)
        repaired += 1
        log.info("schedule %s: repaired half-prepared occurrence %s", row.schedule_id, occ.key)
    return repaired


# --- admission ----------------------------------------------------------------------------


def scheduled_review(definition: str, source: str | None, confirm: str | None) -> Review:
    """The review of the definition a schedule is created for: a builtin as cairnd reads
    it; a ``user:`` or ``project:`` one as its owner's CLI sent it, refused unless the sent
    source has the review hash that CLI confirmed (as installed or trusted)."""
    if not launch.sends_source(definition):
        source, filename = launch.resolve_definition(definition)
        return review_source(source, filename=filename)
    if source is None:
        raise UsageError(
            f"{definition}: its source was not sent",
            hint="create the schedule with 'cairn schedule create', which reads it as "
            "installed or trusted",
        )
    filename = launch.source_filename(definition)
    review = review_source(source, filename=filename)
    if confirm != review.review_hash:
        raise launch.unconfirmed(definition, filename, review.review_hash)
    return review


def current_review_hash(
    spec: ScheduleSpec, source: str | None = None, source_error: str | None = None
) -> tuple[str | None, str | None]:
    """(review hash the definition has now or None, why it is not the pinned one or None).
    A builtin is read by cairnd; a ``user:`` or ``project:`` definition is the ``source``
    its owner's CLI sent (or ``source_error``, why it could not read one)."""
    definition = spec.definition
    try:
        if launch.sends_source(definition):
            if source is None:
                why = source_error or "its owner's CLI sent no source"
                return None, f"definition {definition} cannot be read: {why}"
            filename = launch.source_filename(definition)
            now = review_source(source, filename=filename).review_hash
        else:
            builtin, filename = launch.resolve_definition(definition)
            now = review_source(builtin, filename=filename).review_hash
    except CairnError as exc:
        return None, f"definition {definition} no longer passes review: {exc.message}"
    if now != spec.review_hash:
        return now, (
            f"definition {definition} changed since the schedule was reviewed "
            f"(review hash now {now}, the schedule pins {spec.review_hash})"
        )
    return now, None


def _facts(
    store: Store,
    row: ScheduleRow,
    now: float,
    key: str,
    promote: bool,
    review_hash: tuple[str | None, str | None],
    project_matches: bool,
) -> AdmissionFacts:
    sid = row.schedule_id
    own = store.occurrences(sid, states=COUNTED_STATES)
    others = [o for o in own if not (promote and o.key == key)]
    machine_active = int(
        store.db.execute(
            "SELECT count(*) FROM occurrences WHERE state='preparing' OR (state='launched'"
            " AND (run_state IS NULL OR run_state IN (?,?,?,?)))",
            ACTIVE_RUN_STATES,
        ).fetchone()[0]
    )
    launched = [o.launched_at for o in others if o.launched_at is not None]
    return AdmissionFacts(
        now=now,
        status=row.status,
        blocked_reason=row.blocked_reason,
        confirmed=row.confirmed_revision == row.revision,
        definition_review_hash=review_hash[0],
        definition_problem=review_hash[1],
        project_matches=project_matches,
        duplicate=not promote and store.occurrence(sid, key) is not None,
        used_in_revision=sum(1 for o in others if o.revision == row.confirmed_revision),
        own_active_runs=[
            o.run_id or o.key
            for o in others
            if o.state == "preparing" or (o.state == "launched" and _active(o.run_state))
        ],
        own_queued=sum(1 for o in others if o.state == "queued"),
        last_launch_at=max(launched) if launched else None,
        machine_active=machine_active,
        machine_limit=host_config().max_active_scheduled_runs,
    )


def admit(
    store: Store,
    journal: Journal,
    request: ScheduleAdmission,
    uid: int,
    fd: int | None,
    trigger: Trigger,
) -> JSONObject:
    """Decide one occurrence and, if admitted, launch it as an ordinary run: its
    :class:`OccurrenceDecision` as cairnd sends it.

    A timer trigger stands for the latest calendar elapse not yet decided (its nominal
    fire time); ``run-now`` is its own occurrence. ``request.occurrence`` retries a queued
    occurrence instead.
    """
    decided = OccurrenceDecision.model_validate(
        _admit(store, journal, request, uid, fd, trigger)
    )
    return decided.model_dump(mode="json", exclude_unset=True)


def _admit(
    store: Store,
    journal: Journal,
    request: ScheduleAdmission,
    uid: int,
    fd: int | None,
    trigger: Trigger,
) -> JSONObject:
    lock = schedule_lock(request.schedule_id or "")
    with lock:
        row = store.owned(request.schedule_id, uid)
        repair_half_prepared(store, journal, row)
        row = store.owned(row.schedule_id, uid)
        revision = row.confirmed_revision or row.revision
        spec = store.spec(row.schedule_id, revision)
        now = store.clock()
        promote = request.occurrence is not None
        result: JSONObject = {"schedule_id": row.schedule_id, "trigger": trigger}
        if promote:
            assert request.occurrence is not None
            key = request.occurrence
            queued = store.occurrence(row.schedule_id, key)
            if queued is None:
                raise NotFound(f"schedule {row.schedule_id} has no occurrence {key}")
            if queued.state != "queued":
                return {**result, **occurrence_view(queued), "outcome": queued.state}
            nominal = queued.nominal
        elif trigger == "timer":
            anchor = max(
                row.enabled_at or row.created_at,
                store.last_calendar_nominal(row.schedule_id) or 0.0,
            )
            elapse = latest_elapse(spec.calendar, anchor, now)
            if elapse is None:
                log.info("schedule %s: trigger with no new elapse, a no-op", row.schedule_id)
                return {
                    **result,
                    "outcome": "duplicate",
                    "reason": "no calendar elapse since the last decided occurrence",
                }
            nominal, key = elapse, f"calendar:{int(elapse)}"
        else:
            nominal, key = now, f"run-now:{now:.6f}"
        result.update({"key": key, "nominal": format_instant(nominal)})
        review_hash = current_review_hash(spec, request.source, request.source_error)
        project_matches = fd is not None and project_identity(fd) == (
            spec.project_dev,
            spec.project_ino,
        )
        run_id = "flow_" + secrets.token_hex(16)
        with _machine_lock:
            sync_outcomes(store, journal)
            with store.transaction() as db:
                facts = _facts(store, row, now, key, promote, review_hash, project_matches)
                decision = decide(spec, facts)
                if decision.blocks:
                    block(store, db, row, key, decision.reason)
                state: OccurrenceState | None = {
                    "admit": "preparing",
                    "queue": "queued",
                    "refuse": "refused",
                    "duplicate": None,
                }[decision.outcome]
                if state is not None and promote:
                    if state != "queued":
                        db.execute(
                            "UPDATE occurrences SET state=?, reason=?, run_id=?, launched_at=?,"
                            " updated_at=? WHERE schedule_id=? AND key=?",
                            (
                                state,
                                decision.reason,
                                run_id if state == "preparing" else None,
                                now if state == "preparing" else None,
                                now,
                                row.schedule_id,
                                key,
                            ),
                        )
                elif state is not None:
                    db.execute(
                        "INSERT INTO occurrences (schedule_id, key, trigger, nominal, revision,"
                        " state, reason, run_id, launched_at, created_at, updated_at)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            row.schedule_id,
                            key,
                            trigger,
                            nominal,
                            revision,
                            state,
                            decision.reason,
                            run_id if state == "preparing" else None,
                            now if state == "preparing" else None,
                            now,
                            now,
                        ),
                    )
        log.info(
            "schedule %s occurrence %s (%s): %s: %s",
            row.schedule_id,
            key,
            trigger,
            decision.outcome,
            decision.reason,
        )
        if decision.outcome != "admit":
            outcome = {"queue": "queued", "refuse": "refused"}.get(
                decision.outcome, decision.outcome
            )
            if decision.blocks:
                result["blocked"] = True
            return {**result, "outcome": outcome, "reason": decision.reason}
        sent = launch.sends_source(spec.definition)
        launch_request = LaunchRequest(
            definition=spec.definition,
            args=spec.args,
            project=spec.project,
            scripted=spec.profiles,
            source=request.source if sent else None,
            confirm=spec.review_hash if sent else None,
        )
        authority: JSONObject = {
            "id": row.schedule_id,
            "name": spec.name,
            "revision": revision,
            "occurrence": key,
            "trigger": trigger,
            "nominal": nominal,
        }
        launch_hash: str | None = None
        try:
            launch_hash = json_str(launch.launch(
                journal, launch_request, uid, fd, run_id=run_id, schedule=authority
            )["launch_hash"])
        except CairnError as exc:
            try:
                run_state: str | None = journal.get_run(run_id).state
            except NotFound:
                run_state = None
            if run_state in (None, "failed"):  # refused before its run existed, or failed at launch
                record_launch_failure(store, row, spec, key, run_id, exc.message)
                return {**result, "outcome": "launch-failed", "reason": exc.message}
            log.warning("schedule %s: run %s created, then: %s", row.schedule_id, run_id, exc)
        record_launched(store, row.schedule_id, key)
        return {
            **result,
            "outcome": "launched",
            "reason": "admitted",
            "run_id": run_id,
            "revision": revision,
            "launch_hash": launch_hash,
        }
