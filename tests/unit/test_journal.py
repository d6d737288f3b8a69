"""The journal on real SQLite: schema, fencing, operations, intents, events."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from cairn.errors import NotFound
from cairn.journal.readwrite import Journal
from cairn.journal.runs import Busy
from cairn.journal.store import SCHEMA_VERSION
from cairn.journal.writes import LeaseLost
from cairn.protocol.broker import Intent
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProjectSpec

RUN = "flow_" + "0" * 31 + "1"


def description(run_id: str = RUN) -> LaunchDescription:
    return LaunchDescription(
        run_id=run_id, owner_uid=1001, owner_gid=1001, owner_name="alice",
        definition="builtin:implement", source="x = 1\n", source_filename="implement.py",
        review_hash="sha256:" + "a" * 64, review={}, args={"objective": "x"},
        project=ProjectSpec(root="/home/alice/demo", owner_uid=1001, on_pool_fs=False),
        profiles={}, cairn_version="0", created_at=time.time(),
    )


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal.db", create=True)
    j.create_run(description(), intents=[
        Intent(intent_id="start-coordinator", run_id=RUN, kind="start-coordinator")])
    return j


def test_pragmas_and_schema_version(journal: Journal) -> None:
    assert journal.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert journal.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert journal.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    Journal(path, create=True).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(Exception, match="newer than this cairn"):
        Journal(path)


def test_missing_journal_has_a_hint(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not exist"):
        Journal(tmp_path / "nope.db")


def test_launch_description_round_trips(journal: Journal) -> None:
    assert journal.launch_description(RUN) == description().model_copy(
        update={"created_at": journal.launch_description(RUN).created_at})
    assert journal.get_run(RUN).state == "pending"
    assert [i.kind for i in journal.intents(RUN, "launch-v1")] == ["start-coordinator"]


def test_second_holder_is_busy_and_fenced_writer_cannot_commit(journal: Journal) -> None:
    token = journal.acquire_lease(RUN, "a", ttl=60)
    with pytest.raises(Busy):
        journal.acquire_lease(RUN, "b", ttl=60)
    # once the lease expired, b takes over and a's token is fenced
    journal.db.execute("UPDATE runs SET lease_expires=0 WHERE run_id=?", (RUN,))
    newer = journal.acquire_lease(RUN, "b", ttl=60)
    assert newer == token + 1
    with pytest.raises(LeaseLost):
        journal.set_run_state(RUN, "running", token=token)
    journal.set_run_state(RUN, "running", token=newer)
    assert journal.get_run(RUN).state == "running"


def test_operation_moves_forward_with_intents_atomically(journal: Journal) -> None:
    token = journal.acquire_lease(RUN, "a")
    call = CallRequest(scope="root", seq=1, kind="agent",
                       request={"descriptor": "implement", "prompt": "p", "title": "t"},
                       location="implement.py:20:13")
    op = journal.record_requested(call, run_id=RUN, op_id="root-1", predecessor=None, token=token)
    assert op.state == "requested" and op.request_hash == call.request_hash()
    start = Intent(intent_id="start-agent.root-1.1", run_id=RUN, kind="start-agent", op_id="root-1")
    journal.update_op(RUN, "root-1", token=token, state="started", intents=[start])
    assert journal.get_op_by_id(RUN, "root-1").state == "started"
    assert [i.intent_id for i in journal.intents(RUN, "launch-v1")][-1] == "start-agent.root-1.1"
    journal.update_op(RUN, "root-1", token=token, state="committed", result={"output": {}})
    assert journal.get_op(RUN, "root", 1).result == {"output": {}}  # type: ignore[union-attr]
    events = [e.event for e in journal.events(RUN)]
    assert events[-3:] == ["op-requested", "op-started", "op-committed"]
    assert [e.cursor for e in journal.events(RUN)] == sorted(e.cursor for e in journal.events(RUN))


def test_fenced_update_leaves_no_trace(journal: Journal) -> None:
    token = journal.acquire_lease(RUN, "a")
    call = CallRequest(scope="root", seq=1, kind="agent", request={}, location="f:1:1")
    journal.record_requested(call, run_id=RUN, op_id="root-1", predecessor=None, token=token)
    intent = Intent(intent_id="checkpoint.root-1", run_id=RUN, kind="checkpoint", op_id="root-1")
    with pytest.raises(LeaseLost):
        journal.update_op(RUN, "root-1", token=token + 7, state="settled", intents=[intent])
    assert journal.get_op_by_id(RUN, "root-1").state == "requested"
    assert journal.intents(RUN, "storage-v1") == []


def test_unknown_run_and_op(journal: Journal) -> None:
    with pytest.raises(NotFound, match="no run"):
        journal.get_run("flow_" + "f" * 32)
    with pytest.raises(NotFound):
        journal.get_op_by_id(RUN, "root-9")
