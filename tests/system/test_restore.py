"""``flow.restore`` in a booted machine: the example of docs/writing-workflows.md, with a
scripted implementer whose second session overwrites the first one's work and a scripted
reviewer that calls it worse. The run restores W to the first boundary: the project gets
the first session's file, a new W generation made once from that checkpoint, also when
the coordinator is killed inside the restore."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import Machine
from test_end_to_end import cairn
from test_escapes import fresh_project, tree
from test_recovery import RESTORE_FAILPOINTS, assert_fired, failpoint_enabled, wait_finished

REPO = Path(__file__).resolve().parents[2]
GUIDE = (REPO / "docs" / "writing-workflows.md").read_text()
(EXAMPLE,) = [b for b in re.findall(r"```python\n(.*?)```", GUIDE, re.DOTALL)
              if "flow.restore(" in b]
IMPLEMENTER = {"steps": [{"action": "write", "path": "impl.txt", "content": "{prompt}\n"}],
               "output": {"summary": "wrote {prompt}"}, "handoff": "impl.txt"}
REVIEWER = {"steps": [], "output": {"summary": "worse"}, "handoff": "read it"}


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/home/alice/restore.py"], user="alice", input=EXAMPLE.encode())
        for name, script in (("implementer", IMPLEMENTER), ("reviewer", REVIEWER)):
            machine.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                         input=json.dumps(script).encode())
        yield machine


def launch(machine: Machine) -> tuple[str, str]:
    review = cairn(machine, "workflow", "review", "/home/alice/restore.py")
    assert "restore" in review.splitlines()[-2]  # capabilities
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = fresh_project(machine, "alice")
    out = cairn(machine, "launch", "/home/alice/restore.py", "--confirm", review_hash,
                "--project", project, "--arg", "objective=the first way",
                "--scripted", "builtin:implementer=/home/alice/implementer.json",
                "--scripted", "builtin:reviewer=/home/alice/reviewer.json")
    return project, out.strip().splitlines()[-1]


def check_restored(machine: Machine, project: str, run_id: str) -> None:
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "wrote the first way",
                                     "kept": "the implementation"}
    ops = {o["op_id"]: o for o in data["operations"]}
    assert [ops[f"root-{n}"]["kind"] for n in range(1, 5)] == [
        "agent", "agent", "agent", "restore"]
    assert ops["root-4"]["state"] == "committed"
    # the project got the first session's file; the refactor's never reached it
    assert machine.exec(["cat", f"{project}/impl.txt"]).stdout == b"the first way\n"
    # W is a new generation made from root-1's checkpoint, made once
    pool = f"/var/lib/cairn/pool/runs/{run_id}"
    assert machine.exec(["test", "-e", f"{pool}/scopes/root/W.1"], check=False).returncode != 0
    first, detour = (tree(machine, f"{pool}/checkpoints/root-{n}") for n in (1, 2))
    assert tree(machine, f"{pool}/scopes/root/W.2") == first != detour
    receipts = machine.exec(
        ["python3", "-c", "import sqlite3, sys; print([r[0] for r in sqlite3.connect("
         "sys.argv[1]).execute('SELECT intent_id FROM receipts WHERE run_id=? AND kind=?',"
         " (sys.argv[2], 'create-w'))])", "/var/lib/cairn/broker/receipts.db", run_id],
    ).stdout.decode().strip()
    assert receipts == "['create-w.root.1', 'create-w.root.2']"


def test_a_run_goes_back_to_its_first_boundary(booted: Machine) -> None:
    project, run_id = launch(booted)
    check_restored(booted, project, run_id)


@pytest.mark.parametrize("name", sorted(RESTORE_FAILPOINTS))
def test_a_coordinator_killed_inside_a_restore_makes_the_same_w(
    booted: Machine, name: str
) -> None:
    with failpoint_enabled(booted, name):
        project, run_id = launch(booted)
        check_restored(booted, project, run_id)
    assert_fired(booted, run_id, name)
    data = wait_finished(booted, run_id)
    assert sum(1 for e in data["events"] if e["event"] == "lease-acquired") >= 2
