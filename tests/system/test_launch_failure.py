"""A launch is all or nothing, on a booted machine: a launch the broker cannot serve
leaves its run ``failed`` with the reason, and nothing starts it later — not the broker
coming back, not cairnd's boot reconciler."""

from __future__ import annotations

import json
import time

from machine import Machine
from test_end_to_end import SCRIPT, make_project, show, write_script


def sh(machine: Machine, *argv: str, check: bool = True) -> str:
    return machine.exec(list(argv), check=check, timeout=180).stdout.decode().strip()


def test_a_launch_with_the_broker_down_fails_and_never_starts(machine: Machine) -> None:
    project = make_project(machine)
    script = write_script(machine, SCRIPT)
    # Nobody answers on the broker socket (the file stays; connecting is refused).
    sh(machine, "systemctl", "stop", "cairn-broker.socket", "cairn-broker.service")

    launched = machine.exec(
        ["cairn", "launch", "builtin:implement", "--project", project,
         "--args", json.dumps({"objective": "x"}),
         "--scripted", f"builtin:implementer={script}"],
        user="alice", check=False, timeout=180,
    )
    stderr = launched.stderr.decode()
    assert launched.returncode == 1, stderr
    assert "cannot reach the broker" in stderr
    assert "is recorded failed and will not start" in stderr

    (listed,) = json.loads(machine.exec(["cairn", "ps", "--json"], user="alice").stdout)
    run_id = listed["run_id"]
    run = show(machine, run_id)["run"]
    assert run["state"] == "failed"
    assert run["error"].startswith("the launch could not start the run: cannot reach the broker")

    # The broker comes back and cairnd restarts (its boot reconciler runs).
    sh(machine, "systemctl", "start", "cairn-broker.socket")
    sh(machine, "systemctl", "restart", "cairn.service")
    assert json.loads(machine.exec(["cairn", "ps", "--json"], user="alice").stdout)
    sh(machine, "systemctl", "restart", "cairn-broker.socket")
    time.sleep(5)  # room for a wrongly started coordinator to show up

    assert show(machine, run_id)["run"]["state"] == "failed"
    coordinator = f"cairn-coordinator@{run_id}.service"
    # never started: no invocation, nothing in its journal
    assert sh(machine, "systemctl", "show", "--value", "-p", "InvocationID", coordinator) == ""
    assert sh(machine, "systemctl", "is-active", coordinator, check=False) == "inactive"
    assert "coordinator-started" not in machine.journal(run_id=run_id)
    assert "reconciled" not in [e["event"] for e in show(machine, run_id)["events"]]
    # cancel of an ended run says so
    cancelled = machine.exec(["cairn", "cancel", "--yes", run_id], user="alice", check=False)
    assert cancelled.returncode != 0
    assert f"{run_id} already failed" in cancelled.stderr.decode()
