"""The built-ins execute-plan, research, review and goal in one booted machine, each with
scripted agents (``--scripted builtin:PROFILE=FILE``): every run succeeds; execute-plan
and goal settle their change into the live project, research and review leave it byte
for byte as it was; execute-plan's worklist facet is in ``cairn show --json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn
from test_escapes import fresh_project, tree
from test_recovery import wait_finished

POINTS = ["add NOTES.md", "mention NOTES.md in CHANGELOG.md", "add NOTES.md"]
# The host's evaluator "tests": its metric "holds" is 1 once attempts.txt has two lines,
# 0 before.
CHECK_SCRIPT = (
    'n=$(cat attempts.txt 2>/dev/null | wc -l); v=0; [ "$n" -ge 2 ] && v=1; '
    'printf "{\\"cairn_metrics\\": {\\"holds\\": %s}}\\n" "$v"'
)
CHECK = f"argv = {json.dumps(['/bin/sh', '-c', CHECK_SCRIPT])}\ntimeout_sec = 60\n"


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
        machine.exec(["tee", "/etc/cairn/evaluators.d/tests.toml"], input=CHECK.encode())
        yield machine


def script(machine: Machine, name: str, body: dict[str, Any]) -> str:
    """Write a scripted profile to alice's home; its path."""
    path = f"/home/alice/{name}.json"
    machine.exec(["tee", path], user="alice", input=json.dumps(body).encode())
    return path


def launch(machine: Machine, definition: str, project: str, args: dict[str, Any],
           **profiles: str) -> dict[str, Any]:
    """Launch ``builtin:definition`` with scripted profiles (builtin:KEY=PATH) and wait
    for it; ``cairn show --json`` of the finished run."""
    scripted = [a for key, path in profiles.items()
                for a in ("--scripted", f"builtin:{key}={path}")]
    out = cairn(machine, "launch", f"builtin:{definition}", "--project", project,
                "--args", json.dumps(args), *scripted)
    data = wait_finished(machine, out.strip().splitlines()[-1])
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    return data


def test_execute_plan_carries_out_each_point_into_the_project(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    booted.exec(["mkdir", "-p", f"{project}/docs"], user="alice")
    booted.exec(["tee", f"{project}/docs/plan.md"], user="alice",
                input=b"# Plan\n1. add NOTES.md\n2. mention it\n")
    planner = script(booted, "planner", {
        "steps": [], "output": {"points": POINTS}, "handoff": "three points"})
    implementer = script(booted, "point", {
        "steps": [{"action": "append", "path": "done.txt", "content": "{title}\n"}],
        "output": {"summary": "did {title}"}, "handoff": "did {title}"})
    data = launch(booted, "execute-plan", project, {"plan": "docs/plan.md"},
                  planner=planner, implementer=implementer)
    assert data["run"]["output"] == {
        "summary": "3 of 3 points of docs/plan.md done", "done": POINTS,
        "reports": ["did point 1", "did point 2", "did point 3"],
    }
    (worklist,) = data["worklists"]
    assert (worklist["title"], worklist["items"], worklist["complete"]) == (
        "Plan", POINTS, True)
    assert worklist["states"] == ["done", "done", "done"]
    agents = [o for o in data["operations"] if o["kind"] == "agent"]
    assert len(agents) == 4 and all(o["state"] == "committed" for o in agents)
    assert booted.exec(["cat", f"{project}/done.txt"]).stdout == \
        b"point 1\npoint 2\npoint 3\n"


def test_research_answers_from_every_line_and_leaves_the_project_alone(
    booted: Machine
) -> None:
    project = fresh_project(booted, "alice")
    before = tree(booted, project)
    researcher = script(booted, "researcher", {
        "steps": [], "output": {"answer": "{title}: it prints hi",
                                "evidence": ["src/app.py:1"]},
        "handoff": "{title} answered"})
    data = launch(booted, "research", project, {"question": "what does app.py do?",
                                                "lines": 3}, researcher=researcher)
    assert data["run"]["output"] == {
        "answer": "synthesis: it prints hi", "evidence": ["src/app.py:1"],
        "open_questions": [], "lines": 3, "lines_answered": 3,
    }
    ops = data["operations"]
    (fork,) = [o for o in ops if o["kind"] == "map"]
    lanes = {o["scope"] for o in ops if o["scope"].startswith(fork["op_id"] + "-")}
    assert lanes == {f"{fork['op_id']}-line-{n}" for n in (1, 2, 3)}
    assert data["settlement"] is None  # read-only agents only: nothing to settle
    assert tree(booted, project) == before


def test_review_gives_a_verdict_and_leaves_the_project_alone(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    before = tree(booted, project)
    finding = {"severity": "low", "where": "src/app.py:1", "problem": "{title}: no main guard"}
    reviewer = script(booted, "reviewer", {
        "steps": [], "output": {"verdict": "approve", "summary": "{title} looked",
                                "findings": [finding]},
        "handoff": "{title} reviewed"})
    data = launch(booted, "review", project, {"focus": "error handling", "reviewers": 2},
                  reviewer=reviewer)
    assert data["run"]["output"] == {
        "verdict": "approve", "summary": "verdict looked",
        "findings": [{"severity": "low", "where": "src/app.py:1",
                      "problem": "verdict: no main guard", "suggestion": ""}],
    }
    assert sum(1 for o in data["operations"] if o["kind"] == "agent") == 3
    assert data["settlement"] is None  # read-only agents only: nothing to settle
    assert tree(booted, project) == before


def test_goal_attempts_until_the_hosts_check_holds(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    worker = script(booted, "attempt", {
        "steps": [{"action": "append", "path": "attempts.txt", "content": "{title}\n"}],
        "output": {"summary": "{title}"}, "handoff": "{title} done"})
    data = launch(booted, "goal", project, {"goal": "tests pass", "check": "tests",
                                            "max_attempts": 5}, implementer=worker)
    assert data["run"]["output"] == {
        "summary": "tests holds after 2 of 5 attempts", "attempts": 2,
        "changes": ["attempt 1", "attempt 2"],
    }
    kinds = [o["kind"] for o in sorted(data["operations"], key=lambda o: o["seq"])
             if o["scope"] == "root"]
    assert kinds == ["measure_proposal", "repeat_until", "agent", "measure_proposal",
                     "agent", "measure_proposal"]
    (facet,) = data["experiments"]  # the checks, as measurements of W
    assert (facet["metric"], facet["latest"]["value"]) == ("holds", 1.0)
    measures = [o for o in data["operations"] if o["kind"] == "measure_proposal"]
    assert {o["request"]["evaluator"] for o in measures} == {"tests"}
    assert booted.exec(["cat", f"{project}/attempts.txt"]).stdout == \
        b"attempt 1\nattempt 2\n"
