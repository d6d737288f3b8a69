"""The control worker as a real child process: re-execution gives identical calls."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from typing import Any

from cairn.protocol.control import CallRequest, CallResult, StartWorkflow
from cairn.workflow.review import review_source

SOURCE = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()

TWO_AGENTS = '''
from cairn.workflow import Field, Model, agent, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

class Note(Model):
    text: str

plan = agent(profile="builtin:planner", output=Note)
build = agent(profile="builtin:implementer", access="write", output=Note)

@workflow(description="two steps", input=Goal, output=Note)
async def run(flow, args: Goal) -> Note:
    first = await flow.agent(plan, prompt=f"plan {args.goal}")
    second = await flow.agent(build, prompt=first.output.text, title="build")
    return second.output
'''


def drive(source: str, args: dict[str, Any], answers: list[dict[str, Any]]) -> tuple[
        list[CallRequest], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-m", "cairn.workflow.runtime"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdin and proc.stdout
    proc.stdin.write(StartWorkflow(source=source, filename="wf.py", args=args)
                     .model_dump_json() + "\n")
    proc.stdin.flush()
    calls: list[CallRequest] = []
    while True:
        message = json.loads(proc.stdout.readline())
        if message["type"] != "call":
            proc.wait(timeout=10)
            return calls, message
        call = CallRequest.model_validate(message)
        calls.append(call)
        value = answers[len(calls) - 1]
        proc.stdin.write(CallResult(seq=call.seq, value=value).model_dump_json() + "\n")
        proc.stdin.flush()


def answer(text_field: str, text: str, op: str) -> dict[str, Any]:
    return {"output": {text_field: text}, "handoff": "h", "op_id": op}


def test_single_agent_call_matches_review_manifest() -> None:
    calls, end = drive(SOURCE, {"objective": "add a line"},
                       [answer("summary", "done", "root-1")])
    (call,) = calls
    assert call.kind == "agent" and call.seq == 1 and call.scope == "root"
    assert call.request == {"descriptor": "implement", "prompt": "add a line",
                            "title": "implement"}
    site = review_source(SOURCE, filename="wf.py").calls[0]
    file, line, _col = call.location.split(":")
    assert (file, int(line)) == ("wf.py", site.line)
    assert end == {"type": "return", "output": {"summary": "done"}}


def test_replay_produces_identical_identities() -> None:
    answers = [answer("text", "the plan", "root-1"), answer("text", "built", "root-2")]
    first, end1 = drive(TWO_AGENTS, {"goal": "g"}, answers)
    second, end2 = drive(TWO_AGENTS, {"goal": "g"}, answers)
    assert [c.request_hash() for c in first] == [c.request_hash() for c in second]
    assert [c.location for c in first] == [c.location for c in second]
    assert first[1].request["prompt"] == "the plan"  # data flows from the journal's answer
    assert end1 == end2 == {"type": "return", "output": {"text": "built"}}


def test_invalid_answer_fails_the_workflow_closed() -> None:
    calls, end = drive(SOURCE, {"objective": "x"}, [answer("summary", "", "root-1")])
    assert end["type"] == "failure" and end["kind"] == "ValidationError"


def test_arguments_are_validated_in_the_worker_too() -> None:
    calls, end = drive(SOURCE, {"objective": ""}, [])
    assert calls == [] and end["type"] == "failure"


POSTPONED = """
from __future__ import annotations

from cairn.workflow import Model, agent, workflow


class Inner(Model):
    width: int = 8


class Goal(Model):
    goal: str
    inner: Inner | None = None


class Note(Model):
    text: str


plan = agent(profile="builtin:planner", output=Note)


@workflow(description="postponed annotations", input=Goal, output=Note)
async def run(flow, args: Goal) -> Note:
    first = await flow.agent(plan, prompt=f"{args.goal} {args.inner}")
    return first.output
"""


def test_postponed_annotations_naming_another_model_resolve() -> None:
    calls, end = drive(POSTPONED, {"goal": "g", "inner": {"width": 3}},
                       [answer("text", "ok", "root-1")])
    assert [c.request["prompt"] for c in calls] == ["g width=3"]
    assert end == {"type": "return", "output": {"text": "ok"}}
