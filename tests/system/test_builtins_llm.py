"""All six built-ins end to end with their real ``llm`` profiles (no ``--scripted``), in one
booted machine: every agent talks through the run's model relay to the fake
chat-completions provider of the test suite (``tests/support/fake_provider.py``), whose
scripted tool calls do the work. Each run succeeds; the ones that write settle their change
into the live project, research and review leave it byte for byte as it was, and
``cairn show --json`` carries each run's facet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn
from test_escapes import fresh_project, tree
from test_model_agents import call, configure, start_provider
from test_recovery import wait_finished

# The evaluator "tests": its metric "tests" holds (1) once attempts.txt has two lines;
# the evaluator "bench": "lines" counts notes.txt's lines.
CHECK_SCRIPT = (
    'n=$(cat attempts.txt 2>/dev/null | wc -l); v=0; [ "$n" -ge 2 ] && v=1; '
    'printf "{\\"cairn_metrics\\": {\\"tests\\": %s}}\\n" "$v"'
)
BENCH_SCRIPT = 'printf "{\\"cairn_metrics\\": {\\"lines\\": %s}}\\n" "$(wc -l < notes.txt)"'
EVALUATORS = {
    "tests": f"argv = {json.dumps(['/bin/sh', '-c', CHECK_SCRIPT])}\ntimeout_sec = 60\n",
    "bench": f"argv = {json.dumps(['/bin/sh', '-c', BENCH_SCRIPT])}\ntimeout_sec = 60\n",
}


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
        for name, text in EVALUATORS.items():
            machine.exec(["tee", f"/etc/cairn/evaluators.d/{name}.toml"], input=text.encode())
        machine.key = configure(machine)  # type: ignore[attr-defined]
        yield machine


def finish(output: dict[str, Any], handoff: str = "done") -> dict[str, Any]:
    return call("finish_work", output=output, handoff=handoff)


def run(machine: Machine, definition: str, project: str, args: dict[str, Any],
        turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Serve ``turns`` from the fake provider, launch ``builtin:definition`` with its own
    profiles and wait; ``cairn show --json`` of the finished run, which must succeed."""
    start_provider(machine, turns, machine.key)  # type: ignore[attr-defined]
    out = cairn(machine, "launch", f"builtin:{definition}", "--project", project,
                "--args", json.dumps(args))
    data = wait_finished(machine, out.strip().splitlines()[-1], timeout=400)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    agents = [op for op in data["operations"] if op["kind"] == "agent"]
    assert agents and all(op["state"] == "committed" for op in agents)
    return data


def read(machine: Machine, path: str) -> str:
    return machine.exec(["cat", path]).stdout.decode()


def test_implement(booted: Machine) -> None:
    project = fresh_project(booted)
    data = run(booted, "implement", project, {"objective": "add a greeting"}, [
        call("bash", command="echo hello > greeting.txt"),
        finish({"summary": "added greeting.txt"}),
    ])
    assert data["run"]["output"] == {"summary": "added greeting.txt"}
    assert data["settlement"]["status"] == "applied"
    assert read(booted, f"{project}/greeting.txt") == "hello\n"


def test_execute_plan(booted: Machine) -> None:
    project = fresh_project(booted)
    booted.exec(["tee", f"{project}/plan.md"], user="alice", input=b"1. one\n2. two\n")
    data = run(booted, "execute-plan", project, {"plan": "plan.md"}, [
        finish({"points": ["write one", "write two"]}, "two points"),
        call("bash", command="echo one >> done.txt"),
        finish({"summary": "wrote one"}),
        call("bash", command="echo two >> done.txt"),
        finish({"summary": "wrote two"}),
    ])
    assert data["run"]["output"]["done"] == ["write one", "write two"]
    assert read(booted, f"{project}/done.txt") == "one\ntwo\n"
    (worklist,) = data["worklists"]
    assert (worklist["title"], worklist["items"], worklist["complete"]) == (
        "Plan", ["write one", "write two"], True)
    assert worklist["states"] == ["done", "done"]


def test_research(booted: Machine) -> None:
    project = fresh_project(booted)
    before = tree(booted, project)
    answer = {"answer": "print('hi') in src/app.py", "evidence": ["src/app.py:1"],
              "open_questions": []}
    data = run(booted, "research", project, {"question": "what does app.py print?",
                                             "lines": 2}, [finish(answer)] * 3)
    output = data["run"]["output"]
    assert output["answer"] == answer["answer"] and output["lines_answered"] == 2
    assert data["settlement"] is None and tree(booted, project) == before


def test_review(booted: Machine) -> None:
    project = fresh_project(booted)
    before = tree(booted, project)
    verdict = {"verdict": "changes-needed", "summary": "one finding",
               "findings": [{"severity": "low", "where": "src/app.py:1",
                             "problem": "no newline handling", "suggestion": ""}]}
    data = run(booted, "review", project, {"focus": "error handling", "reviewers": 2},
               [finish(verdict)] * 3)
    assert data["run"]["output"]["verdict"] == "changes-needed"
    assert data["run"]["output"]["findings"][0]["where"] == "src/app.py:1"
    assert data["settlement"] is None and tree(booted, project) == before


def test_goal(booted: Machine) -> None:
    project = fresh_project(booted)
    attempt = [call("bash", command="echo attempt >> attempts.txt"), finish({"summary": "+1"})]
    data = run(booted, "goal", project,
               {"goal": "two attempts", "check": "tests", "metric": "tests", "max_attempts": 5},
               attempt * 2)
    assert data["run"]["output"]["attempts"] == 2
    assert read(booted, f"{project}/attempts.txt") == "attempt\nattempt\n"
    assert data["experiments"], "the goal's checks are its experiment facet"


def test_optimize(booted: Machine) -> None:
    project = fresh_project(booted)
    booted.exec(["tee", f"{project}/notes.txt"], user="alice", input=b"one\n")
    data = run(booted, "optimize", project,
               {"objective": "more notes", "evaluator": "bench", "metric": "lines",
                "direction": "higher", "max_trials": 1},
               [call("bash", command="echo two >> notes.txt"), finish({"summary": "+1"})])
    assert data["run"]["output"]["accepted"] == 1
    (facet,) = data["experiments"]
    assert (facet["baseline"]["value"], facet["best"]["value"]) == (1.0, 2.0)
    assert [c["disposition"] for c in facet["candidates"]] == ["accepted", "accepted"]
    assert read(booted, f"{project}/notes.txt") == "one\ntwo\n"
