"""Parallel lanes with physical branches (ARCHITECTURE §4.1, §6): every lane has its own
W from a checkpoint of the parent, lanes run at the same time, the join records every
lane, and the next agent sees each lane's final checkpoint read-only — never merged."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_recovery import LANE_EVIDENCE_FAILPOINTS, assert_fired, failpoint_enabled

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = (REPO / "tests" / "system" / "data" / "lanes.py").read_text()


def lane(seconds: int) -> dict[str, Any]:
    """A lane's scripted agent: note when it starts, work ``seconds``, note when it ends."""
    return {
        "steps": [
            {
                "action": "run",
                "argv": [
                    "/bin/sh",
                    "-c",
                    f"date +%s.%N > started-{{prompt}}; sleep {seconds}; "
                    "date +%s.%N > ended-{prompt}",
                ],
            },
            {"action": "write", "path": "{prompt}.txt", "content": "lane {prompt}\n"},
        ],
        "output": {"text": "{prompt} done"},
    }


LANE = lane(4)
# Long enough that no lane can finish between the test seeing all of them started and the
# cancel reaching them, however loaded the machine (the cancel stops them, so it costs none).
CANCELLED_LANE = lane(120)
GATHER = {
    "steps": [
        {
            "action": "run",
            "argv": [
                "/bin/sh",
                "-c",
                "for d in /evidence/incoming/*/workspace; do "
                'ls "$d" | grep -v -e started -e ended -e README; done | sort > seen.txt; '
                "ls > parent.txt",
            ],
        },
    ],
    "output": {"text": "{prompt}"},
}


# Lane "bad" leaves a file in its W, then fails every attempt.
FAILING_LANE = {
    "steps": [
        {"action": "run",
         "argv": ["/bin/sh", "-c", "echo {prompt} > tried-{prompt}.txt; test {prompt} != bad"]},
        {"action": "write", "path": "{prompt}.txt", "content": "lane {prompt}\n"},
    ],
    "output": {"text": "{prompt} done"},
}
GATHER_UNFINISHED = {
    "steps": [
        *GATHER["steps"],
        {"action": "run", "argv": ["/bin/sh", "-c", "cat /evidence/incoming/root-1-bad-1/"
                                   "unfinished.md > unfinished.txt"]},
    ],
    "output": {"text": "{prompt}"},
}


def cairn(machine: Machine, *argv: str, user: str = "alice") -> str:
    return machine.exec(["cairn", *argv], user=user, timeout=120).stdout.decode()


def launch(
    machine: Machine, names: list[str], *extra: str, script: dict[str, Any] = LANE,
    gather: dict[str, Any] = GATHER,
) -> tuple[str, str]:
    project = "/home/alice/lanes"
    machine.exec(["mkdir", "-p", project], user="alice")
    machine.exec(["tee", f"{project}/README"], user="alice", input=b"parent\n")
    machine.exec(["tee", "/home/alice/lanes.py"], user="alice", input=WORKFLOW.encode())
    for name, agent in (("lane", script), ("gather", gather)):
        machine.exec(
            ["tee", f"/home/alice/{name}.json"], user="alice", input=json.dumps(agent).encode()
        )
    review = cairn(machine, "workflow", "review", "/home/alice/lanes.py")
    review_hash = review.strip().splitlines()[-1].split()[-1]
    run_id = cairn(
        machine,
        "launch",
        "/home/alice/lanes.py",
        "--confirm",
        review_hash,
        "--project",
        project,
        "--args",
        json.dumps({"lanes": names}),
        "--scripted",
        "test:lane=/home/alice/lane.json",
        "--scripted",
        "test:gather=/home/alice/gather.json",
        *extra,
    ).strip()
    return run_id, project


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json"))
    return data


def wait(machine: Machine, run_id: str, predicate: Any, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data = show(machine, run_id)
        if predicate(data):
            return data
        assert time.monotonic() < deadline, machine.journal(run_id=run_id)[-5000:]
        time.sleep(0.5)


def finished(data: dict[str, Any]) -> bool:
    return data["run"]["state"] in ("succeeded", "failed", "blocked", "cancelled")


def unit_starts(machine: Machine, run_id: str) -> dict[str, list[int]]:
    text = machine.exec(["journalctl", "--no-pager", "-o", "cat", "_PID=1"]).stdout.decode()
    starts: dict[str, list[int]] = {}
    for op, attempt in re.findall(
        rf"Started cairn-agent-{run_id}-([a-z0-9-]+?)-(\d+)\.service", text
    ):
        starts.setdefault(op, []).append(int(attempt))
    return starts


def check_result(machine: Machine, run_id: str, project: str, names: list[str]) -> dict[str, Any]:
    data = wait(machine, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"text": ",".join(sorted(names))}
    fork = next(o for o in data["operations"] if o["kind"] == "map")
    assert fork["state"] == "committed"
    # the parent's W never received a lane's file; the gathering agent saw every lane's
    parent = machine.exec(["cat", f"{project}/parent.txt"]).stdout.decode().split()
    assert parent == ["README", "parent.txt", "seen.txt"]
    seen = machine.exec(["cat", f"{project}/seen.txt"]).stdout.decode().split()
    assert seen == sorted(f"{n}.txt" for n in names)
    for name in names:
        assert machine.exec(["test", "-e", f"{project}/{name}.txt"], check=False).returncode == 1
    return data


def lane_checkpoints(machine: Machine, run_id: str, names: list[str]) -> dict[str, list[str]]:
    files = {}
    for name in names:
        path = f"/var/lib/cairn/pool/runs/{run_id}/checkpoints/root-1-{name}-1"
        ro = machine.exec(["btrfs", "property", "get", path, "ro"]).stdout.strip()
        assert ro == b"ro=true"
        files[name] = sorted(machine.exec(["ls", path]).stdout.decode().split())
    return files


def test_eight_lanes_have_their_own_workspace_and_run_together(machine: Machine) -> None:
    names = [f"l{i}" for i in range(1, 9)]
    run_id, project = launch(machine, names)
    check_result(machine, run_id, project, names)
    files = lane_checkpoints(machine, run_id, names)
    for name in names:  # each lane's S holds the parent's files and only its own
        assert files[name] == sorted(["README", f"{name}.txt", f"started-{name}", f"ended-{name}"])
    spans = {}
    for name in names:
        base = f"/var/lib/cairn/pool/runs/{run_id}/checkpoints/root-1-{name}-1"
        start = float(machine.exec(["cat", f"{base}/started-{name}"]).stdout)
        end = float(machine.exec(["cat", f"{base}/ended-{name}"]).stdout)
        spans[name] = (start, end)
    overlapping = [
        n for n in names if spans[n][0] < spans["l1"][1] and spans["l1"][0] < spans[n][1]
    ]
    assert len(overlapping) >= 4, spans  # l1 and at least three others at the same time
    assert unit_starts(machine, run_id) == {**{f"root-1-{n}-1": [1] for n in names}, "root-2": [1]}


def test_coordinator_killed_while_lanes_run(machine: Machine) -> None:
    names = ["a", "b", "c", "d"]
    run_id, project = launch(machine, names)
    wait(
        machine,
        run_id,
        lambda d: (
            sum(
                1
                for o in d["operations"]
                if o["scope"].startswith("root-1-") and o["state"] == "started"
            )
            == 4
        ),
        timeout=120,
    )
    machine.exec(["systemctl", "kill", "--signal=KILL", f"cairn-coordinator@{run_id}.service"])
    data = check_result(machine, run_id, project, names)
    assert unit_starts(machine, run_id) == {**{f"root-1-{n}-1": [1] for n in names}, "root-2": [1]}
    assert sum(1 for e in data["events"] if e["event"] == "lease-acquired") >= 2


@pytest.mark.parametrize("crash", [None, *sorted(LANE_EVIDENCE_FAILPOINTS)])
def test_a_failed_lane_keeps_its_unfinished_work_for_the_next_agent(
    machine: Machine, crash: str | None
) -> None:
    with failpoint_enabled(machine, crash) if crash else contextlib.nullcontext():
        run_id, project = launch(machine, ["a", "bad"], script=FAILING_LANE,
                                 gather=GATHER_UNFINISHED)
        data = wait(machine, run_id, finished)
    if crash:
        assert_fired(machine, run_id, crash)
    kept = [e for e in data["events"] if e["event"] == "lane-evidence-kept"]
    assert [e["op_id"] for e in kept] == ["root-1-bad-1"]
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"text": "a"}
    bad = next(o for o in data["operations"] if o["op_id"] == "root-1-bad-1")
    assert bad["state"] == "failed"
    # the last attempt's W, kept read-only as the failed operation's checkpoint
    path = f"/var/lib/cairn/pool/runs/{run_id}/checkpoints/root-1-bad-1"
    assert bad["checkpoint"]["s"]["path"] == path
    assert machine.exec(["btrfs", "property", "get", path, "ro"]).stdout.strip() == b"ro=true"
    assert sorted(machine.exec(["ls", path]).stdout.decode().split()) == [
        "README", "tried-bad.txt"]
    assert f"checkpoint {path} (read-only".encode() in machine.exec(
        ["cairn", "show", run_id], user="alice").stdout
    # the next agent saw it beside the lane that succeeded, and how it ended
    seen = machine.exec(["cat", f"{project}/seen.txt"]).stdout.decode().split()
    assert seen == ["a.txt", "tried-a.txt", "tried-bad.txt"]
    unfinished = machine.exec(["cat", f"{project}/unfinished.txt"]).stdout.decode()
    assert unfinished.startswith("Operation root-1-bad-1 did not finish (failed): "), unfinished
    # the parent's W got nothing of either lane
    assert machine.exec(["test", "-e", f"{project}/tried-bad.txt"], check=False).returncode == 1


def test_cancel_stops_every_running_lane(machine: Machine) -> None:
    names = ["a", "b", "c"]
    run_id, project = launch(machine, names, script=CANCELLED_LANE)
    wait(
        machine,
        run_id,
        lambda d: (
            sum(
                1
                for o in d["operations"]
                if o["scope"].startswith("root-1-") and o["state"] == "started"
            )
            == 3
        ),
        timeout=120,
    )
    # "started" is the agent's unit, not yet its first step: the cancel goes in once every
    # lane's agent has written into its W (so each kept W must show what it wrote)
    scopes = f"/var/lib/cairn/pool/runs/{run_id}/scopes"
    deadline = time.monotonic() + 120
    while True:
        found = machine.exec(["sh", "-c", f"ls {scopes}/root-1-*/W.*/ | grep -c '^started-'"],
                             check=False).stdout.decode().strip()
        if found == "3":
            break
        assert time.monotonic() < deadline, f"lanes' agents wrote {found} of 3 started files"
        time.sleep(1)
    cairn(machine, "cancel", "--yes", run_id)
    data = wait(machine, run_id, lambda d: d["run"]["state"] == "cancelled", timeout=120)
    lanes = [o for o in data["operations"] if o["scope"].startswith("root-1-")]
    assert sorted(o["state"] for o in lanes) == ["uncertain"] * 3
    # each stopped lane's W, kept read-only as its operation's checkpoint: the agent had
    # started, not ended
    kept = sorted((e["op_id"], e["data"]["state"]) for e in data["events"]
                  if e["event"] == "lane-evidence-kept")
    assert kept == sorted((o["op_id"], "cancelled") for o in lanes)
    for op in lanes:
        name = op["scope"].rsplit("-", 1)[1]
        path = f"/var/lib/cairn/pool/runs/{run_id}/checkpoints/{op['op_id']}"
        assert op["checkpoint"]["s"]["path"] == path
        assert machine.exec(["btrfs", "property", "get", path, "ro"]).stdout.strip() == \
            b"ro=true"
        assert sorted(machine.exec(["ls", path]).stdout.decode().split()) == [
            "README", f"started-{name}"]
    active = (
        machine.exec(
            [
                "systemctl",
                "list-units",
                "--plain",
                "--no-legend",
                "--state=active",
                f"cairn-agent-{run_id}*",
            ]
        )
        .stdout.decode()
        .strip()
    )
    assert active == ""
    assert machine.exec(["cat", f"{project}/README"]).stdout == b"parent\n"
    doctor = machine.exec(["cairn", "doctor", run_id], user="alice", check=False)
    assert doctor.returncode == 0, doctor.stdout.decode()
