"""Lanes in the control worker: each lane is its own scope with its own numbering, lanes
run interleaved, answers may come in any order, and the parent resumes after the join."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from cairn.protocol.control import CallResult, StartWorkflow
from cairn.workflow.review import review_source

LANES = """
from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Note(Model):
    text: str


build = agent(profile="p:build", access="write", output=Note)
merge = agent(profile="p:merge", output=Note)


@workflow(description="fork and join", input=Goal, output=Note)
async def run(flow: Any, args: Goal) -> Note:
    lanes = await flow.parallel({
        "a": lambda: flow.agent(build, prompt="a"),
        "b": lambda: flow.agent(build, prompt="b"),
        "c": lambda: flow.agent(build, prompt="c"),
    }, concurrency=2)
    done = ",".join(sorted(k for k, r in lanes.items() if r.ok))
    items = await flow.map(["x", "y"], lambda item: flow.agent(build, prompt=item),
                           key=lambda item: item)
    merged = await flow.agent(merge, prompt=done + "/" + ",".join(sorted(items)))
    result: Note = merged.output
    return result
"""


class Conversation:
    def __init__(self, source: str, args: dict[str, Any] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "cairn.workflow.runtime"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdin and self.proc.stdout
        self.send(StartWorkflow(source=source, filename="wf.py", args=args or {"goal": "g"})
                  .model_dump_json())

    def send(self, line: str) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout
        return dict(json.loads(self.proc.stdout.readline()))

    def answer(self, scope: str, seq: int, value: dict[str, Any]) -> None:
        self.send(CallResult(scope=scope, seq=seq, value=value).model_dump_json())


def agent_answer(text: str, op: str) -> dict[str, Any]:
    return {"output": {"text": text}, "handoff": "", "op_id": op}


def test_review_accepts_the_lane_workflow() -> None:
    kinds = [c.kind for c in review_source(LANES, filename="wf.py").calls]
    assert kinds.count("parallel") == 1 and kinds.count("map") == 1


def test_fork_lanes_join_in_any_order() -> None:
    c = Conversation(LANES)
    fork = c.read()
    assert (fork["kind"], fork["scope"], fork["seq"]) == ("parallel", "root", 1)
    assert fork["request"] == {"lanes": ["a", "b", "c"], "concurrency": 2}
    c.answer("root", 1, {"forked": True})
    first, second = c.read(), c.read()  # concurrency 2: lanes a and b, c is queued
    assert {(m["scope"], m["seq"]) for m in (first, second)} == {("root-1-a", 1), ("root-1-b", 1)}
    c.answer("root-1-b", 1, agent_answer("B", "root-1-b-1"))  # b finishes first
    third = c.read()
    assert (third["scope"], third["request"]["prompt"]) == ("root-1-c", "c")
    c.answer("root-1-c", 1, agent_answer("C", "root-1-c-1"))
    c.answer("root-1-a", 1, agent_answer("A", "root-1-a-1"))
    join = c.read()
    assert join["type"] == "join" and (join["scope"], join["seq"]) == ("root", 1)
    assert join["outcomes"]["a"] == {"outcome": "succeeded", "error": None,
                                     "last_op": "root-1-a-1"}
    c.answer("root", 1, {"joined": True})
    fork2 = c.read()
    assert (fork2["kind"], fork2["seq"], fork2["request"]["lanes"]) == ("map", 2, ["x", "y"])
    c.answer("root", 2, {"forked": True})
    lanes = {c.read()["scope"] for _ in range(2)}
    assert lanes == {"root-2-x", "root-2-y"}
    c.answer("root-2-y", 1, agent_answer("Y", "root-2-y-1"))
    c.answer("root-2-x", 1, {"output": {"bad": 1}, "handoff": "", "op_id": "root-2-x-1"})
    join2 = c.read()
    assert join2["outcomes"]["x"]["outcome"] == "failed"
    assert "ValidationError" in join2["outcomes"]["x"]["error"]
    assert join2["outcomes"]["y"]["outcome"] == "succeeded"
    c.answer("root", 2, {"joined": True})
    last = c.read()
    assert (last["scope"], last["seq"]) == ("root", 3)
    assert last["request"]["prompt"] == "a,b,c/x,y"
    c.answer("root", 3, agent_answer("merged", "root-3"))
    assert c.read() == {"type": "return", "output": {"text": "merged"}}
