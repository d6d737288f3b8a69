"""cairnd's schedule store: its own SQLite database, ``/var/lib/cairn/journal/schedules.db``,
owned by cairnd; the rows it holds and the per-schedule locks.

The connection is configured like the journal's (WAL, ``synchronous=FULL``, foreign keys
on) and uses the journal's transaction and migration helpers
(:func:`cairn.journal.store.transaction`, :func:`cairn.journal.store.migrate`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cairn import paths
from cairn.errors import JournalError, NotFound, UsageError
from cairn.journal.store import Clock
from cairn.journal.transactions import migrate, transaction
from cairn.schedules import SCHEDULE_ID_RE, ScheduleSpec, Status

Trigger = Literal["timer", "run-now"]
OccurrenceState = Literal["queued", "preparing", "launched", "refused", "launch-failed"]
COUNTED_STATES = ("queued", "preparing", "launched")

MIGRATIONS = {
    1: """
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
""",
}
SCHEMA_VERSION = max(MIGRATIONS)

_locks_guard = threading.Lock()
_schedule_locks: dict[str, threading.Lock] = {}


def schedule_lock(schedule_id: str) -> threading.Lock:
    with _locks_guard:
        return _schedule_locks.setdefault(schedule_id, threading.Lock())


def store_path() -> Path:
    return paths.state_dir() / "journal" / "schedules.db"


class ScheduleRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

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
    model_config = ConfigDict(defer_build=True)

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
    """One connection to the schedule database. Not thread-safe: one per request.

    ``clock`` gives the time every row is stamped with and admission decides at (seconds
    since the epoch); tests pass their own to move time instead of sleeping.
    """

    def __init__(self, path: Path, *, clock: Clock = time.time) -> None:
        self.clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        # Only a database that is not at this schema takes the write lock to migrate (or to
        # be refused as newer); an up-to-date one is opened without it.
        if int(self.db.execute("PRAGMA user_version").fetchone()[0]) != SCHEMA_VERSION:
            migrate(self.db, MIGRATIONS, label=f"schedule store {path}")

    def close(self) -> None:
        self.db.close()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; commits on success, rolls back on error."""
        return transaction(self.db)

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
        params: list[str | int] = [schedule_id]
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
            (row.schedule_id, row.owner_uid, ref, kind, message, self.clock()),
        )
