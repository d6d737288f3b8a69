"""Schedules in cairnd: the store, review and confirmation, and admission.

The store is its own SQLite database, ``/var/lib/cairn/journal/schedules.db``, owned by
cairnd. A timer wakeup is only a reminder: admission runs here, under the schedule's lock
and (for the decision) the machine-wide lock, and an admitted occurrence becomes an
ordinary run through :func:`cairn.daemon.launch.launch`.

cairnd is one process (``Accept=no``) serving each connection in a thread, so the locks
are in-process locks; an occurrence found ``preparing`` while its schedule lock is held
was left by a cairnd that died mid-launch and is repaired before any new decision.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from cairn import paths
from cairn.daemon import launch
from cairn.errors import (
    CairnError,
    JournalError,
    NotFound,
    PermissionDenied,
    UsageError,
    ValidationFailed,
)
from cairn.journal import Journal
from cairn.models import DaemonRequest, Frozen
from cairn.schedules import (
    ACTIVE_RUN_STATES,
    CHALLENGE_RE,
    DEFAULT_MACHINE_LIMIT,
    SCHEDULE_ID_RE,
    Action,
    AdmissionFacts,
    ScheduleConfirm,
    ScheduleCreate,
    ScheduleSpec,
    Status,
    decide,
    elapses_after,
    format_instant,
    latest_elapse,
    normalize_calendar,
    parse_instant,
    parse_timespan,
    project_identity,
    render_timer,
    review_challenge,
    timer_name,
)
from cairn.workflow.review import review_source

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
OCCURRENCE_LIMIT = 50
Trigger = Literal["timer", "run-now"]
OccurrenceState = Literal["queued", "preparing", "launched", "refused", "launch-failed"]
COUNTED_STATES = ("queued", "preparing", "launched")

_SCHEMA = """
CREATE TABLE schedules (
    schedule_id        TEXT PRIMARY KEY,
    owner_uid          INTEGER NOT NULL,
    name               TEXT NOT NULL,
    status             TEXT NOT NULL,
    revision           INTEGER NOT NULL,
    confirmed_revision INTEGER,
    launch_failures    INTEGER NOT NULL DEFAULT 0,
    blocked_reason     TEXT,
    enabled_at         REAL,
    created_at         REAL NOT NULL,
    updated_at         REAL NOT NULL
);
CREATE UNIQUE INDEX schedules_name ON schedules(owner_uid, name) WHERE status != 'deleted';
CREATE TABLE revisions (
    schedule_id  TEXT NOT NULL REFERENCES schedules(schedule_id),
    revision     INTEGER NOT NULL,
    action       TEXT NOT NULL,
    spec         TEXT NOT NULL,
    challenge    TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    confirmed_at REAL,
    PRIMARY KEY (schedule_id, revision)
);
CREATE TABLE occurrences (
    schedule_id TEXT NOT NULL REFERENCES schedules(schedule_id),
    key         TEXT NOT NULL,
    trigger     TEXT NOT NULL,
    nominal     REAL NOT NULL,
    revision    INTEGER NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    run_id      TEXT,
    run_state   TEXT,
    launched_at REAL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (schedule_id, key)
);
CREATE INDEX occurrences_state ON occurrences(state, run_state);
CREATE TABLE inbox (
    item_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    schedule_id TEXT NOT NULL REFERENCES schedules(schedule_id),
    owner_uid   INTEGER NOT NULL,
    ref         TEXT NOT NULL,
    kind        TEXT NOT NULL,
    message     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    UNIQUE (schedule_id, ref, kind)
);
"""

_machine_lock = threading.Lock()
_locks_guard = threading.Lock()
_schedule_locks: dict[str, threading.Lock] = {}


def schedule_lock(schedule_id: str) -> threading.Lock:
    with _locks_guard:
        return _schedule_locks.setdefault(schedule_id, threading.Lock())


def store_path() -> Path:
    return paths.state_dir() / "journal" / "schedules.db"


class HostScheduleConfig(Frozen):
    """``/etc/cairn/schedules.toml``."""

    max_active_scheduled_runs: int = Field(default=DEFAULT_MACHINE_LIMIT, ge=0)


def host_config() -> HostScheduleConfig:
    file = paths.config_dir() / "schedules.toml"
    if not file.exists():
        return HostScheduleConfig()
    try:
        with open(file, "rb") as fh:
            return HostScheduleConfig.model_validate(tomllib.load(fh))
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ValidationFailed(
            f"{file} is invalid: {exc}", hint="fix it or remove it to use the defaults"
        ) from exc


class ScheduleRow(BaseModel):
    schedule_id: str
    owner_uid: int
    name: str
    status: Status
    revision: int
    confirmed_revision: int | None
    launch_failures: int
    blocked_reason: str | None
    enabled_at: float | None
    created_at: float
    updated_at: float


class OccurrenceRow(BaseModel):
    schedule_id: str
    key: str
    trigger: Trigger
    nominal: float
    revision: int
    state: OccurrenceState
    reason: str
    run_id: str | None
    run_state: str | None
    launched_at: float | None
    created_at: float
    updated_at: float


class Store:
    """One connection to the schedule database. Not thread-safe: one per request."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"{path} has schema {version}, newer than this cairn ({SCHEMA_VERSION})",
                hint="upgrade cairn",
            )
        if version < SCHEMA_VERSION:
            with self.transaction() as db:
                # Another connection may have migrated while this one waited for the lock.
                if int(db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
                    return
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- reads ------------------------------------------------------------------------

    def owned(self, schedule_id: str | None, uid: int) -> ScheduleRow:
        """The caller's schedule; another user's schedule is reported as missing."""
        if not schedule_id or not SCHEDULE_ID_RE.match(schedule_id):
            raise UsageError(
                f"invalid schedule ID {schedule_id!r}", hint="see 'cairn schedule list'"
            )
        row = self.db.execute(
            "SELECT * FROM schedules WHERE schedule_id=?", (schedule_id,)
        ).fetchone()
        if row is None or row["owner_uid"] != uid:
            raise NotFound(f"no schedule {schedule_id}", hint="see 'cairn schedule list'")
        return ScheduleRow.model_validate(dict(row))

    def by_name(self, uid: int, name: str) -> ScheduleRow | None:
        row = self.db.execute(
            "SELECT * FROM schedules WHERE owner_uid=? AND name=? AND status!='deleted'",
            (uid, name),
        ).fetchone()
        return None if row is None else ScheduleRow.model_validate(dict(row))

    def owned_by(self, uid: int) -> list[ScheduleRow]:
        rows = self.db.execute(
            "SELECT * FROM schedules WHERE owner_uid=? AND status!='deleted' ORDER BY name",
            (uid,),
        ).fetchall()
        return [ScheduleRow.model_validate(dict(r)) for r in rows]

    def spec(self, schedule_id: str, revision: int) -> ScheduleSpec:
        row = self.db.execute(
            "SELECT spec FROM revisions WHERE schedule_id=? AND revision=?",
            (schedule_id, revision),
        ).fetchone()
        if row is None:
            raise JournalError(f"schedule {schedule_id} has no revision {revision}")
        return ScheduleSpec.model_validate_json(row["spec"])

    def challenge(self, schedule_id: str, revision: int) -> str:
        row = self.db.execute(
            "SELECT challenge, action FROM revisions WHERE schedule_id=? AND revision=?",
            (schedule_id, revision),
        ).fetchone()
        return f"{row['action']} {row['challenge']}"

    def occurrences(
        self, schedule_id: str, *, states: tuple[str, ...] | None = None, limit: int = 1000
    ) -> list[OccurrenceRow]:
        query = "SELECT * FROM occurrences WHERE schedule_id=?"
        params: list[Any] = [schedule_id]
        if states is not None:
            query += f" AND state IN ({','.join('?' * len(states))})"
            params.extend(states)
        query += " ORDER BY created_at DESC LIMIT ?"
        params.append(limit)
        rows = self.db.execute(query, params).fetchall()
        return [OccurrenceRow.model_validate(dict(r)) for r in rows]

    def occurrence(self, schedule_id: str, key: str) -> OccurrenceRow | None:
        row = self.db.execute(
            "SELECT * FROM occurrences WHERE schedule_id=? AND key=?", (schedule_id, key)
        ).fetchone()
        return None if row is None else OccurrenceRow.model_validate(dict(row))

    def last_calendar_nominal(self, schedule_id: str) -> float | None:
        row = self.db.execute(
            "SELECT max(nominal) FROM occurrences WHERE schedule_id=? AND trigger='timer'",
            (schedule_id,),
        ).fetchone()
        return None if row[0] is None else float(row[0])

    # --- writes -----------------------------------------------------------------------

    def add_inbox(
        self, db: sqlite3.Connection, row: ScheduleRow, ref: str, kind: str, message: str
    ) -> None:
        db.execute(
            "INSERT OR IGNORE INTO inbox (schedule_id, owner_uid, ref, kind, message, created_at)"
            " VALUES (?,?,?,?,?,?)",
            (row.schedule_id, row.owner_uid, ref, kind, message, time.time()),
        )


def _active(state: str | None) -> bool:
    return state is None or state in ACTIVE_RUN_STATES


# --- outcomes and repair ----------------------------------------------------------------


def sync_outcomes(store: Store, journal: Journal) -> None:
    """Follow every launched, unfinished occurrence's run in the journal. A run that
    failed, was cancelled or waits for a person becomes an inbox item (once)."""
    rows = store.db.execute(
        "SELECT o.schedule_id, o.key, o.run_id, o.run_state FROM occurrences o"
        " WHERE o.state='launched' AND (o.run_state IS NULL OR o.run_state IN (?,?,?))",
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
                (run.state, time.time(), r["schedule_id"], r["key"]),
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


def _record_launch_failure(
    store: Store, row: ScheduleRow, spec: ScheduleSpec, key: str, ref: str, message: str
) -> None:
    with store.transaction() as db:
        db.execute(
            "UPDATE occurrences SET state='launch-failed', reason=?, updated_at=?"
            " WHERE schedule_id=? AND key=?",
            (message, time.time(), row.schedule_id, key),
        )
        failures = row.launch_failures + 1
        store.add_inbox(db, row, ref, "launch-failed", f"launch failed: {message}")
        if failures >= spec.max_launch_failures and row.status == "enabled":
            reason = f"{failures} consecutive launch failures, last: {message}"
            db.execute(
                "UPDATE schedules SET launch_failures=?, status='blocked', blocked_reason=?,"
                " updated_at=? WHERE schedule_id=?",
                (failures, reason, time.time(), row.schedule_id),
            )
            store.add_inbox(db, row, f"blocked-{failures}-{key}", "blocked", reason)
            log.warning("schedule %s blocked: %s", row.schedule_id, reason)
        else:
            db.execute(
                "UPDATE schedules SET launch_failures=?, updated_at=? WHERE schedule_id=?",
                (failures, time.time(), row.schedule_id),
            )


def _record_launched(store: Store, schedule_id: str, key: str) -> None:
    with store.transaction() as db:
        db.execute(
            "UPDATE occurrences SET state='launched', reason='launched', updated_at=?"
            " WHERE schedule_id=? AND key=?",
            (time.time(), schedule_id, key),
        )
        db.execute(
            "UPDATE schedules SET launch_failures=0, updated_at=? WHERE schedule_id=?",
            (time.time(), schedule_id),
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
            _record_launch_failure(
                store, row, spec, occ.key, occ.run_id, "interrupted before its run was created"
            )
            row = store.owned(row.schedule_id, row.owner_uid)
        else:
            _record_launched(store, row.schedule_id, occ.key)
        repaired += 1
        log.info("schedule %s: repaired half-prepared occurrence %s", row.schedule_id, occ.key)
    return repaired


# --- views --------------------------------------------------------------------------------


def _used(store: Store, schedule_id: str, revision: int | None) -> int:
    if revision is None:
        return 0
    return int(
        store.db.execute(
            "SELECT count(*) FROM occurrences WHERE schedule_id=? AND revision=?"
            " AND state IN ('queued','preparing','launched')",
            (schedule_id, revision),
        ).fetchone()[0]
    )


def _occurrence_view(occ: OccurrenceRow) -> dict[str, Any]:
    return {
        "key": occ.key,
        "trigger": occ.trigger,
        "nominal": format_instant(occ.nominal),
        "revision": occ.revision,
        "state": occ.state,
        "reason": occ.reason,
        "run_id": occ.run_id,
        "run_state": occ.run_state,
        "at": format_instant(occ.created_at),
    }


def view(store: Store, row: ScheduleRow) -> dict[str, Any]:
    """What a person sees of one schedule; ``timer`` is the exact unit file the caller's
    user manager must hold (None when no timer should exist)."""
    revision = row.confirmed_revision if row.status == "enabled" else row.revision
    spec = store.spec(row.schedule_id, revision or row.revision)
    last = store.occurrences(row.schedule_id, limit=1)
    return {
        "schedule_id": row.schedule_id,
        "name": row.name,
        "status": row.status,
        "revision": row.revision,
        "confirmed_revision": row.confirmed_revision,
        "awaiting_confirmation": row.confirmed_revision != row.revision,
        "definition": spec.definition,
        "project": spec.project,
        "calendar": spec.calendar,
        "timezone": spec.timezone,
        "catch_up": spec.catch_up,
        "overlap": spec.overlap,
        "min_spacing_sec": spec.min_spacing_sec,
        "max_runs": spec.max_runs,
        "runs_used": _used(store, row.schedule_id, row.confirmed_revision),
        "valid_until": format_instant(spec.valid_until),
        "launch_failures": row.launch_failures,
        "blocked_reason": row.blocked_reason,
        "timer_unit": timer_name(row.schedule_id),
        "timer": (
            render_timer(row.schedule_id, revision, spec)
            if row.status == "enabled" and revision is not None
            else None
        ),
        "last_occurrence": _occurrence_view(last[0]) if last else None,
    }


def _next_elapses(spec: ScheduleSpec, count: int = 3) -> list[str]:
    return [format_instant(t) for t in elapses_after(spec.calendar, time.time(), count)]


# --- verbs --------------------------------------------------------------------------------


def _current_review_hash(definition: str) -> str | None:
    """The review hash the definition has now, or None if it no longer resolves."""
    try:
        source, filename = launch.resolve_definition(definition)
        return review_source(source, filename=filename).review_hash
    except CairnError:
        return None


def create(store: Store, request: DaemonRequest, uid: int, fd: int | None) -> dict[str, Any]:
    """Store a new schedule (or a new revision of one) paused, with its review challenge."""
    try:
        body = ScheduleCreate.model_validate(request.schedule)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValidationFailed(f"schedule: {where}: {first['msg']}") from exc
    if uid == 0:
        raise PermissionDenied("schedules do not run as root", hint="create it as a normal user")
    source, filename = launch.resolve_definition(body.definition)
    review = review_source(source, filename=filename)
    args = launch.validate_args(review, body.args)
    project = launch.check_project(request.project, fd, uid)
    assert fd is not None
    dev, ino = project_identity(fd)
    resolved = launch.resolve_profiles(review, body.scripted)
    now = time.time()
    valid_until = parse_instant(body.valid_until)
    if valid_until <= now:
        raise UsageError(
            f"valid-until {format_instant(valid_until)} is in the past",
            hint="give a future instant, e.g. --valid-until 2030-01-01T00:00:00Z",
        )
    spec = ScheduleSpec(
        name=body.name,
        owner_uid=uid,
        definition=body.definition,
        review_hash=review.review_hash,
        args=args,
        project=project.root,
        project_dev=dev,
        project_ino=ino,
        calendar=normalize_calendar(body.calendar, body.timezone),
        timezone=body.timezone,
        catch_up=body.catch_up,
        max_runs=body.max_runs,
        valid_until=valid_until,
        min_spacing_sec=parse_timespan(body.min_spacing),
        overlap=body.overlap,
        profiles={name: resolved[name] for name in sorted(body.scripted)},
    )
    if not elapses_after(spec.calendar, now, 1):
        raise UsageError(
            f"calendar {spec.calendar!r} never elapses again",
            hint="give a calendar with a future elapse",
        )
    existing = store.by_name(uid, body.name)
    action: Action
    with store.transaction() as db:
        if existing is None:
            if body.replace:
                raise NotFound(f"no schedule named {body.name} to replace")
            schedule_id, revision, action = secrets.token_hex(6), 1, "create"
            db.execute(
                "INSERT INTO schedules (schedule_id, owner_uid, name, status, revision,"
                " created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                (schedule_id, uid, body.name, "paused", revision, now, now),
            )
        else:
            if not body.replace:
                raise UsageError(
                    f"a schedule named {body.name} exists ({existing.schedule_id})",
                    hint="pass --replace to review a new revision of it",
                )
            schedule_id, revision, action = existing.schedule_id, existing.revision + 1, "replace"
            db.execute(
                "UPDATE schedules SET status='paused', revision=?, updated_at=?"
                " WHERE schedule_id=?",
                (revision, now, schedule_id),
            )
        challenge = review_challenge(schedule_id, revision, action, spec)
        db.execute(
            "INSERT INTO revisions (schedule_id, revision, action, spec, challenge, created_at)"
            " VALUES (?,?,?,?,?,?)",
            (schedule_id, revision, action, spec.model_dump_json(), challenge, now),
        )
    log.info("schedule %s revision %d created by uid %d, paused", schedule_id, revision, uid)
    return {
        **view(store, store.owned(schedule_id, uid)),
        "action": action,
        "challenge": challenge,
        "review_hash": spec.review_hash,
        "args": spec.args,
        "profiles": {name: p.model_dump(mode="json") for name, p in spec.profiles.items()},
        "next_elapses": _next_elapses(spec),
    }


def confirm(store: Store, request: DaemonRequest, uid: int) -> dict[str, Any]:
    """Accept the revision whose challenge the person typed; it stays paused."""
    action = ScheduleConfirm.model_validate(request.schedule).action
    challenge = request.challenge or ""
    if not CHALLENGE_RE.match(challenge):
        raise UsageError(f"invalid challenge {challenge!r}", hint="copy it from 'schedule create'")
    found = store.db.execute(
        "SELECT r.schedule_id, r.revision, r.action FROM revisions r"
        " JOIN schedules s USING (schedule_id) WHERE r.challenge=? AND s.owner_uid=?",
        (challenge, uid),
    ).fetchone()
    if found is None:
        raise NotFound("no schedule revision has this challenge", hint="see 'cairn schedule list'")
    if found["action"] != action:
        raise UsageError(
            f"this challenge confirms a {found['action']}, not a {action}",
            hint=f"cairn schedule confirm {found['action']} {challenge}",
        )
    with schedule_lock(found["schedule_id"]):
        row = store.owned(found["schedule_id"], uid)
        if row.status == "deleted":
            raise NotFound(f"schedule {row.schedule_id} was deleted")
        if found["revision"] != row.revision:
            raise UsageError(
                f"stale challenge: schedule {row.schedule_id} is at revision {row.revision}",
                hint="confirm the challenge of the latest revision",
            )
        now = time.time()
        with store.transaction() as db:
            db.execute(
                "UPDATE revisions SET confirmed_at=? WHERE schedule_id=? AND revision=?",
                (now, row.schedule_id, row.revision),
            )
            db.execute(
                "UPDATE schedules SET confirmed_revision=?, updated_at=? WHERE schedule_id=?",
                (row.revision, now, row.schedule_id),
            )
        log.info("schedule %s revision %d confirmed", row.schedule_id, row.revision)
        return view(store, store.owned(row.schedule_id, uid))


def resume(
    store: Store, journal: Journal, request: DaemonRequest, uid: int, fd: int | None
) -> dict[str, Any]:
    """Check the confirmed revision once more and enable future occurrences."""
    with schedule_lock(request.schedule_id or ""):
        row = store.owned(request.schedule_id, uid)
        if row.status == "deleted":
            raise NotFound(f"schedule {row.schedule_id} was deleted")
        if row.confirmed_revision != row.revision:
            raise UsageError(
                f"revision {row.revision} of schedule {row.schedule_id} is not confirmed",
                hint=f"cairn schedule confirm {store.challenge(row.schedule_id, row.revision)}",
            )
        spec = store.spec(row.schedule_id, row.revision)
        now = time.time()
        problems = []
        if now >= spec.valid_until:
            problems.append(f"valid-until {format_instant(spec.valid_until)} has passed")
        if _used(store, row.schedule_id, row.revision) >= spec.max_runs:
            problems.append(f"max-runs {spec.max_runs} reached")
        if _current_review_hash(spec.definition) != spec.review_hash:
            problems.append(f"definition {spec.definition} changed since review")
        if fd is None or project_identity(fd) != (spec.project_dev, spec.project_ino):
            problems.append(f"project {spec.project} is not the reviewed directory")
        if problems:
            raise UsageError(
                f"schedule {row.schedule_id} cannot resume: {'; '.join(problems)}",
                hint="renew it: cairn schedule create NAME … --replace, then confirm",
            )
        with store.transaction() as db:
            db.execute(
                "UPDATE schedules SET status='enabled', enabled_at=coalesce(?, enabled_at),"
                " launch_failures=0, blocked_reason=NULL, updated_at=? WHERE schedule_id=?",
                (None if row.status == "enabled" else now, now, row.schedule_id),
            )
        log.info("schedule %s revision %d enabled", row.schedule_id, row.revision)
        result = view(store, store.owned(row.schedule_id, uid))
        result["next_elapses"] = _next_elapses(spec)
        return result


def set_status(
    store: Store, request: DaemonRequest, uid: int, status: Literal["paused", "deleted"]
) -> dict[str, Any]:
    """Pause or delete: future occurrences are refused; runs already created continue."""
    with schedule_lock(request.schedule_id or ""):
        row = store.owned(request.schedule_id, uid)
        if row.status == "deleted":
            raise NotFound(f"schedule {row.schedule_id} was deleted")
        with store.transaction() as db:
            db.execute(
                "UPDATE schedules SET status=?, updated_at=? WHERE schedule_id=?",
                (status, time.time(), row.schedule_id),
            )
        log.info("schedule %s %s", row.schedule_id, status)
        return view(store, store.owned(row.schedule_id, uid))


def list_schedules(store: Store, journal: Journal, uid: int) -> list[dict[str, Any]]:
    sync_outcomes(store, journal)
    return [view(store, row) for row in store.owned_by(uid)]


def inspect(store: Store, journal: Journal, request: DaemonRequest, uid: int) -> dict[str, Any]:
    sync_outcomes(store, journal)
    row = store.owned(request.schedule_id, uid)
    spec = store.spec(row.schedule_id, row.revision)
    occurrences = store.occurrences(row.schedule_id, limit=OCCURRENCE_LIMIT + 1)
    result = view(store, row)
    result.update(
        {
            "review_hash": spec.review_hash,
            "args": spec.args,
            "profiles": sorted(spec.profiles),
            "challenge": (
                store.challenge(row.schedule_id, row.revision)
                if row.confirmed_revision != row.revision
                else None
            ),
            "next_elapses": _next_elapses(spec) if row.status == "enabled" else [],
            "occurrences": [_occurrence_view(o) for o in occurrences[:OCCURRENCE_LIMIT]],
            "occurrences_omitted": len(occurrences) > OCCURRENCE_LIMIT,
        }
    )
    return result


def inbox(store: Store, journal: Journal, uid: int) -> list[dict[str, Any]]:
    sync_outcomes(store, journal)
    rows = store.db.execute(
        "SELECT i.*, s.name FROM inbox i JOIN schedules s USING (schedule_id)"
        " WHERE i.owner_uid=? ORDER BY i.item_id DESC LIMIT 200",
        (uid,),
    ).fetchall()
    return [
        {
            "item_id": r["item_id"],
            "schedule_id": r["schedule_id"],
            "name": r["name"],
            "kind": r["kind"],
            "ref": r["ref"],
            "message": r["message"],
            "at": format_instant(r["created_at"]),
        }
        for r in rows
    ]


def reconcile(store: Store, journal: Journal, uid: int) -> dict[str, Any]:
    """Repair the caller's half-prepared occurrences; return what their user manager
    must hold (timers) and the queued occurrences to try again."""
    repaired = 0
    queued: list[dict[str, str]] = []
    for row in store.owned_by(uid):
        with schedule_lock(row.schedule_id):
            repaired += repair_half_prepared(store, journal, row)
        queued += [
            {"schedule_id": row.schedule_id, "key": o.key}
            for o in store.occurrences(row.schedule_id, states=("queued",))
        ]
    return {
        "schedules": list_schedules(store, journal, uid),
        "repaired": repaired,
        "queued": queued,
    }


# --- admission ----------------------------------------------------------------------------


def _facts(
    store: Store,
    row: ScheduleRow,
    now: float,
    key: str,
    promote: bool,
    review_hash: str | None,
    project_matches: bool,
) -> AdmissionFacts:
    sid = row.schedule_id
    own = store.occurrences(sid, states=COUNTED_STATES)
    others = [o for o in own if not (promote and o.key == key)]
    machine_active = int(
        store.db.execute(
            "SELECT count(*) FROM occurrences WHERE state='preparing' OR (state='launched'"
            " AND (run_state IS NULL OR run_state IN (?,?,?)))",
            ACTIVE_RUN_STATES,
        ).fetchone()[0]
    )
    launched = [o.launched_at for o in others if o.launched_at is not None]
    return AdmissionFacts(
        now=now,
        status=row.status,
        blocked_reason=row.blocked_reason,
        confirmed=row.confirmed_revision == row.revision,
        definition_review_hash=review_hash,
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
    request: DaemonRequest,
    uid: int,
    fd: int | None,
    trigger: Trigger,
) -> dict[str, Any]:
    """Decide one occurrence and, if admitted, launch it as an ordinary run.

    A timer trigger stands for the latest calendar elapse not yet decided (its nominal
    fire time); ``run-now`` is its own occurrence. ``request.occurrence`` retries a queued
    occurrence instead.
    """
    lock = schedule_lock(request.schedule_id or "")
    with lock:
        row = store.owned(request.schedule_id, uid)
        repair_half_prepared(store, journal, row)
        row = store.owned(row.schedule_id, uid)
        revision = row.confirmed_revision or row.revision
        spec = store.spec(row.schedule_id, revision)
        now = time.time()
        promote = request.occurrence is not None
        result: dict[str, Any] = {"schedule_id": row.schedule_id, "trigger": trigger}
        if promote:
            assert request.occurrence is not None
            key = request.occurrence
            queued = store.occurrence(row.schedule_id, key)
            if queued is None:
                raise NotFound(f"schedule {row.schedule_id} has no occurrence {key}")
            if queued.state != "queued":
                return {**result, **_occurrence_view(queued), "outcome": queued.state}
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
        review_hash = _current_review_hash(spec.definition)
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
            return {**result, "outcome": outcome, "reason": decision.reason}
        launch_request = DaemonRequest(
            op="launch",
            definition=spec.definition,
            args=spec.args,
            project=spec.project,
            scripted=spec.profiles,
        )
        authority = {
            "id": row.schedule_id,
            "name": spec.name,
            "revision": revision,
            "occurrence": key,
            "trigger": trigger,
            "nominal": nominal,
        }
        launch_hash: str | None = None
        try:
            launch_hash = launch.launch(
                journal, launch_request, uid, fd, run_id=run_id, schedule=authority
            )["launch_hash"]
        except CairnError as exc:
            try:
                journal.get_run(run_id)
            except NotFound:
                _record_launch_failure(store, row, spec, key, run_id, exc.message)
                return {**result, "outcome": "launch-failed", "reason": exc.message}
            log.warning("schedule %s: run %s created, then: %s", row.schedule_id, run_id, exc)
        _record_launched(store, row.schedule_id, key)
        return {
            **result,
            "outcome": "launched",
            "reason": "admitted",
            "run_id": run_id,
            "revision": revision,
            "launch_hash": launch_hash,
        }


# --- dispatch -----------------------------------------------------------------------------


def dispatch(journal: Journal, request: DaemonRequest, uid: int, fd: int | None) -> Any:
    """Handle one ``schedule-*`` request for the caller ``uid``."""
    store = Store(store_path())
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
