"""The SQLite journal: runs, operations, intents, events, leases.

One database in WAL mode with ``synchronous=FULL`` and foreign keys on. Every multi-row
change is one ``BEGIN IMMEDIATE`` transaction. Writes on behalf of a coordinator carry its
lease token (fencing): a coordinator whose token is no longer current cannot commit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from cairn.errors import Busy, JournalError, LeaseLost, NotFound
from cairn.models import CallRequest, Intent, LaunchDescription, canonical_json

SCHEMA_VERSION = 1

RunState = Literal["pending", "running", "waiting", "succeeded", "failed", "cancelled"]
OpState = Literal["requested", "started", "settled", "committed"]
TERMINAL_RUN_STATES = ("succeeded", "failed", "cancelled")

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE runs (
        run_id        TEXT PRIMARY KEY,
        owner_uid     INTEGER NOT NULL,
        definition    TEXT NOT NULL,
        review_hash   TEXT NOT NULL,
        project       TEXT NOT NULL,
        state         TEXT NOT NULL,
        launch        TEXT NOT NULL,
        output        TEXT,
        error         TEXT,
        settlement    TEXT,
        lease_holder  TEXT,
        lease_token   INTEGER NOT NULL DEFAULT 0,
        lease_expires REAL NOT NULL DEFAULT 0,
        created_at    REAL NOT NULL,
        updated_at    REAL NOT NULL
    );
    CREATE INDEX runs_owner ON runs(owner_uid, created_at);
    CREATE TABLE operations (
        run_id          TEXT NOT NULL REFERENCES runs(run_id),
        scope           TEXT NOT NULL,
        seq             INTEGER NOT NULL,
        op_id           TEXT NOT NULL,
        kind            TEXT NOT NULL,
        request         TEXT NOT NULL,
        request_hash    TEXT NOT NULL,
        source_location TEXT NOT NULL,
        predecessor     TEXT,
        attempt         INTEGER NOT NULL DEFAULT 1,
        state           TEXT NOT NULL,
        finish          TEXT,
        result          TEXT,
        error           TEXT,
        checkpoint      TEXT,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL,
        PRIMARY KEY (run_id, scope, seq),
        UNIQUE (run_id, op_id)
    );
    CREATE TABLE intents (
        run_id     TEXT NOT NULL REFERENCES runs(run_id),
        intent_id  TEXT NOT NULL,
        verb       TEXT NOT NULL,
        body       TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (run_id, intent_id)
    );
    CREATE INDEX intents_run ON intents(run_id, verb);
    CREATE TABLE receipts (
        run_id    TEXT NOT NULL,
        intent_id TEXT NOT NULL,
        body      TEXT NOT NULL,
        at        REAL NOT NULL,
        PRIMARY KEY (run_id, intent_id),
        FOREIGN KEY (run_id, intent_id) REFERENCES intents(run_id, intent_id)
    );
    CREATE TABLE events (
        cursor  INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id  TEXT NOT NULL,
        scope   TEXT,
        op_id   TEXT,
        event   TEXT NOT NULL,
        data    TEXT NOT NULL,
        at      REAL NOT NULL
    );
    CREATE INDEX events_run ON events(run_id, cursor);
    """,
}


class RunRow(BaseModel):
    run_id: str
    owner_uid: int
    definition: str
    review_hash: str
    project: str
    state: RunState
    output: dict[str, Any] | None
    error: str | None
    settlement: dict[str, Any] | None
    lease_holder: str | None
    lease_token: int
    lease_expires: float
    created_at: float
    updated_at: float


class OpRow(BaseModel):
    run_id: str
    scope: str
    seq: int
    op_id: str
    kind: str
    request: dict[str, Any]
    request_hash: str
    source_location: str
    predecessor: str | None
    attempt: int
    state: OpState
    finish: dict[str, Any] | None
    result: dict[str, Any] | None
    error: str | None
    checkpoint: dict[str, Any] | None
    created_at: float
    updated_at: float


class EventRow(BaseModel):
    cursor: int
    run_id: str
    scope: str | None
    op_id: str | None
    event: str
    data: dict[str, Any]
    at: float


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _dumps(value: Any) -> str | None:
    return None if value is None else canonical_json(value)


class Journal:
    """A connection to the journal. Not thread-safe: one per thread."""

    def __init__(self, path: Path, *, readonly: bool = False, create: bool = False) -> None:
        self.path = path
        if not create and not path.exists():
            raise JournalError(
                f"journal {path} does not exist",
                hint="is cairn installed and cairn.socket started?",
            )
        uri = f"file:{path}?mode={'ro' if readonly else 'rwc'}"
        try:
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from exc
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA busy_timeout=30000")
        if not readonly:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self._migrate()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self.transaction() as db:
            current = db.execute("PRAGMA user_version").fetchone()[0]
            if current > SCHEMA_VERSION:
                raise JournalError(
                    f"journal schema {current} is newer than this cairn ({SCHEMA_VERSION})",
                    hint="upgrade the cairn package",
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={version}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; commits on success, rolls back on error."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    def _fence(self, db: sqlite3.Connection, run_id: str, token: int, ttl: float) -> None:
        row = db.execute("SELECT lease_token FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"run {run_id} not found")
        if row["lease_token"] != token:
            raise LeaseLost(f"lease for {run_id} was taken over (token {token} is fenced)")
        db.execute("UPDATE runs SET lease_expires=? WHERE run_id=?", (time.time() + ttl, run_id))

    # --- runs -----------------------------------------------------------------------

    def create_run(self, desc: LaunchDescription, *, intents: list[Intent]) -> None:
        """Record a new run with its frozen launch description and first intents."""
        now = time.time()
        with self.transaction() as db:
            db.execute(
                "INSERT INTO runs (run_id, owner_uid, definition, review_hash, project, state,"
                " launch, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    desc.run_id,
                    desc.owner_uid,
                    desc.definition,
                    desc.review_hash,
                    desc.project.root,
                    "pending",
                    desc.model_dump_json(),
                    now,
                    now,
                ),
            )
            for intent in intents:
                self._insert_intent(db, intent)
            self._event(db, desc.run_id, "run-created", {"definition": desc.definition})

    def get_run(self, run_id: str) -> RunRow:
        row = self.db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}", hint="list runs with 'cairn ps'")
        return self._run_row(row)

    def list_runs(self, owner_uid: int | None = None, limit: int = 200) -> list[RunRow]:
        if owner_uid is None:
            rows = self.db.execute(
                "SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT * FROM runs WHERE owner_uid=? ORDER BY created_at DESC LIMIT ?",
                (owner_uid, limit),
            ).fetchall()
        return [self._run_row(r) for r in rows]

    def count_runs(self, owner_uid: int | None = None) -> int:
        if owner_uid is None:
            return int(self.db.execute("SELECT count(*) FROM runs").fetchone()[0])
        return int(
            self.db.execute("SELECT count(*) FROM runs WHERE owner_uid=?", (owner_uid,)).fetchone()[
                0
            ]
        )

    def launch_description(self, run_id: str) -> LaunchDescription:
        row = self.db.execute("SELECT launch FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}")
        return LaunchDescription.model_validate_json(row["launch"])

    @staticmethod
    def _run_row(row: sqlite3.Row) -> RunRow:
        data = dict(row)
        data.pop("launch", None)
        for key in ("output", "settlement"):
            data[key] = _loads(data[key])
        return RunRow.model_validate(data)

    def set_run_state(
        self,
        run_id: str,
        state: RunState,
        *,
        token: int,
        ttl: float = 60.0,
        output: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, ttl)
            db.execute(
                "UPDATE runs SET state=?, output=coalesce(?, output), error=?, updated_at=?"
                " WHERE run_id=?",
                (state, _dumps(output), error, time.time(), run_id),
            )
            self._event(db, run_id, f"run-{state}", {"error": error} if error else {})

    def set_settlement(self, run_id: str, settlement: dict[str, Any], *, token: int) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            db.execute(
                "UPDATE runs SET settlement=?, updated_at=? WHERE run_id=?",
                (_dumps(settlement), time.time(), run_id),
            )
            self._event(db, run_id, "settlement", {"status": settlement.get("status")})

    # --- lease ----------------------------------------------------------------------

    def acquire_lease(self, run_id: str, holder: str, *, ttl: float = 60.0) -> int:
        """Take the run lease, returning the new fencing token; ``Busy`` if it is held."""
        now = time.time()
        with self.transaction() as db:
            row = db.execute(
                "SELECT lease_holder, lease_token, lease_expires FROM runs WHERE run_id=?",
                (run_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id}")
            if row["lease_holder"] and row["lease_holder"] != holder and row["lease_expires"] > now:
                raise Busy(
                    f"run {run_id} is held by {row['lease_holder']}",
                    hint="another coordinator is running it",
                )
            token = int(row["lease_token"]) + 1
            db.execute(
                "UPDATE runs SET lease_holder=?, lease_token=?, lease_expires=? WHERE run_id=?",
                (holder, token, now + ttl, run_id),
            )
            self._event(db, run_id, "lease-acquired", {"holder": holder, "token": token})
            return token

    def renew_lease(self, run_id: str, token: int, *, ttl: float = 60.0) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, ttl)

    def release_lease(self, run_id: str, token: int) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, 0.0)
            db.execute(
                "UPDATE runs SET lease_holder=NULL, lease_expires=0 WHERE run_id=?", (run_id,)
            )

    # --- operations -----------------------------------------------------------------

    def get_op(self, run_id: str, scope: str, seq: int) -> OpRow | None:
        row = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? AND scope=? AND seq=?", (run_id, scope, seq)
        ).fetchone()
        return None if row is None else self._op_row(row)

    def get_op_by_id(self, run_id: str, op_id: str) -> OpRow:
        row = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
        ).fetchone()
        if row is None:
            raise NotFound(f"run {run_id} has no operation {op_id}")
        return self._op_row(row)

    def list_ops(self, run_id: str) -> list[OpRow]:
        rows = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? ORDER BY scope, seq", (run_id,)
        ).fetchall()
        return [self._op_row(r) for r in rows]

    @staticmethod
    def _op_row(row: sqlite3.Row) -> OpRow:
        data = dict(row)
        for key in ("request", "finish", "result", "checkpoint"):
            data[key] = _loads(data[key])
        return OpRow.model_validate(data)

    def record_requested(
        self, call: CallRequest, *, run_id: str, op_id: str, predecessor: str | None, token: int
    ) -> OpRow:
        now = time.time()
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            db.execute(
                "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
                " source_location, predecessor, state, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    call.scope,
                    call.seq,
                    op_id,
                    call.kind,
                    canonical_json(call.request),
                    call.request_hash(),
                    call.location,
                    predecessor,
                    "requested",
                    now,
                    now,
                ),
            )
            self._event(db, run_id, "op-requested", {"kind": call.kind}, call.scope, op_id)
        op = self.get_op(run_id, call.scope, call.seq)
        assert op is not None
        return op

    def update_op(
        self,
        run_id: str,
        op_id: str,
        *,
        token: int,
        state: OpState | None = None,
        finish: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
        checkpoint: dict[str, Any] | None = None,
        error: str | None = None,
        intents: Sequence[Intent] = (),
        event: str | None = None,
    ) -> None:
        """Move one operation forward (and queue intents) in a single fenced transaction."""
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            sets: list[str] = ["updated_at=?"]
            values: list[object] = [time.time()]
            for column, value in (
                ("state", state),
                ("finish", _dumps(finish)),
                ("result", _dumps(result)),
                ("checkpoint", _dumps(checkpoint)),
                ("error", error),
            ):
                if value is not None:
                    sets.append(f"{column}=?")
                    values.append(value)
            cur = db.execute(
                f"UPDATE operations SET {', '.join(sets)} WHERE run_id=? AND op_id=?",
                (*values, run_id, op_id),
            )
            if cur.rowcount != 1:
                raise NotFound(f"run {run_id} has no operation {op_id}")
            for intent in intents:
                self._insert_intent(db, intent)
            row = db.execute(
                "SELECT scope FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
            ).fetchone()
            self._event(db, run_id, event or f"op-{state}", {}, row["scope"], op_id)

    # --- intents and receipts -------------------------------------------------------

    def add_intents(self, run_id: str, intents: list[Intent], *, token: int | None) -> None:
        """Queue intents; a coordinator passes its token, the daemon (no lease yet) None."""
        with self.transaction() as db:
            if token is not None:
                self._fence(db, run_id, token, 60.0)
            for intent in intents:
                self._insert_intent(db, intent)

    @staticmethod
    def _insert_intent(db: sqlite3.Connection, intent: Intent) -> None:
        from cairn.models import VERB_OF_KIND

        db.execute(
            "INSERT OR IGNORE INTO intents (intent_id, run_id, verb, body, created_at)"
            " VALUES (?,?,?,?,?)",
            (
                intent.intent_id,
                intent.run_id,
                VERB_OF_KIND[intent.kind],
                intent.model_dump_json(),
                time.time(),
            ),
        )

    def intents(self, run_id: str, verb: str | None = None) -> list[Intent]:
        if verb is None:
            rows = self.db.execute(
                "SELECT body FROM intents WHERE run_id=? ORDER BY rowid", (run_id,)
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT body FROM intents WHERE run_id=? AND verb=? ORDER BY rowid",
                (run_id, verb),
            ).fetchall()
        return [Intent.model_validate_json(r["body"]) for r in rows]

    def record_receipts(self, run_id: str, receipts: list[dict[str, Any]]) -> None:
        """Keep the broker's receipts beside the intents (the broker's own DB stays the
        authority; this copy feeds views)."""
        with self.transaction() as db:
            for receipt in receipts:
                db.execute(
                    "INSERT OR IGNORE INTO receipts (intent_id, run_id, body, at) VALUES (?,?,?,?)",
                    (receipt["intent_id"], run_id, canonical_json(receipt), receipt["at"]),
                )

    def receipts(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT body FROM receipts WHERE run_id=? ORDER BY at", (run_id,)
        ).fetchall()
        return [json.loads(r["body"]) for r in rows]

    # --- events ---------------------------------------------------------------------

    def append_event(
        self,
        run_id: str,
        event: str,
        data: dict[str, Any] | None = None,
        scope: str | None = None,
        op_id: str | None = None,
    ) -> None:
        with self.transaction() as db:
            self._event(db, run_id, event, data or {}, scope, op_id)

    @staticmethod
    def _event(
        db: sqlite3.Connection,
        run_id: str,
        event: str,
        data: dict[str, Any],
        scope: str | None = None,
        op_id: str | None = None,
    ) -> None:
        db.execute(
            "INSERT INTO events (run_id, scope, op_id, event, data, at) VALUES (?,?,?,?,?,?)",
            (run_id, scope, op_id, event, canonical_json(data), time.time()),
        )

    def events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRow]:
        rows = self.db.execute(
            "SELECT * FROM events WHERE run_id=? AND cursor>? ORDER BY cursor LIMIT ?",
            (run_id, after, limit),
        ).fetchall()
        return [EventRow.model_validate({**dict(r), "data": json.loads(r["data"])}) for r in rows]
