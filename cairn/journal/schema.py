"""The journal's tables: the migrations that reach :data:`~cairn.journal.store.SCHEMA_VERSION`.

The version is SQLite's ``user_version``; :func:`cairn.journal.store.migrate` applies the
missing migrations in one transaction when the read-write journal opens.
"""

from __future__ import annotations

from cairn.journal.store import SCHEMA_VERSION

MIGRATIONS: dict[int, str] = {
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
    # model tokens as the relay spends them, per attempt, so a crashed or retried attempt
    # still counts against the run's budget after a restart
    3: """
    CREATE TABLE model_usage (
        run_id      TEXT NOT NULL REFERENCES runs(run_id),
        op_id       TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        tokens      INTEGER NOT NULL,
        calls       INTEGER NOT NULL,
        updated_at  REAL NOT NULL,
        PRIMARY KEY (run_id, op_id, attempt)
    );
    """,
    # every launch and the admission read runs by state (the slots each user holds, the
    # queue): without it each read scanned every run ever recorded, 20 ms at 10,000 runs
    4: """
    CREATE INDEX runs_state ON runs(state, owner_uid);
    """,
    # the caller's name for a run (cairn launch --run-key): one run per owner and key, so
    # a retried launch finds the run its first attempt recorded instead of starting another
    5: """
    ALTER TABLE runs ADD COLUMN run_key TEXT;
    CREATE UNIQUE INDEX runs_key ON runs(owner_uid, run_key) WHERE run_key IS NOT NULL;
    """,
    # what model calls cost (micro-units of the providers' prices' currency): per attempt,
    # for the run's money budget, and per owner per local day over all runs, for the
    # host's daily budget (one row to read before each call)
    6: """
    ALTER TABLE model_usage ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE model_cost_days (
        owner_uid   INTEGER NOT NULL,
        day         TEXT NOT NULL,
        cost_micros INTEGER NOT NULL,
        PRIMARY KEY (owner_uid, day)
    );
    """,
}

assert max(MIGRATIONS) == SCHEMA_VERSION
