"""A clean retry restores the checkpoint W actually held (ARCHITECTURE §5), whatever came
before the agent: in one booted machine, each shape of tests/system/data/retry_shapes.py
runs once undisturbed and once with every agent's first attempt SIGKILLed before it
finished (failpoint ``agent-before-finish``, after its writes reached W). Each crashed run
succeeds with the project the undisturbed run left, and every retried W is a snapshot of
the expected checkpoint: its create-w receipt names that subvolume's UUID, and so does the
new W's parent UUID on disk."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_escapes import tree

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = (REPO / "tests" / "system" / "data" / "retry_shapes.py").read_text()
SHAPES = ("plan", "trial", "lanes")
EVALUATOR = (REPO / "tests" / "system" / "data" / "score-evaluator.toml").read_text()
# Each agent: its own file, a line in log.txt (twice if a killed attempt's W survived),
# the score, and what it sees of earlier boundaries' workspaces (a lane's W shows there).
STEP = {
    "steps": [
        {"action": "write", "path": "{prompt}.txt", "content": "from {prompt}\n"},
        {"action": "append", "path": "log.txt", "content": "{prompt}\n"},
        {"action": "write", "path": "score.txt", "content": "2\n"},
        {"action": "run", "argv": [
            "/bin/sh", "-c",
            "(cd /evidence/incoming && find . -path '*/workspace/*' -type f | sort) "
            "> seen-{prompt}.txt || true"]},
    ],
    "output": {"summary": "{prompt}"},
    "handoff": "{prompt} done",
}
POOL = "/var/lib/cairn/pool/runs"
RECEIPT = (
    "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
    "'SELECT body FROM receipts WHERE run_id=? AND intent_id=?', sys.argv[2:]).fetchone()[0])"
)
SUBVOLUME = (
    "import btrfsutil, sys; i = btrfsutil.subvolume_info(sys.argv[1]); "
    "print(bytes(i.uuid).hex(), bytes(i.parent_uuid).hex())"
)


def cairn(machine: Machine, *argv: str) -> str:
    return machine.exec(["cairn", *argv], user="alice", timeout=120).stdout.decode()


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    return json.loads(cairn(machine, "show", run_id, "--json"))  # type: ignore[no-any-return]


def launch(machine: Machine, shape: str, review_hash: str, tag: str) -> tuple[str, str]:
    project = f"/home/alice/{shape}-{tag}"
    machine.exec(["mkdir", "-p", project], user="alice")
    machine.exec(["tee", f"{project}/score.txt"], user="alice", input=b"3\n")
    out = cairn(machine, "launch", "/home/alice/retry_shapes.py", "--confirm", review_hash,
                "--project", project, "--args", json.dumps({"shape": shape}),
                "--scripted", "test:step=/home/alice/step.json")
    return out.strip().splitlines()[-1], project


def finish_all(machine: Machine, runs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Wait for every run to end, answering the lanes shape's question on the way."""
    deadline = time.monotonic() + 480
    done: dict[str, dict[str, Any]] = {}
    while len(done) < len(runs):
        for shape, run_id in runs.items():
            if shape in done:
                continue
            data = show(machine, run_id)
            state = data["run"]["state"]
            if state == "waiting" and (data.get("question") or {}).get("challenge"):
                cairn(machine, "answer", run_id, "--challenge",
                      data["question"]["challenge"], '{"colour": "teal"}')
            elif state in ("succeeded", "failed", "blocked", "cancelled"):
                done[shape] = data
        assert time.monotonic() < deadline, {s: show(machine, r)["run"] for s, r in runs.items()}
        time.sleep(1)
    return done


@pytest.fixture(scope="module")
def runs(deb: Path) -> Iterator[tuple[Machine, dict[str, Any]]]:
    """Every shape undisturbed, then every shape with each agent's first attempt killed;
    the runs of a phase go at the same time."""
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
        machine.exec(["tee", "/etc/cairn/evaluators.d/score.toml"], input=EVALUATOR.encode())
        machine.exec(["tee", "/home/alice/retry_shapes.py"], user="alice",
                     input=WORKFLOW.encode())
        machine.exec(["tee", "/home/alice/step.json"], user="alice",
                     input=json.dumps(STEP).encode())
        review = cairn(machine, "workflow", "review", "/home/alice/retry_shapes.py")
        review_hash = review.strip().splitlines()[-1].split()[-1]
        result: dict[str, Any] = {}
        for tag in ("clean", "killed"):
            if tag == "killed":
                for unit in ("cairn-coordinator@.service", "cairn-broker.service"):
                    machine.exec(["mkdir", "-p", f"/etc/systemd/system/{unit}.d"])
                    machine.exec(
                        ["tee", f"/etc/systemd/system/{unit}.d/failpoint.conf"],
                        input=b"[Service]\nEnvironment=CAIRN_FAILPOINTS=agent-before-finish\n",
                    )
                machine.exec(["systemctl", "daemon-reload"])
                machine.exec(["systemctl", "stop", "cairn-broker.service"])
            launched = {shape: launch(machine, shape, review_hash, tag) for shape in SHAPES}
            shown = finish_all(machine, {s: run_id for s, (run_id, _p) in launched.items()})
            result[tag] = {s: (launched[s][0], launched[s][1], shown[s]) for s in SHAPES}
        yield machine, result


def uuid_of(machine: Machine, path: str) -> tuple[str, str]:
    uuid, parent = machine.exec(["python3", "-c", SUBVOLUME, path]).stdout.decode().split()
    return uuid, parent


def check_retries(machine: Machine, run_id: str, data: dict[str, Any],
                  expected: dict[str, tuple[str, str | None]]) -> None:
    """Every agent retried once, on a W made from ``expected[op] = (predecessor kind,
    checkpoint op or None for Q)``, by the receipt and by the subvolume on disk."""
    ops = {o["op_id"]: o for o in data["operations"]}
    agents = {o["op_id"] for o in data["operations"] if o["kind"] == "agent"}
    assert agents == set(expected), sorted(agents)
    for op_id, (before, checkpoint) in expected.items():
        op = ops[op_id]
        previous = [o for o in data["operations"]
                    if o["scope"] == op["scope"] and o["seq"] == op["seq"] - 1]
        assert [o["kind"] for o in previous] == ([before] if before else []), op_id
        assert op["attempt"] == 2 and op["state"] == "committed"
        (retry,) = op["retries"]
        source = f"{POOL}/{run_id}/" + (f"checkpoints/{checkpoint}" if checkpoint else "Q")
        source_uuid, _ = uuid_of(machine, source)
        assert retry == {"attempt": 2, "w_generation": retry["w_generation"],
                         "from_checkpoint": checkpoint, "source_uuid": source_uuid}, op_id
        body = json.loads(machine.exec(
            ["python3", "-c", RECEIPT, "/var/lib/cairn/broker/receipts.db", run_id,
             f"create-w.{op['scope']}.{retry['w_generation']}"]).stdout)["data"]
        assert body["source_uuid"] == source_uuid, op_id
        w = body["w"]["path"]
        if machine.exec(["test", "-e", w], check=False).returncode == 0:
            assert uuid_of(machine, w) == (body["w"]["uuid"], source_uuid), op_id


def check_same_project(machine: Machine, result: dict[str, Any], shape: str) -> dict[str, Any]:
    _clean_id, clean_project, clean = result["clean"][shape]
    run_id, project, killed = result["killed"][shape]
    assert clean["run"]["state"] == "succeeded", clean["run"]["error"]
    assert killed["run"]["state"] == "succeeded", killed["run"]["error"]
    assert killed["run"]["output"] == clean["run"]["output"]
    assert tree(machine, project) == tree(machine, clean_project)
    log = machine.exec(["cat", f"{project}/log.txt"]).stdout.decode().split()
    assert len(log) == len(set(log)), log  # no killed attempt's line survived
    return killed  # type: ignore[no-any-return]


def test_execute_plan_shape_retries_each_point_from_the_agent_before(
    runs: tuple[Machine, dict[str, Any]],
) -> None:
    machine, result = runs
    killed = check_same_project(machine, result, "plan")
    run_id = result["killed"]["plan"][0]
    agents = [o["op_id"] for o in killed["operations"] if o["kind"] == "agent"]
    first, one, two, three = agents
    check_retries(machine, run_id, killed, {
        first: ("", None),  # the root's first agent: Q
        one: ("item", first), two: ("item", one), three: ("item", two),
    })
    log = machine.exec(["cat", f"{result['killed']['plan'][1]}/log.txt"]).stdout.decode()
    assert log.split() == ["first", "one", "two", "three"]


def test_optimize_shape_retries_after_a_measurement_and_an_accept(
    runs: tuple[Machine, dict[str, Any]],
) -> None:
    machine, result = runs
    killed = check_same_project(machine, result, "trial")
    run_id = result["killed"]["trial"][0]
    first, measured, accepted = [o["op_id"] for o in killed["operations"]
                                 if o["kind"] == "agent"]
    check_retries(machine, run_id, killed, {
        first: ("", None),
        measured: ("measure_proposal", first),
        accepted: ("settle_experiment", measured),
    })


def test_lanes_shape_retries_a_lanes_first_agent_from_the_fork(
    runs: tuple[Machine, dict[str, Any]],
) -> None:
    machine, result = runs
    killed = check_same_project(machine, result, "lanes")
    run_id, project = result["killed"]["lanes"][:2]
    ops = killed["operations"]
    fork = next(o["op_id"] for o in ops if o["kind"] == "map")
    first, joined, asked = [o["op_id"] for o in ops if o["kind"] == "agent"
                            and o["scope"] == "root"]
    check_retries(machine, run_id, killed, {
        first: ("", None),
        f"{fork}-x-1": ("", fork), f"{fork}-y-1": ("", fork),  # a lane's first: fork's S
        joined: ("map", first),  # the fork, committed at its join
        asked: ("ask", joined),
    })
    # each lane's W held the parent's work (first.txt) and its own, once
    seen = machine.exec(["cat", f"{project}/seen-joined.txt"]).stdout.decode().split()
    for key in ("x", "y"):
        lane = f"./{fork}-{key}-1/workspace/"
        assert {s.removeprefix(lane) for s in seen if s.startswith(lane)} >= {
            "first.txt", f"{key}.txt", "log.txt"}, seen
    text = cairn(machine, "show", run_id)
    assert f"attempt 2 on a W restored from checkpoint {fork}" in text
    assert "attempt 2 on a W restored from Q" in text
