"""The journal package's parts: the operation state machine, the injected clock, the one
lease TTL, and the read-only reader the broker opens."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, get_args

import pytest

from cairn.errors import JournalError
from cairn.journal import transactions
from cairn.journal.operations import OP_TRANSITIONS, IllegalTransition, check_op_transition
from cairn.journal.reader import JournalReader
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpState
from cairn.journal.runs import Busy
from cairn.journal.schema import MIGRATIONS
from cairn.journal.store import LEASE_TTL, SCHEMA_VERSION
from cairn.journal.transactions import migrate, transaction
from cairn.protocol.broker import Intent
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProjectSpec

RUN = "flow_" + "0" * 31 + "7"
STATES: tuple[str, ...] = get_args(OpState)
LEGAL = [(a, b) for a in STATES for b in sorted(OP_TRANSITIONS[a])]
ILLEGAL = [(a, b) for a in STATES for b in STATES if b not in OP_TRANSITIONS[a]]


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def description() -> LaunchDescription:
    return LaunchDescription(
        run_id=RUN, owner_uid=1001, owner_gid=1001, owner_name="alice",
        definition="builtin:implement", source="x = 1\n", source_filename="implement.py",
        review_hash="sha256:" + "a" * 64, review={}, args={},
        project=ProjectSpec(root="/home/alice/demo", owner_uid=1001, on_pool_fs=False),
        profiles={}, cairn_version="0", created_at=time.time(),
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal(tmp_path: Path, clock: Clock) -> Journal:
    j = Journal(tmp_path / "journal.db", create=True, clock=clock)
    j.create_run(description(), intents=[])
    return j


def op_in(journal: Journal, state: str) -> int:
    """root-1 of the run, put in ``state`` directly (setup only); returns a lease token."""
    token = journal.acquire_lease(RUN, "test")
    call = CallRequest(scope="root", seq=1, kind="agent", request={}, location="f.py:1:1")
    journal.record_requested(call, run_id=RUN, op_id="root-1", predecessor=None, token=token)
    journal.db.execute("UPDATE operations SET state=? WHERE op_id='root-1'", (state,))
    return token


# --- the state machine ---------------------------------------------------------------


def test_the_table_names_every_state_and_only_states() -> None:
    assert set(OP_TRANSITIONS) == set(STATES)
    for targets in OP_TRANSITIONS.values():
        assert targets <= set(STATES)
    for final in ("committed", "failed", "not-started"):
        assert OP_TRANSITIONS[final] == frozenset()


def test_the_documented_path_and_recovery_moves_are_legal() -> None:
    for a, b in [
        ("requested", "started"), ("started", "settled"), ("settled", "committed"),
        ("requested", "waiting"), ("waiting", "settled"),  # ask
        ("requested", "committed"),  # markers
        ("started", "uncertain"), ("uncertain", "started"), ("uncertain", "retry"),
        ("retry", "requested"), ("started", "requested"),  # clean retry
        ("started", "failed"), ("requested", "not-started"),
        # what Journal._apply_control moves to not-started on stop/cancel
        ("waiting", "not-started"), ("retry", "not-started"),
    ]:
        check_op_transition("root-1", a, b)


@pytest.mark.parametrize(("current", "new"), LEGAL)
def test_every_legal_transition_is_allowed(journal: Journal, current: str, new: str) -> None:
    token = op_in(journal, current)
    start = Intent(intent_id="start-agent.root-1.1", run_id=RUN, kind="start-agent",
                   op_id="root-1")
    journal.update_op(RUN, "root-1", token=token, state=new, intents=[start])  # type: ignore[arg-type]
    assert journal.get_op_by_id(RUN, "root-1").state == new
    assert journal.events(RUN)[-1].event == f"op-{new}"


@pytest.mark.parametrize(("current", "new"), ILLEGAL)
def test_every_other_transition_is_refused_and_leaves_no_trace(
    journal: Journal, clock: Clock, current: str, new: str
) -> None:
    token = op_in(journal, current)
    before = journal.get_op_by_id(RUN, "root-1")
    events = len(journal.events(RUN))
    clock.now += 5
    start = Intent(intent_id="start-agent.root-1.1", run_id=RUN, kind="start-agent",
                   op_id="root-1")
    with pytest.raises(IllegalTransition, match=f"cannot move from {current} to {new}"):
        journal.update_op(RUN, "root-1", token=token, state=new, result={"x": 1},  # type: ignore[arg-type]
                          intents=[start])
    assert journal.get_op_by_id(RUN, "root-1") == before
    assert len(journal.events(RUN)) == events
    assert journal.intents(RUN) == []


@pytest.mark.parametrize(("current", "new"), [
    ("committed", "started"), ("committed", "uncertain"), ("failed", "requested"),
    ("not-started", "started"), ("requested", "settled"), ("requested", "uncertain"),
    ("uncertain", "committed"), ("settled", "started"), ("waiting", "started"),
])
def test_representative_illegal_moves(current: str, new: str) -> None:
    with pytest.raises(IllegalTransition) as caught:
        check_op_transition("root-1", current, new)
    assert caught.value.code == "illegal-transition" and caught.value.hint


def test_an_update_without_a_state_is_not_a_transition(journal: Journal) -> None:
    token = op_in(journal, "committed")
    journal.update_op(RUN, "root-1", token=token, finish={"output": {}}, event="op-finished")
    assert journal.get_op_by_id(RUN, "root-1").state == "committed"


def test_a_person_decides_only_along_the_table(journal: Journal) -> None:
    token = op_in(journal, "uncertain")
    journal.release_lease(RUN, token)
    journal.db.execute("UPDATE runs SET state='blocked' WHERE run_id=?", (RUN,))
    journal.resolve_uncertain(RUN, "root-1", decision="retry", actor_uid=1001)
    assert journal.get_op_by_id(RUN, "root-1").state == "retry"


# --- the clock and the lease TTL -----------------------------------------------------


def test_rows_and_leases_use_the_injected_clock(journal: Journal, clock: Clock) -> None:
    assert journal.get_run(RUN).created_at == clock.now
    journal.acquire_lease(RUN, "a")
    assert journal.get_run(RUN).lease_expires == clock.now + LEASE_TTL
    with pytest.raises(Busy):
        journal.acquire_lease(RUN, "b")
    clock.now += LEASE_TTL + 1  # the lease runs out, no real time passes
    assert journal.acquire_lease(RUN, "b") == 2
    assert journal.events(RUN)[-1].at == clock.now


def test_a_writer_stuck_in_its_transaction_is_a_journal_error_not_a_traceback(
    journal: Journal,
) -> None:
    stuck = sqlite3.connect(journal.path, isolation_level=None)
    stuck.execute("BEGIN IMMEDIATE")  # a coordinator stopped inside its transaction
    try:
        journal.db.execute("PRAGMA busy_timeout=50")
        started = time.monotonic()
        with pytest.raises(JournalError) as caught:
            journal.acquire_lease(RUN, "second")
        assert time.monotonic() - started >= 0.05
        assert caught.value.code == "journal"
        assert f"{journal.path} stayed locked by another writer for 0.05 s" in str(caught.value)
        assert "ps -o pid,stat,unit,args -u cairn" in (caught.value.hint or "")
    finally:
        stuck.execute("ROLLBACK")
        stuck.close()
    assert journal.acquire_lease(RUN, "second") == 1  # nothing was lost meanwhile


def test_the_threads_of_one_process_take_turns_without_sqlites_busy_handler(
    journal: Journal,
) -> None:
    """cairnd serves each request on a thread with its own connection: their writes queue
    on the process's own lock, so none meets another at SQLite's (here, with no busy
    timeout at all, that would be a "stayed locked" error at once)."""
    with journal.transaction() as db:
        db.execute("CREATE TABLE burst (n INTEGER)")
    failed: list[BaseException] = []
    together = threading.Barrier(8, timeout=30)

    def writer() -> None:
        db = sqlite3.connect(journal.path, isolation_level=None, timeout=0)
        try:
            for _ in range(20):
                together.wait()  # all eight ask for the lock at once, every round
                with transaction(db):
                    db.executemany("INSERT INTO burst VALUES (?)", ((n,) for n in range(200)))
        except BaseException as exc:
            failed.append(exc)
            together.abort()
        finally:
            db.close()

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []
    assert journal.db.execute("SELECT count(*) FROM burst").fetchone()[0] == 8 * 20 * 200


def test_the_coordinator_uses_the_journal_lease_ttl() -> None:
    from cairn.coordinator import core

    assert core.LEASE_TTL is LEASE_TTL


# --- the reader ----------------------------------------------------------------------


def test_reader_reads_and_cannot_write(journal: Journal) -> None:
    reader = JournalReader(journal.path)
    assert reader.get_run(RUN).run_id == RUN
    assert reader.launch_description(RUN).run_id == RUN
    assert reader.list_ops(RUN) == [] and reader.intents(RUN) == []
    assert not hasattr(reader, "update_op") and not hasattr(reader, "create_run")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.db.execute("DELETE FROM runs")
    reader.close()


def test_a_thread_stuck_in_its_transaction_is_a_journal_error_for_the_others(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's own turn is bounded like SQLite's lock: a thread that never leaves
    its transaction makes the others fail with the "stayed locked" error, not hang."""
    monkeypatch.setattr(transactions, "TURN_TIMEOUT_SEC", 0.05)
    inside, release = threading.Event(), threading.Event()

    def stuck() -> None:
        db = sqlite3.connect(journal.path, isolation_level=None)
        with transaction(db):
            inside.set()
            release.wait(10)
        db.close()

    holder = threading.Thread(target=stuck)
    holder.start()
    try:
        assert inside.wait(10)
        with pytest.raises(JournalError, match="stayed locked by another writer for 0.05 s"):
            journal.acquire_lease(RUN, "second")
    finally:
        release.set()
        holder.join()
    assert journal.acquire_lease(RUN, "second") == 1


def test_a_writer_waiting_for_another_connection_tries_again_every_few_ms(
    journal: Journal,
) -> None:
    """SQLite's own busy handler waits ever longer between tries (100 ms after a quarter
    second); the journal's writers try again every 4 ms at most, until the busy timeout."""
    holder = sqlite3.connect(journal.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a coordinator inside its transaction
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 40:  # the holder commits after 40 tries
            holder.execute("ROLLBACK")

    try:
        transactions._begin(journal.db, pause)
        journal.db.execute("ROLLBACK")
    finally:
        holder.close()
    assert len(pauses) == 40 and max(pauses) <= 0.004 and pauses[0] < 0.001
    assert journal.db.execute("PRAGMA busy_timeout").fetchone()[0] == 30000  # as it was


def test_a_current_journal_opens_without_taking_the_write_lock(journal: Journal) -> None:
    """cairnd opens the journal for every request: a schema that is current is only read,
    so an open never waits behind a writer (here one that holds its lock)."""
    stuck = sqlite3.connect(journal.path, isolation_level=None)
    stuck.execute("BEGIN IMMEDIATE")
    try:
        db = sqlite3.connect(journal.path, isolation_level=None, timeout=0)
        migrate(db, MIGRATIONS, label="journal")  # a write lock asked for would be refused
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        db.close()
    finally:
        stuck.execute("ROLLBACK")
        stuck.close()


def test_a_queued_launchs_empty_receipts_take_no_write_lock(journal: Journal) -> None:
    """The broker only pins a queued run and answers no receipt: recording none writes
    nothing, so 56 of a burst's 64 launches take the write lock once less."""
    admitted = description().model_copy(update={"run_id": "flow_" + "3" * 32})
    assert journal.launch_run(admitted, machine_limit=100, user_limit=100)
    queued = description().model_copy(update={"run_id": "flow_" + "2" * 32})
    assert not journal.launch_run(queued, machine_limit=0, user_limit=0)
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    journal.record_receipts(queued.run_id, [])
    journal.db.set_trace_callback(None)
    assert statements == []
    (start,) = journal.intents(admitted.run_id, "launch-v1")
    journal.record_receipts(admitted.run_id, [{"intent_id": start.intent_id, "at": 1.5}])
    assert [r["intent_id"] for r in journal.receipts(admitted.run_id)] == [start.intent_id]


def test_the_reads_of_every_launch_find_runs_by_state_without_a_scan(journal: Journal) -> None:
    """A launch and the admission read the runs that hold slots and the queue; the journal
    keeps every run ever recorded (~100 KiB each), so a scan would grow with the host's
    age (20 ms a read at 10,000 runs). Every read of runs they make uses an index."""
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    queued = description().model_copy(update={"run_id": "flow_" + "1" * 32})
    journal.launch_run(queued, machine_limit=0, user_limit=0)
    journal.join_queue(queued.run_id)
    journal.queue_snapshot()
    journal.admit_queued(lambda queued, holding: [])
    journal.db.set_trace_callback(None)
    reads = [sql for sql in statements if sql.lstrip().upper().startswith("SELECT")
             and " runs" in sql]
    assert len(reads) >= 4, statements
    for sql in reads:
        plan = " | ".join(row[3] for row in journal.db.execute(f"EXPLAIN QUERY PLAN {sql}"))
        assert "SCAN runs" not in plan and "SCAN r\b" not in plan, (sql, plan)
        assert "USING INDEX" in plan or "USING COVERING INDEX" in plan or "PRIMARY KEY" in plan, (
            sql, plan)


def test_reader_never_migrates(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    sqlite3.connect(path).close()  # an empty database, schema 0
    before = path.read_bytes()
    with pytest.raises(JournalError, match="older than this cairn"):
        JournalReader(path)
    assert path.read_bytes() == before
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(JournalError, match="newer than this cairn"):
        JournalReader(path)
    with pytest.raises(JournalError, match="does not exist"):
        JournalReader(tmp_path / "nope.db")


def test_the_reader_does_not_import_the_writers_or_the_policy() -> None:
    code = (
        "import sys, cairn.journal.reader\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('cairn'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert "cairn.journal.reader" in out
    for module in ("cairn.policy", "cairn.journal.people", "cairn.journal.operations",
                   "cairn.journal.runs", "cairn.journal.readwrite"):
        assert module not in out


class _Refusing:
    """A connection whose BEGIN fails with one SQLite result code (the real lock is the
    test above; extended codes cannot be provoked on demand)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def execute(self, sql: str, *args: object) -> Any:
        if sql == "BEGIN IMMEDIATE":
            error = sqlite3.OperationalError("busy")
            error.sqlite_errorcode = self.code
            raise error
        if sql == "PRAGMA database_list":
            return [(0, "main", "/j.db")]
        return _Row(50)


class _Row:
    def __init__(self, value: int) -> None:
        self.value = value

    def fetchone(self) -> tuple[int]:
        return (self.value,)


# BUSY, LOCKED, BUSY_RECOVERY, BUSY_SNAPSHOT, BUSY_TIMEOUT
@pytest.mark.parametrize("code", [5, 6, 261, 517, 773])
def test_an_extended_busy_code_is_a_lock_too(code: int) -> None:
    with (pytest.raises(JournalError, match="/j.db stayed locked"),
          transaction(_Refusing(code))):  # type: ignore[arg-type]
        pass


def test_another_operational_error_stays_what_it_is() -> None:
    with (pytest.raises(sqlite3.OperationalError, match="busy"),
          transaction(_Refusing(sqlite3.SQLITE_READONLY))):  # type: ignore[arg-type]
        pass
