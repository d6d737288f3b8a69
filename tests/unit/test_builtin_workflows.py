"""The built-in workflows execute-plan, research, review and goal: each passes review
with the agents, access and operation kinds it promises, refuses bad arguments with one
line, and runs in the real control worker against scripted answers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pytest

from cairn.daemon.launch import validate_args
from cairn.errors import ValidationFailed
from cairn.netpolicy import NetworkMode
from cairn.operations.measure_proposal import evaluators_of
from cairn.operations.unroll import worklists
from cairn.protocol.control import CallResult, StartWorkflow
from cairn.workflow import Access
from cairn.workflow.review import Review, review_source

Respond = Callable[[dict[str, Any]], dict[str, Any]]


def source(name: str) -> str:
    return (resources.files("cairn.builtin") / "workflows" / f"{name}.py").read_text()


def reviewed(name: str) -> Review:
    return review_source(source(name), filename=f"{name}.py")


def converse(name: str, args: dict[str, Any], respond: Respond) -> tuple[
        list[dict[str, Any]], dict[str, Any]]:
    """Run builtin ``name`` in the control worker; forks and joins are granted, every
    other call is answered by ``respond``. The calls made, and how the workflow ended."""
    proc = subprocess.Popen(
        [sys.executable, "-I", "-m", "cairn.workflow.runtime"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdin and proc.stdout
    proc.stdin.write(StartWorkflow(source=source(name), filename=f"{name}.py", args=args)
                     .model_dump_json() + "\n")
    proc.stdin.flush()
    calls: list[dict[str, Any]] = []
    while True:
        message = json.loads(proc.stdout.readline())
        if message["type"] == "join":
            value: dict[str, Any] = {"joined": True}
        elif message["type"] != "call":
            proc.stdin.close()
            proc.wait(timeout=10)
            return calls, message
        elif message["kind"] in ("parallel", "map"):
            calls.append(message)
            value = {"forked": True}
        else:
            calls.append(message)
            value = respond(message)
        reply = CallResult(scope=message["scope"], seq=message["seq"], value=value)
        proc.stdin.write(reply.model_dump_json() + "\n")
        proc.stdin.flush()


def agent_answer(call: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
    return {"output": output, "handoff": "h", "op_id": f"{call['scope']}-{call['seq']}"}


def marked(call: dict[str, Any]) -> dict[str, Any]:
    return {"marked": call["kind"]}


def manifest_of(review: Review) -> tuple[dict[str, tuple[str, Access, NetworkMode]], list[str]]:
    agents = {n: (a.profile, a.access, a.network) for n, a in review.agents.items()}
    return agents, [c.kind for c in review.calls]


# --- review: what each built-in may do ------------------------------------------------


def test_execute_plan_reads_the_plan_then_writes_one_point_at_a_time() -> None:
    review = reviewed("execute_plan")
    assert manifest_of(review) == (
        {"planner": ("builtin:planner", "read", "none"),
         "implement": ("builtin:implementer", "write", "none")},
        ["agent", "agent", "unroll"],
    )
    assert review.workflow.input == "PlanFile" and review.workflow.output == "Outcome"


@pytest.mark.parametrize("name", ["research", "review"])
def test_research_and_review_only_read(name: str) -> None:
    review = reviewed(name)
    agents, kinds = manifest_of(review)
    assert kinds == ["agent", "map", "agent"]
    assert {access for _profile, access, _network in agents.values()} == {"read"}
    assert "write" not in review.capabilities
    assert review.capabilities == [f"profile:builtin:{name}er"]


def test_review_returns_a_verdict_with_findings() -> None:
    review = reviewed("review")
    assert review.workflow.output == "Verdict"
    assert [f.name for f in review.models["Verdict"].fields] == ["verdict", "summary", "findings"]
    assert review.models["Verdict"].fields[2].type.render() == "list[Finding]"


def test_goal_checks_with_the_host_evaluator_its_check_argument_names() -> None:
    review = reviewed("goal")
    assert manifest_of(review) == (
        {"worker": ("builtin:implementer", "write", "none")},
        ["measure_proposal", "agent", "repeat_until"],
    )
    assert "evaluator:$args.check" in review.capabilities
    args = {"goal": "green", "check": "tests", "max_attempts": 5, "metric": "holds"}
    assert evaluators_of(review.manifest(), args) == {"tests": "check"}


# --- arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "args", "message"), [
    ("execute_plan", {}, "arguments do not match PlanFile: plan: Field required"),
    ("execute_plan", {"plan": "/etc/passwd"}, "arguments do not match PlanFile: plan: "
     "String should match pattern"),
    ("execute_plan", {"plan": "docs/../../x.md"}, "arguments do not match PlanFile: plan: "
     "String should match pattern"),
    ("research", {"question": "why?", "lines": 9}, "arguments do not match Question: lines: "
     "Input should be less than or equal to 8"),
    ("research", {"question": "", "lines": 2}, "arguments do not match Question: question: "
     "String should have at least 1 character"),
    ("review", {"focus": "errors", "reviewers": 0}, "arguments do not match Focus: "
     "reviewers: Input should be greater than or equal to 1"),
    ("goal", {"goal": "green", "check": "tests", "max_attempts": 21}, "arguments do not "
     "match Goal: max_attempts: Input should be less than or equal to 20"),
    ("goal", {"goal": "green", "check": "/bin/sh -c true"}, "arguments do not match Goal: "
     "check: String should match pattern"),
    ("goal", {"goal": "green", "check": "../bench"}, "arguments do not match Goal: "
     "check: String should match pattern"),
])
def test_bad_arguments_are_refused_in_one_line(
    name: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationFailed) as info:
        validate_args(reviewed(name), args)
    assert info.value.message.startswith(message)
    assert "\n" not in info.value.message and info.value.hint


@pytest.mark.parametrize(("name", "args"), [
    ("execute_plan", {"plan": "docs/plan.md"}),
    ("execute_plan", {"plan": ".cairn/next-steps.md"}),
    ("research", {"question": "how are runs resumed?"}),
    ("review", {"focus": "error handling", "reviewers": 8}),
    ("goal", {"goal": "tests pass", "check": "tests"}),
])
def test_good_arguments_are_accepted(name: str, args: dict[str, Any]) -> None:
    assert validate_args(reviewed(name), args)


# --- runs in the control worker -------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """A call as the journal would hold it, for the views."""

    op_id: str
    scope: str
    seq: int
    kind: str
    request: dict[str, Any]


def test_execute_plan_carries_out_every_point_in_order_as_a_worklist() -> None:
    points = ["add CHANGES.md", "mention it in README", "add CHANGES.md"]

    def respond(call: dict[str, Any]) -> dict[str, Any]:
        if call["kind"] != "agent":
            return marked(call)
        if call["request"]["descriptor"] == "planner":
            return agent_answer(call, {"points": points})
        return agent_answer(call, {"summary": f"did {call['request']['title']}"})

    calls, end = converse("execute_plan", {"plan": "docs/plan.md"}, respond)
    assert [(c["kind"], c["request"].get("descriptor")) for c in calls] == [
        ("agent", "planner"), ("unroll", None),
        ("item", None), ("agent", "implement"), ("item", None), ("agent", "implement"),
        ("item", None), ("agent", "implement"), ("item", None),
    ]
    assert "docs/plan.md" in calls[0]["request"]["prompt"]
    prompts = [c["request"]["prompt"] for c in calls if c["request"].get("descriptor")
               == "implement"]
    assert [p.splitlines()[2] for p in prompts] == points
    assert "point 3 of 3" in prompts[2]
    assert end == {"type": "return", "output": {
        "summary": "3 of 3 points of docs/plan.md done", "done": points,
        "reports": ["did point 1", "did point 2", "did point 3"],
    }}
    ops = [Op(f"root-{c['seq']}", c["scope"], c["seq"], c["kind"], c["request"]) for c in calls]
    (facet,), problems = worklists(ops)
    assert problems == []
    assert (facet["title"], facet["items"], facet["complete"]) == ("Plan", points, True)
    assert facet["states"] == ["done", "done", "done"]


def test_execute_plan_resumed_mid_list_continues_at_its_point() -> None:
    """Replay answers the first two points, and the marker making the third active, from
    the journal; the worker's next call is the third point's agent, and every replayed
    call is identical to the first run's."""
    points = ["one", "two", "three"]

    def respond(call: dict[str, Any]) -> dict[str, Any]:
        if call["kind"] != "agent":
            return marked(call)
        if call["request"]["descriptor"] == "planner":
            return agent_answer(call, {"points": points})
        return agent_answer(call, {"summary": call["request"]["title"]})

    calls, _ = converse("execute_plan", {"plan": "plan.md"}, respond)
    journal = [CallResult(scope=c["scope"], seq=c["seq"], value=respond(c)) for c in calls[:7]]
    proc = subprocess.Popen(
        [sys.executable, "-I", "-m", "cairn.workflow.runtime"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdin and proc.stdout
    start = StartWorkflow(source=source("execute_plan"), filename="execute_plan.py",
                          args={"plan": "plan.md"}, answers=journal)
    proc.stdin.write(start.model_dump_json() + "\n")
    proc.stdin.flush()
    replayed = [json.loads(proc.stdout.readline()) for _ in range(8)]
    proc.stdin.close()
    proc.wait(timeout=10)
    assert [r["seq"] for r in replayed] == list(range(1, 9))
    assert replayed[7]["kind"] == "agent" and replayed[7]["request"]["title"] == "point 3"
    assert [r["request"] for r in replayed] == [c["request"] for c in calls[:8]]


def lane_respond(output: Callable[[dict[str, Any]], dict[str, Any]],
                 fail: str = "") -> Respond:
    def respond(call: dict[str, Any]) -> dict[str, Any]:
        if call["scope"].endswith(fail) and fail:
            return {"error": "agent ended without finish_work", "kind": "agent-failed"}
        return agent_answer(call, output(call))
    return respond


def test_research_synthesises_every_line_that_answered() -> None:
    def output(call: dict[str, Any]) -> dict[str, Any]:
        title = call["request"]["title"]
        return {"answer": f"{title} says 42", "evidence": [f"{title}.py:1"]}

    calls, end = converse("research", {"question": "what is it?", "lines": 3},
                          lane_respond(output, fail="-line-2"))
    lanes = [c for c in calls if c["scope"] != "root"]
    assert calls[0]["kind"] == "map"
    assert calls[0]["request"] == {"lanes": ["line-1", "line-2", "line-3"], "concurrency": 3}
    assert sorted(c["scope"] for c in lanes) == ["root-1-line-1", "root-1-line-2",
                                                 "root-1-line-3"]
    assert len({c["request"]["prompt"] for c in lanes}) == 3  # each its own angle
    synthesis = calls[-1]
    assert (synthesis["scope"], synthesis["request"]["title"]) == ("root", "synthesis")
    prompt = synthesis["request"]["prompt"]
    assert "line-1 says 42" in prompt and "line-3 says 42" in prompt
    assert "line-2 says" not in prompt
    assert "line-2: OperationFailed: agent ended without finish_work" in prompt
    assert end == {"type": "return", "output": {
        "answer": "synthesis says 42", "evidence": ["synthesis.py:1"], "open_questions": [],
        "lines": 3, "lines_answered": 2,
    }}


def test_review_gives_the_verdict_agents_findings() -> None:
    def output(call: dict[str, Any]) -> dict[str, Any]:
        title = call["request"]["title"]
        return {"verdict": "changes-needed", "summary": f"{title} summary", "findings": [
            {"severity": "high", "where": "app.py:3", "problem": f"{title} found a bug"}]}

    calls, end = converse("review", {"focus": "error handling", "reviewers": 2},
                          lane_respond(output))
    assert [c["kind"] for c in calls] == ["map", "agent", "agent", "agent"]
    assert all("error handling" in c["request"]["prompt"] for c in calls[1:])
    prompt = calls[-1]["request"]["prompt"]
    assert "[high] app.py:3: reviewer-1 found a bug" in prompt
    assert "[high] app.py:3: reviewer-2 found a bug" in prompt
    assert end["output"]["verdict"] == "changes-needed"
    assert end["output"]["findings"] == [{"severity": "high", "where": "app.py:3",
                                          "problem": "verdict found a bug", "suggestion": ""}]


def goal_respond(checks: list[float]) -> Respond:
    """Each check measures the next value of ``checks``; agents answer with their title."""
    values = iter(checks)

    def respond(call: dict[str, Any]) -> dict[str, Any]:
        if call["kind"] == "measure_proposal":
            return {"measurement": f"root-{call['seq']}", "values": {"holds": next(values)}}
        if call["kind"] == "agent":
            return agent_answer(call, {"summary": call["request"]["title"]})
        return marked(call)
    return respond


def test_goal_attempts_until_the_check_holds() -> None:
    calls, end = converse("goal", {"goal": "green", "check": "tests", "max_attempts": 5},
                          goal_respond([0, 0, 1]))
    assert [c["kind"] for c in calls] == [
        "measure_proposal", "repeat_until", "agent", "measure_proposal", "agent",
        "measure_proposal"]
    assert calls[0]["request"]["evaluator"] == "tests"
    assert calls[0]["request"]["primary"] == "holds"
    assert calls[1]["request"] == {"max_attempts": 5}
    assert "Attempt 2 of 5" in calls[4]["request"]["prompt"]
    assert end == {"type": "return", "output": {
        "summary": "tests holds after 2 of 5 attempts", "attempts": 2,
        "changes": ["attempt 1", "attempt 2"],
    }}


def test_goal_that_already_holds_changes_nothing() -> None:
    calls, end = converse("goal", {"goal": "green", "check": "tests"}, goal_respond([1]))
    assert [c["kind"] for c in calls] == ["measure_proposal"]
    assert end["output"]["attempts"] == 0


def test_goal_that_never_holds_fails_the_run() -> None:
    calls, end = converse("goal", {"goal": "green", "check": "tests", "max_attempts": 2},
                          goal_respond([0, 0, 0]))
    assert [c["kind"] for c in calls].count("agent") == 2
    assert end["type"] != "return"
    assert "the check tests still does not hold after 2 attempts" in json.dumps(end)


def test_goal_whose_check_command_fails_fails_the_run() -> None:
    """A check that exits non-zero or prints no metric line fails its measurement; the
    workflow does not take that for 'not yet' and spend attempts on it."""
    failed = {"error": "root-1: cairn-measure-… ended failed (status 1) with no metric line",
              "kind": "measurement-failed"}
    calls, end = converse("goal", {"goal": "green", "check": "tests"}, lambda call: failed)
    assert [c["kind"] for c in calls] == ["measure_proposal"]
    assert end["type"] != "return" and "no metric line" in json.dumps(end)
