"""Worklists and bounded retries in the control worker, and the worklist view rebuilt
from the journal alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_control_worker_lanes import Conversation, agent_answer

from cairn import paths
from cairn.coordinator.core import Coordinator
from cairn.daemon.views import show
from cairn.journal.readwrite import Journal
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source

SOURCE = """
from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    steps: list[str] = Field(min_length=1)


class Note(Model):
    text: str


work = agent(profile="p:work", access="write", output=Note)
judge = agent(profile="p:judge", output=Note)


@workflow(description="worklist then retries", input=Goal, output=Note)
async def run(flow: Any, args: Goal) -> Note:
    notes = await flow.unroll(args.steps, lambda step: flow.agent(work, prompt=step),
                              title="Plan")
    tried = await flow.repeat_until(
        lambda attempt: flow.agent(judge, prompt="try " + str(attempt)),
        lambda result: result.output.text == "good",
        max_attempts=3,
    )
    result: Note = tried.value.output
    return Note(text=",".join(n.output.text for n in notes) + "/" + str(tried.attempts)
                + "/" + result.text)
"""
RUN = "flow_" + "ef" * 16


def test_unroll_marks_each_item_and_repeat_until_stops_when_check_holds() -> None:
    c = Conversation(SOURCE, {"steps": ["a", "b"]})
    calls: list[dict[str, Any]] = []

    def next_call() -> dict[str, Any]:
        message = c.read()
        calls.append(message)
        return message

    unroll = next_call()
    assert (unroll["kind"], unroll["request"]) == (
        "unroll", {"title": "Plan", "items": ["a", "b"]})
    c.answer("root", unroll["seq"], {"marked": "unroll"})
    for step in ("a", "b"):
        marker = next_call()
        assert marker["kind"] == "item" and marker["request"]["label"] == step
        c.answer("root", marker["seq"], {"marked": "item"})
        work = next_call()
        assert work["request"]["prompt"] == step
        c.answer("root", work["seq"], agent_answer(step.upper(), f"root-{work['seq']}"))
    done = next_call()
    assert done["kind"] == "item" and done["request"]["done"] is True
    c.answer("root", done["seq"], {"marked": "item"})
    loop = next_call()
    assert loop["kind"] == "repeat_until" and loop["request"] == {"max_attempts": 3}
    c.answer("root", loop["seq"], {"marked": "repeat_until"})
    for attempt, verdict in ((1, "bad"), (2, "good")):
        judge = next_call()
        assert judge["request"]["prompt"] == f"try {attempt}"
        c.answer("root", judge["seq"], agent_answer(verdict, f"root-{judge['seq']}"))
    assert c.read() == {"type": "return", "output": {"text": "A,B/2/good"}}
    assert [m["seq"] for m in calls] == list(range(1, len(calls) + 1))


@pytest.fixture
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Coordinator:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    review = review_source(SOURCE, filename="wf.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=1001, owner_gid=1001, owner_name="alice", definition="wf.py",
        source=SOURCE, source_filename="wf.py", review_hash=review.review_hash,
        review=review.model_dump(mode="json"), args={"steps": ["a", "b", "c"]},
        project=ProjectSpec(root="/home/alice/p", owner_uid=1001, on_pool_fs=False),
        profiles={n: ProfileSpec(name=n, kind="scripted") for n in ("p:work", "p:judge")},
        cairn_version="0", created_at=time.time(),
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    c = Coordinator(RUN)
    c.token = c.journal.acquire_lease(RUN, c.lease.holder)
    return c


def test_worklist_view_comes_from_the_journal(coordinator: Coordinator) -> None:
    line = next(c["line"] for c in coordinator.context.review["calls"] if c["kind"] == "unroll")
    where = f"wf.py:{line}:11"
    answer = coordinator.replayer.answer
    answer(CallRequest(scope="root", seq=1, kind="unroll", location=where,
                       request={"title": "Plan", "items": ["a", "b", "c"]}), None)
    answer(CallRequest(scope="root", seq=2, kind="item", location=where,
                       request={"worklist": "Plan", "index": 0, "label": "a"}),
           "root-1")
    (plan,) = show(coordinator.journal, RUN, 1001)["worklists"]
    assert (plan["title"], plan["revision"], plan["done"], plan["complete"]) == (
        "Plan", 1, 0, False)
    assert plan["states"] == ["active", "waiting", "waiting"]
    answer(CallRequest(scope="root", seq=3, kind="item", location=where,
                       request={"worklist": "Plan", "index": 1, "label": "b"}),
           "root-2")
    (plan,) = show(coordinator.journal, RUN, 1001)["worklists"]
    assert plan["states"] == ["done", "active", "waiting"] and plan["done"] == 1
