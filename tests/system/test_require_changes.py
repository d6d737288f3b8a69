"""Whether a write agent changed anything, seen by root at its boundary: an agent that
edits did, one that only reads (and touches) did not and ``cairn show`` says so, and
``flow.agent(..., require_changes=True)`` turns none into OperationFailed of kind
``no-changes``, which the workflow handles."""

from __future__ import annotations

import json
from pathlib import Path

from machine import Machine
from test_model_agents import PROJECT
from test_recovery import wait_finished

REPO = Path(__file__).resolve().parents[2]
EDITOR = {"steps": [{"action": "write", "path": "NOTES.md", "content": "{prompt}\n"}],
          "output": {"summary": "wrote NOTES.md"}, "handoff": ""}
# reads every file and touches one: file times only, no change
READER = {"steps": [{"action": "run", "argv": [
    "/bin/sh", "-c", "cat NOTES.md app.py > /dev/null && touch app.py && "
    "mkdir scratch && rmdir scratch"]}], "output": {"summary": "read it"}, "handoff": ""}


def test_a_write_agent_that_changed_nothing_is_seen_and_can_be_refused(
    machine: Machine,
) -> None:
    machine.exec(["mkdir", "-p", PROJECT], user="alice")
    machine.exec(["tee", f"{PROJECT}/app.py"], user="alice", input=b"print('hi')\n")
    for name, body in (("editor", EDITOR), ("reader", READER)):
        machine.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                     input=json.dumps(body).encode())
    path = "/home/alice/require_changes.py"
    machine.exec(["tee", path], user="alice",
                 input=(REPO / "tests/system/data/require_changes.py").read_bytes())
    review = machine.exec(["cairn", "workflow", "review", path], user="alice").stdout.decode()
    out = machine.exec(
        ["cairn", "launch", path, "--confirm", review.strip().splitlines()[-1].split()[-1],
         "--project", PROJECT, "--args", json.dumps({"goal": "notes"}),
         "--scripted", "test:editor=/home/alice/editor.json",
         "--scripted", "test:reader=/home/alice/reader.json"], user="alice")
    run_id = out.stdout.decode().strip().splitlines()[-1]
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"edited": "wrote NOTES.md", "required": "no-changes",
                                     "optional": "read it"}
    edited, required, optional = data["operations"]
    assert edited["checkpoint"]["changed"] is True
    assert (required["state"], required["checkpoint"]["changed"]) == ("failed", False)
    assert "changed nothing" in required["error"]
    assert (optional["state"], optional["checkpoint"]["changed"]) == ("committed", False)
    shown = machine.exec(["cairn", "show", run_id], user="alice").stdout.decode()
    lines = [line for line in shown.splitlines() if "checkpoint" in line]
    assert [", no changes" in line for line in lines] == [False, True, True], shown
    # the editor's change is the run's, settled into the project
    assert machine.exec(["cat", f"{PROJECT}/NOTES.md"]).stdout == b"notes\n"
