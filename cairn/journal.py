"""The SQLite journal: runs, operations, intents, events, leases.

One database in WAL mode with ``synchronous=FULL`` and foreign keys on. Every multi-row
change is one ``BEGIN IMMEDIATE`` transaction. Writes on behalf of a coordinator carry its
lease token (fencing): a coordinator whose token is no longer current cannot commit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from cairn.errors import Busy, JournalError, LeaseLost, NotFound, UsageError
from cairn.models import CallRequest, Intent, LaunchDescription, canonical_json
from cairn.policy import AlreadyAnswered, RunEnded, StaleRequest

SCHEMA_VERSION = 2

RunState = Literal[
    "pending",
    "running",
    "waiting",
    "paused",
    "blocked",
    "succeeded",
    "failed",
    "stopped",
    "cancelled",
]
OpState = Literal[
    "requested",
    "started",
    "waiting",
    "uncertain",
    "retry",
    "failed",
    "settled",
    "committed",
    "not-started",
]
TERMINAL_RUN_STATES = ("succeeded", "failed", "stopped", "cancelled")

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
    # people in the loop: questions, approval requests, durable control requests
    2: """
    CREATE TABLE interactions (
        run_id      TEXT NOT NULL REFERENCES runs(run_id),
        op_id       TEXT NOT NULL,
        challenge   TEXT NOT NULL,
        question    TEXT NOT NULL,
        schema_name TEXT,
        schema      TEXT NOT NULL,
        state       TEXT NOT NULL,
        answer      TEXT,
        actor_uid   INTEGER,
        created_at  REAL NOT NULL,
        decided_at  REAL,
        PRIMARY KEY (run_id, op_id),
        UNIQUE (run_id, challenge)
    );
    CREATE TABLE approvals (
        run_id      TEXT NOT NULL REFERENCES runs(run_id),
        request_id  TEXT NOT NULL,
        op_id       TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        prepared    TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        evaluation  TEXT NOT NULL,
        deadline    REAL NOT NULL,
        state       TEXT NOT NULL,
        actor_uid   INTEGER,
        reason      TEXT,
        created_at  REAL NOT NULL,
        decided_at  REAL,
        PRIMARY KEY (run_id, request_id)
    );
    CREATE TABLE control_requests (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL REFERENCES runs(run_id),
        action      TEXT NOT NULL,
        state       TEXT NOT NULL,
        actor_uid   INTEGER NOT NULL,
        created_at  REAL NOT NULL,
        done_at     REAL
    );
    CREATE INDEX control_requests_run ON control_requests(run_id, state);
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

    def acquire_lease(
        self,
        run_id: str,
        holder: str,
        *,
        ttl: float = 60.0,
        holder_is_dead: Callable[[str], bool] = lambda _holder: False,
    ) -> int:
        """Take the run lease, returning the new fencing token; ``Busy`` if it is held.

        A lease whose holder ``holder_is_dead`` says is gone (a crashed coordinator on this
        host) is reclaimed at once instead of waiting for it to expire.
        """
        now = time.time()
        with self.transaction() as db:
            row = db.execute(
                "SELECT lease_holder, lease_token, lease_expires FROM runs WHERE run_id=?",
                (run_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id}")
            held = row["lease_holder"]
            if held and held != holder and row["lease_expires"] > now and not holder_is_dead(held):
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
        attempt: int | None = None,
        intents: Sequence[Intent] = (),
        event: str | None = None,
        event_data: dict[str, Any] | None = None,
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
                ("attempt", attempt),
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
            self._event(db, run_id, event or f"op-{state}", event_data or {}, row["scope"], op_id)

    def resolve_uncertain(
        self,
        run_id: str,
        op_id: str,
        *,
        decision: Literal["result", "retry"],
        actor_uid: int,
        finish: dict[str, Any] | None = None,
    ) -> None:
        """A person's decision on an uncertain operation of a blocked run: settle it from
        the given result, or retry it. The run becomes ``pending`` for its coordinator."""
        with self.transaction() as db:
            run = db.execute("SELECT state FROM runs WHERE run_id=?", (run_id,)).fetchone()
            op = db.execute(
                "SELECT state FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
            ).fetchone()
            if run is None or op is None:
                raise NotFound(f"run {run_id} has no operation {op_id}")
            if run["state"] != "blocked" or op["state"] != "uncertain":
                raise UsageError(
                    f"{op_id} of {run_id} is {op['state']} (run {run['state']}); only an "
                    "uncertain operation of a blocked run takes a decision"
                )
            state = "started" if decision == "result" else "retry"
            db.execute(
                "UPDATE operations SET state=?, finish=?, updated_at=? WHERE run_id=? AND op_id=?",
                (state, _dumps(finish), time.time(), run_id, op_id),
            )
            db.execute(
                "UPDATE runs SET state='pending', error=NULL, updated_at=? WHERE run_id=?",
                (time.time(), run_id),
            )
            self._event(db, run_id, f"op-{decision}-decided", {"actor_uid": actor_uid}, None, op_id)

    def upgrade_source(
        self,
        run_id: str,
        desc: LaunchDescription,
        *,
        locations: dict[str, str],
        actor_uid: int,
        old_hash: str,
    ) -> None:
        """Move a run that is not active to new reviewed source: the new launch description
        and the committed operations' new source locations, in one transaction."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT state, review_hash, lease_holder, lease_expires FROM runs WHERE run_id=?",
                (run_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id}")
            if row["state"] not in ("waiting", "blocked", "pending") or (
                row["lease_holder"] and row["lease_expires"] > time.time()
            ):
                raise UsageError(
                    f"run {run_id} is {row['state']}; only a waiting or blocked run moves to "
                    "new source"
                )
            if row["review_hash"] != old_hash:
                raise UsageError(f"run {run_id} changed while the dry run was checked; repeat it")
            db.execute(
                "UPDATE runs SET launch=?, review_hash=?, updated_at=? WHERE run_id=?",
                (desc.model_dump_json(), desc.review_hash, time.time(), run_id),
            )
            for op_id, location in locations.items():
                db.execute(
                    "UPDATE operations SET source_location=? WHERE run_id=? AND op_id=?",
                    (location, run_id, op_id),
                )
            self._event(
                db,
                run_id,
                "source-upgraded",
                {"from": old_hash, "to": desc.review_hash, "actor_uid": actor_uid},
            )

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

    # --- people in the loop: questions, approvals, control requests --------------------
    #
    # A coordinator writes with its lease token; cairnd's decisions are plain transactions
    # whose conditional updates make exactly one of concurrent deciders win. "wake" in a
    # result means the run went from waiting to pending and needs its coordinator started.

    def open_question(
        self,
        run_id: str,
        op_id: str,
        *,
        token: int,
        challenge: str,
        question: str,
        schema_name: str | None,
        schema: dict[str, Any],
    ) -> QuestionRow:
        """Record the question an ``ask`` operation waits on (once) and mark it waiting."""
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            cur = db.execute(
                "INSERT OR IGNORE INTO interactions (run_id, op_id, challenge, question,"
                " schema_name, schema, state, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    op_id,
                    challenge,
                    question,
                    schema_name,
                    canonical_json(schema),
                    "waiting",
                    time.time(),
                ),
            )
            if cur.rowcount:
                db.execute(
                    "UPDATE operations SET state='waiting', updated_at=? WHERE run_id=? AND op_id=?"
                    " AND state='requested'",
                    (time.time(), run_id, op_id),
                )
                self._event(db, run_id, "question-asked", {"challenge": challenge}, None, op_id)
        found = self.question(run_id, op_id)
        assert found is not None
        return found

    def question(self, run_id: str, op_id: str) -> QuestionRow | None:
        row = self.db.execute(
            "SELECT * FROM interactions WHERE run_id=? AND op_id=?", (run_id, op_id)
        ).fetchone()
        return None if row is None else QuestionRow.from_row(row)

    def questions(self, run_id: str) -> list[QuestionRow]:
        rows = self.db.execute(
            "SELECT * FROM interactions WHERE run_id=? ORDER BY created_at", (run_id,)
        ).fetchall()
        return [QuestionRow.from_row(r) for r in rows]

    def answer_question(
        self, run_id: str, *, challenge: str, answer: Any, actor_uid: int
    ) -> tuple[Literal["answered", "duplicate"], bool]:
        """Bind a validated answer to the waiting question named by ``challenge``.

        The same answer again is a harmless duplicate; another answer to an answered
        question is :class:`AlreadyAnswered`; a challenge that names no waiting question
        of the run is :class:`StaleRequest`."""
        with self.transaction() as db:
            run = self._people_run(db, run_id)
            row = db.execute(
                "SELECT * FROM interactions WHERE run_id=? AND challenge=?", (run_id, challenge)
            ).fetchone()
            current = db.execute(
                "SELECT challenge FROM interactions WHERE run_id=? AND state='waiting'",
                (run_id,),
            ).fetchone()
            if row is None:
                now = f"; the current one is {current['challenge']}" if current else ""
                raise StaleRequest(
                    f"challenge {challenge} names no question of {run_id}{now}",
                    hint=f"see 'cairn inbox' or 'cairn show {run_id}'",
                )
            if row["state"] == "answered":
                if canonical_json(answer) == row["answer"]:
                    return "duplicate", False
                raise AlreadyAnswered(
                    f"{row['op_id']} of {run_id} is already answered",
                    hint=f"see the answer in 'cairn show {run_id}'",
                )
            if row["state"] != "waiting" or run["state"] in TERMINAL_RUN_STATES:
                raise RunEnded(f"{run_id} is {run['state']}; the question is {row['state']}")
            db.execute(
                "UPDATE interactions SET state='answered', answer=?, actor_uid=?, decided_at=?"
                " WHERE run_id=? AND op_id=? AND state='waiting'",
                (canonical_json(answer), actor_uid, time.time(), run_id, row["op_id"]),
            )
            self._event(
                db, run_id, "question-answered", {"actor_uid": actor_uid}, None, row["op_id"]
            )
            return "answered", self._wake(db, run_id, run["state"])

    def open_approval(
        self,
        run_id: str,
        *,
        token: int,
        request_id: str,
        op_id: str,
        attempt: int,
        prepared: dict[str, Any],
        fingerprint: str,
        evaluation: dict[str, Any],
        deadline: float,
    ) -> ApprovalRow:
        """Record an approval request for one prepared operation (once)."""
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            cur = db.execute(
                "INSERT OR IGNORE INTO approvals (run_id, request_id, op_id, attempt, prepared,"
                " fingerprint, evaluation, deadline, state, created_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    request_id,
                    op_id,
                    attempt,
                    canonical_json(prepared),
                    fingerprint,
                    canonical_json(evaluation),
                    deadline,
                    "waiting",
                    time.time(),
                ),
            )
            if cur.rowcount:
                self._event(
                    db,
                    run_id,
                    "approval-requested",
                    {"request_id": request_id, "fingerprint": fingerprint},
                    None,
                    op_id,
                )
        found = self.approval(run_id, request_id)
        assert found is not None
        return found

    def approval(self, run_id: str, request_id: str) -> ApprovalRow | None:
        row = self.db.execute(
            "SELECT * FROM approvals WHERE run_id=? AND request_id=?", (run_id, request_id)
        ).fetchone()
        return None if row is None else ApprovalRow.from_row(row)

    def approvals(self, run_id: str) -> list[ApprovalRow]:
        rows = self.db.execute(
            "SELECT * FROM approvals WHERE run_id=? ORDER BY created_at", (run_id,)
        ).fetchall()
        return [ApprovalRow.from_row(r) for r in rows]

    def decide_approval(
        self,
        run_id: str,
        request_id: str,
        *,
        decision: Literal["approved", "rejected"],
        actor_uid: int,
        fingerprint: str | None,
        reason: str = "",
        now: float | None = None,
    ) -> tuple[Literal["approved", "rejected", "expired"], bool]:
        """Decide a waiting approval request; exactly one concurrent decider wins, the
        others get :class:`AlreadyAnswered`. A decision after the deadline expires the
        request instead (committed) and returns ``expired``."""
        now = time.time() if now is None else now
        with self.transaction() as db:
            run = self._people_run(db, run_id)
            row = db.execute(
                "SELECT * FROM approvals WHERE run_id=? AND request_id=?", (run_id, request_id)
            ).fetchone()
            if row is None:
                raise NotFound(
                    f"{run_id} has no approval request {request_id}", hint="see 'cairn inbox'"
                )
            if row["state"] != "waiting":
                raise AlreadyAnswered(
                    f"approval request {request_id} of {run_id} is already answered "
                    f"({row['state']})"
                )
            if fingerprint is not None and fingerprint != row["fingerprint"]:
                raise StaleRequest(
                    f"fingerprint {fingerprint} is not the one of request {request_id} "
                    f"({row['fingerprint']})",
                    hint="look at the request again with 'cairn inbox' before deciding",
                )
            if run["state"] in TERMINAL_RUN_STATES:
                raise RunEnded(f"{run_id} is {run['state']}; nothing waits for a decision")
            state: Literal["approved", "rejected", "expired"] = decision
            if now > row["deadline"]:
                state = "expired"
            db.execute(
                "UPDATE approvals SET state=?, actor_uid=?, reason=?, decided_at=?"
                " WHERE run_id=? AND request_id=? AND state='waiting'",
                (state, actor_uid, reason or None, now, run_id, request_id),
            )
            self._event(
                db,
                run_id,
                f"approval-{state}",
                {"request_id": request_id, "actor_uid": actor_uid, "reason": reason},
                None,
                row["op_id"],
            )
            return state, self._wake(db, run_id, run["state"])

    def request_control(
        self, run_id: str, action: ControlAction, *, actor_uid: int
    ) -> tuple[str, bool]:
        """Record pause/resume/stop/cancel. An active run gets a durable row its
        coordinator honours at its next safe point; a run no process holds (waiting,
        paused, blocked) changes at once. Returns (what happened, wake)."""
        with self.transaction() as db:
            run = self._people_run(db, run_id)
            state = run["state"]
            if state in TERMINAL_RUN_STATES:
                raise RunEnded(
                    f"{run_id} already {state}" + (f": {run['error']}" if run["error"] else ""),
                    hint=f"see 'cairn show {run_id}'",
                )
            active = state in ("pending", "running")
            pending = {
                r["action"]
                for r in db.execute(
                    "SELECT action FROM control_requests WHERE run_id=? AND state='pending'",
                    (run_id,),
                )
            }
            now = time.time()
            if action == "resume":
                if state == "paused":
                    self._insert_control(db, run_id, action, actor_uid, "done")
                    return "resumed", self._wake(db, run_id, state, also=("paused",))
                if active and "pause" in pending:
                    db.execute(
                        "UPDATE control_requests SET state='withdrawn', done_at=? WHERE"
                        " run_id=? AND action='pause' AND state='pending'",
                        (now, run_id),
                    )
                    self._insert_control(db, run_id, action, actor_uid, "done")
                    return "pause withdrawn", False
                raise UsageError(f"{run_id} is {state}, not paused")
            if action == "pause" and state == "paused":
                return "already paused", False
            if active:
                if action in pending:
                    return f"{action} already requested", False
                self._insert_control(db, run_id, action, actor_uid, "pending")
                return f"{action} requested", False
            self._insert_control(db, run_id, action, actor_uid, "done")
            self._apply_control(db, run_id, action)
            return {"pause": "paused", "stop": "stopped", "cancel": "cancelled"}[action], False

    def pending_controls(self, run_id: str) -> list[str]:
        """Actions requested of an active run and not yet honoured, oldest first."""
        rows = self.db.execute(
            "SELECT action FROM control_requests WHERE run_id=? AND state='pending' ORDER BY id",
            (run_id,),
        ).fetchall()
        return [r["action"] for r in rows]

    def honour_control(self, run_id: str, action: ControlAction, *, token: int) -> None:
        """The coordinator acts on a pending control request at a safe point."""
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            self._apply_control(db, run_id, action)

    def suspend_run(self, run_id: str, *, token: int) -> RunState | None:
        """The coordinator is about to exit because the run waits for a person. The run
        becomes ``waiting`` — unless a pending control request applies instead, or what it
        waits for was decided meanwhile (None: go on at once)."""
        with self.transaction() as db:
            self._fence(db, run_id, token, 60.0)
            for action in self.pending_controls(run_id):
                if action in ("pause", "stop", "cancel"):
                    self._apply_control(db, run_id, action)
                    return {"pause": "paused", "stop": "stopped", "cancel": "cancelled"}[action]  # type: ignore[return-value]
            waiting = db.execute(
                "SELECT (SELECT count(*) FROM interactions WHERE run_id=? AND state='waiting')"
                " + (SELECT count(*) FROM approvals WHERE run_id=? AND state='waiting')",
                (run_id, run_id),
            ).fetchone()[0]
            if not waiting:
                return None
            db.execute(
                "UPDATE runs SET state='waiting', updated_at=? WHERE run_id=?",
                (time.time(), run_id),
            )
            self._event(db, run_id, "run-waiting", {})
            return "waiting"

    def waiting_for_people(self, owner_uid: int | None) -> list[dict[str, Any]]:
        """Open questions and approval requests of the owner's runs (all when None)."""
        owner = "" if owner_uid is None else " AND r.owner_uid=?"
        args: tuple[int, ...] = () if owner_uid is None else (owner_uid,)
        items: list[dict[str, Any]] = []
        for row in self.db.execute(
            "SELECT i.*, r.state AS run_state, r.definition FROM interactions i JOIN runs r"
            f" USING (run_id) WHERE i.state='waiting'{owner} ORDER BY i.created_at",
            args,
        ):
            items.append(
                {
                    "kind": "question",
                    "run_state": row["run_state"],
                    "definition": row["definition"],
                    **QuestionRow.from_row(row).model_dump(),
                }
            )
        for row in self.db.execute(
            "SELECT a.*, r.state AS run_state, r.definition FROM approvals a JOIN runs r"
            f" USING (run_id) WHERE a.state='waiting'{owner} ORDER BY a.created_at",
            args,
        ):
            items.append(
                {
                    "kind": "approval",
                    "run_state": row["run_state"],
                    "definition": row["definition"],
                    **ApprovalRow.from_row(row).model_dump(),
                }
            )
        return items

    @staticmethod
    def _people_run(db: sqlite3.Connection, run_id: str) -> sqlite3.Row:
        run = db.execute("SELECT state, error FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if run is None:
            raise NotFound(f"no run {run_id}")
        return run  # type: ignore[no-any-return]

    def _wake(
        self, db: sqlite3.Connection, run_id: str, state: str, also: tuple[str, ...] = ()
    ) -> bool:
        if state not in ("waiting", *also):
            return False
        db.execute(
            "UPDATE runs SET state='pending', error=NULL, updated_at=? WHERE run_id=?",
            (time.time(), run_id),
        )
        self._event(db, run_id, "run-woken", {"from": state})
        return True

    def _insert_control(
        self, db: sqlite3.Connection, run_id: str, action: str, actor_uid: int, state: str
    ) -> None:
        now = time.time()
        db.execute(
            "INSERT INTO control_requests (run_id, action, state, actor_uid, created_at,"
            " done_at) VALUES (?,?,?,?,?,?)",
            (run_id, action, state, actor_uid, now, now if state == "done" else None),
        )
        self._event(db, run_id, f"{action}-requested", {"actor_uid": actor_uid})

    def _apply_control(self, db: sqlite3.Connection, run_id: str, action: str) -> None:
        """Pause, stop or cancel a run that nothing is running for (a safe point)."""
        now = time.time()
        db.execute(
            "UPDATE control_requests SET state='done', done_at=? WHERE run_id=? AND"
            " state='pending' AND (action=? OR ?<>'pause')",
            (now, run_id, action, action),
        )
        target = {"pause": "paused", "stop": "stopped", "cancel": "cancelled"}[action]
        if action != "pause":
            for table in ("interactions", "approvals"):
                db.execute(
                    f"UPDATE {table} SET state='cancelled', decided_at=? WHERE run_id=? AND"
                    " state='waiting'",
                    (now, run_id),
                )
            db.execute(
                "UPDATE operations SET state='not-started', updated_at=? WHERE run_id=? AND"
                " state IN ('requested', 'waiting', 'retry')",
                (now, run_id),
            )
        db.execute("UPDATE runs SET state=?, updated_at=? WHERE run_id=?", (target, now, run_id))
        self._event(db, run_id, f"run-{target}", {"by": action})


# --- rows of the people-in-the-loop tables ---------------------------------------------

ControlAction = Literal["pause", "resume", "stop", "cancel"]


class QuestionRow(BaseModel):
    run_id: str
    op_id: str
    challenge: str
    question: str
    schema_name: str | None
    json_schema: dict[str, Any]
    state: Literal["waiting", "answered", "cancelled"]
    answer: Any
    actor_uid: int | None
    created_at: float
    decided_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> QuestionRow:
        data = {k: row[k] for k in row.keys() if k in cls.model_fields or k == "schema"}
        data["json_schema"] = json.loads(data.pop("schema"))
        data["answer"] = _loads(data["answer"])
        return cls.model_validate(data)


class ApprovalRow(BaseModel):
    run_id: str
    request_id: str
    op_id: str
    attempt: int
    prepared: dict[str, Any]
    fingerprint: str
    evaluation: dict[str, Any]
    deadline: float
    state: Literal["waiting", "approved", "rejected", "expired", "cancelled"]
    actor_uid: int | None
    reason: str | None
    created_at: float
    decided_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> ApprovalRow:
        data = {k: row[k] for k in row.keys() if k in cls.model_fields}
        data["prepared"] = json.loads(data["prepared"])
        data["evaluation"] = json.loads(data["evaluation"])
        return cls.model_validate(data)
