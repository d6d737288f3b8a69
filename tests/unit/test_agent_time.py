"""Agent time (``limits.max_agent_seconds``) on a real journal: every attempt is charged,
crashed or retried, not only the committed ones, and an attempt recorded twice (by a
coordinator that restarted) counts once."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

import pytest

from cairn import paths
from cairn.coordinator.agentop import BudgetExhausted
from cairn.coordinator.core import Coordinator
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.protocol.broker import Intent
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, Limits, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source

RUN = "flow_" + "cd" * 16
SOURCE = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()
T0 = 1_000_000.0


@pytest.fixture
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Coordinator:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    review = review_source(SOURCE, filename="implement.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=1001, owner_gid=1001, owner_name="alice",
        definition="builtin:implement", source=SOURCE, source_filename="implement.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"objective": "x"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=1001, on_pool_fs=False),
        profiles={"builtin:implementer": ProfileSpec(name="builtin:implementer",
                                                     kind="scripted")},
        cairn_version="0", created_at=time.time(), limits=Limits(max_agent_seconds=60),
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    c = Coordinator(RUN)
    c.token = c.journal.acquire_lease(RUN, c.lease.holder)
    return c


def agent_op(c: Coordinator, seq: int) -> OpRow:
    call = CallRequest(scope="root", seq=seq, kind="agent",
                       request={"descriptor": "implement", "prompt": "x", "title": "x"},
                       location=f"implement.py:{seq}:1")
    return c.journal.record_requested(call, run_id=RUN, op_id=f"root-{seq}",
                                      predecessor=None, token=c.token)


def attempt(c: Coordinator, op: OpRow, number: int, started: float, ended: float,
            monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker started attempt ``number`` at ``started``; it ended at ``ended``."""
    intent_id = f"start-agent.{op.op_id}.{number}"
    c.journal.add_intents(RUN, [Intent(intent_id=intent_id, run_id=RUN, kind="start-agent",
                                       op_id=op.op_id, attempt=number)], token=None)
    c.journal.record_receipts(RUN, [{"intent_id": intent_id, "run_id": RUN,
                                     "kind": "start-agent", "at": started, "data": {}}])
    monkeypatch.setattr(time, "time", lambda: ended)
    c.agents.record_agent_time(op.model_copy(update={"attempt": number}))


def test_crashed_and_retried_attempts_spend_agent_time_without_any_commit(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = agent_op(coordinator, 1)
    attempt(coordinator, first, 1, T0, T0 + 40, monkeypatch)  # crashed: no result
    attempt(coordinator, first, 2, T0 + 50, T0 + 75, monkeypatch)  # retried, failed too
    assert coordinator.journal.agent_seconds(RUN) == 65
    assert all(o.state != "committed" for o in coordinator.journal.list_ops(RUN))

    second = agent_op(coordinator, 2)
    with pytest.raises(BudgetExhausted, match="65 s of 60 s agent time are used"):
        coordinator.agents.check_budget(second)
    refused = coordinator.journal.get_op_by_id(RUN, "root-2")
    assert refused.state == "not-started"


def test_below_the_limit_a_new_operation_starts(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = agent_op(coordinator, 1)
    attempt(coordinator, first, 1, T0, T0 + 59, monkeypatch)
    second = agent_op(coordinator, 2)
    coordinator.agents.check_budget(second)  # 59 s of 60 s: not refused
    assert coordinator.journal.get_op_by_id(RUN, "root-2").state == "requested"


def test_an_attempt_recorded_again_after_a_restart_counts_once_with_its_longest_span(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = agent_op(coordinator, 1)
    attempt(coordinator, first, 1, T0, T0 + 20, monkeypatch)
    monkeypatch.setattr(time, "time", lambda: T0 + 30)  # the coordinator came back
    coordinator.agents.record_agent_time(first)
    assert coordinator.journal.agent_seconds(RUN) == 30


def test_an_attempt_the_broker_never_started_costs_nothing(coordinator: Coordinator) -> None:
    coordinator.agents.record_agent_time(agent_op(coordinator, 1))
    assert coordinator.journal.agent_seconds(RUN) == 0
