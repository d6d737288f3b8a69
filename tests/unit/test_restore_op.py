"""``flow.restore`` on a real journal with the broker faked (the W it makes is real in
tests/system/test_restore.py): the review lists it, a restore is a new W generation from
the boundary's checkpoint saved before it is made, retries and measurements after it
start from that boundary, and a boundary the scope may not go back to is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_control_worker import answer, drive
from test_experiment_coordinator import RUN, FakeBroker, Script, coordinator_of

from cairn.coordinator.core import Coordinator
from cairn.coordinator.restores import RestoreRefused
from cairn.operations import restore
from cairn.protocol.control import CallRequest
from cairn.restore_point import restore_point
from cairn.workflow.review import review_source

SOURCE = '''
from cairn.workflow import Field, Model, agent, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

class Report(Model):
    summary: str = Field(min_length=1)

change = agent(profile="test:fetch", access="write", output=Report)

@workflow(description="try, go back, try again", input=Goal, output=Report)
async def run(flow, args: Goal) -> Report:
    first = await flow.agent(change, prompt=args.goal)
    await flow.agent(change, prompt="a detour")
    await flow.restore(first)
    again = await flow.agent(change, prompt="another way")
    return again.output
'''
LINES = {kind: n for n, text in enumerate(SOURCE.splitlines(), 1)
         for kind in ("agent", "restore") if f"flow.{kind}(" in text}


@pytest.fixture
def coord(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    with coordinator_of(tmp_path, monkeypatch, SOURCE) as coordinator:
        yield coordinator


def restore_call(script: Script, boundary: str) -> tuple[Any, Any]:
    return script.call("restore", restore.request(boundary))


def after_a_detour(coord: Coordinator) -> tuple[Script, str, Any, Any]:
    """Two agent boundaries, then a restore call back to the first: the script, the
    first boundary, and the restore's operation and call."""
    script = Script(coord, LINES)
    first = script.agent()
    script.agent()
    op, call = restore_call(script, first)
    return script, first, op, call


def test_the_review_lists_a_restore_and_what_it_needs() -> None:
    review = review_source(SOURCE, filename="wf.py")
    (site,) = [c for c in review.calls if c.kind == "restore"]
    assert site.capabilities == ["restore"] and "restore" in review.capabilities


def test_a_restore_makes_w_from_the_boundary_and_later_calls_start_there(
    coord: Coordinator,
) -> None:
    script, first, op, call = after_a_detour(coord)
    result, fresh = coord.handlers.answer_restore(op, call)
    assert fresh and result == {"boundary": first, "w_generation": 2}
    assert coord.w["root"] == 2
    broker: FakeBroker = coord.context.broker  # type: ignore[assignment]
    create, drop = broker.sent[-2:]
    assert (create.kind, create.intent_id, create.from_checkpoint, create.generation) == (
        "create-w", "create-w.root.2", first, 2)
    assert (drop.kind, drop.intent_id, drop.generation) == ("drop-w", "drop-w.root.1", 1)
    ops = coord.journal.list_ops(RUN)
    assert coord.journal.get_op_by_id(RUN, op.op_id).state == "committed"
    # an agent retried after the restore starts from the boundary, not from the detour
    assert restore_point(ops, "root", script.seq + 1) == first


def test_a_restore_interrupted_after_its_decision_makes_the_same_w(
    coord: Coordinator,
) -> None:
    _script, _first, op, call = after_a_detour(coord)
    result = coord.restores.decide_restore(op, call)
    coord.journal.update_op(RUN, op.op_id, token=coord.token, state="started", result=result,
                            intents=coord.restores.restore_intents(op, result))
    assert [i.intent_id for i in coord.journal.intents(RUN, "storage-v1")] == [
        "create-w.root.2", "drop-w.root.1"]
    started = coord.journal.get_op_by_id(RUN, op.op_id)
    again, _ = coord.handlers.answer_restore(started, call)
    assert again == result and coord.w["root"] == 2
    broker: FakeBroker = coord.context.broker  # type: ignore[assignment]
    assert [i.intent_id for i in broker.sent] == ["create-w.root.2", "drop-w.root.1"]


@pytest.mark.parametrize(("boundary", "said"), [
    ("root-9", "root-9 is not an operation of this run"),
    ("root-2", "root-2 is not a committed agent boundary"),  # the restore itself
])
def test_only_a_committed_boundary_can_be_restored(
    coord: Coordinator, boundary: str, said: str
) -> None:
    script = Script(coord, LINES)
    script.agent()
    op, call = restore_call(script, boundary)
    with pytest.raises(RestoreRefused, match=said):
        coord.handlers.answer_restore(op, call)
    refused = coord.journal.get_op_by_id(RUN, op.op_id)
    assert (refused.state, refused.result) == ("not-started", {
        "error": said, "kind": "restore-refused"})
    assert coord.w["root"] == 1  # W unchanged


@pytest.mark.parametrize("request_", [
    {"boundary": "root-1", "also": "x"}, {"boundary": "../root-1"}, {"boundary": 1}, {}])
def test_a_request_flow_restore_never_sends_is_refused(
    coord: Coordinator, request_: dict[str, Any]
) -> None:
    """The attack is the workflow sandbox's: a call it made up, not one flow.restore
    built; the coordinator checks it again, and W stays."""
    script = Script(coord, LINES)
    script.agent()
    op, call = script.call("restore", request_)
    with pytest.raises(RestoreRefused, match="not a request of flow.restore"):
        coord.handlers.answer_restore(op, call)
    assert coord.w["root"] == 1


def test_another_scopes_boundary_is_refused(coord: Coordinator) -> None:
    script = Script(coord, LINES)
    lane = coord.journal.record_requested(
        call_in("root-1-a", 1, "agent", {"descriptor": "change", "prompt": "p",
                                          "title": "t"}),
        run_id=RUN, op_id="root-1-a-1", predecessor=None, token=coord.token)
    for state in ("started", "settled", "committed"):
        coord.journal.update_op(RUN, lane.op_id, token=coord.token, state=state,
                                result={"output": {}} if state == "settled" else None)
    script.agent()
    op, call = restore_call(script, "root-1-a-1")
    with pytest.raises(RestoreRefused, match="not an earlier boundary of scope root"):
        coord.handlers.answer_restore(op, call)


def call_in(scope: str, seq: int, kind: str, request: dict[str, Any]) -> CallRequest:
    return CallRequest(scope=scope, seq=seq, kind=kind, request=request,  # type: ignore[arg-type]
                       location=f"wf.py:{LINES['agent']}:5")


def test_a_boundary_is_an_agents_result_or_its_op_id() -> None:
    class Result:
        boundary = "root-3"

    assert restore.request(Result()) == restore.request("root-3") == {"boundary": "root-3"}
    for bad in (None, 3, "Root 3", {"boundary": "root-3"}):
        with pytest.raises(ValueError, match="flow.restore takes an agent's boundary"):
            restore.request(bad)


def test_the_control_worker_sends_the_boundary_and_goes_on() -> None:
    answers = [
        answer("summary", "first", "root-1"), answer("summary", "detour", "root-2"),
        {"boundary": "root-1", "w_generation": 2}, answer("summary", "again", "root-4"),
    ]
    calls, end = drive(SOURCE, {"goal": "g"}, answers)
    assert [c.kind for c in calls] == ["agent", "agent", "restore", "agent"]
    assert calls[2].request == {"boundary": "root-1"}
    assert end == {"type": "return", "output": {"summary": "again"}}
