"""Effects that may have reached outside are never retried silently (ARCHITECTURE §5):
the run blocks, and only a person's `cairn reconcile` or `cairn retry` moves it on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from machine import Machine

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = (REPO / "tests" / "system" / "data" / "networked.py").read_text()
SCRIPT = {
    "steps": [{"action": "write", "path": "fetched.txt", "content": "{prompt}\n"}],
    "output": {"summary": "fetched {prompt}"},
}


def cairn(machine: Machine, *argv: str, user: str = "alice", check: bool = True) -> Any:
    return machine.exec(["cairn", *argv], user=user, check=check, timeout=120)


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json").stdout)
    return data


def wait_state(machine: Machine, run_id: str, states: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while True:
        data = show(machine, run_id)
        if data["run"]["state"] in states:
            return data
        assert time.monotonic() < deadline, machine.journal(run_id=run_id)[-4000:]
        time.sleep(0.5)


def start_blocked_run(machine: Machine) -> tuple[str, str]:
    project = "/home/alice/net"
    machine.exec(["mkdir", "-p", project], user="alice")
    machine.exec(["tee", "/home/alice/networked.py"], user="alice", input=WORKFLOW.encode())
    machine.exec(["tee", "/home/alice/fetch.json"], user="alice",
                 input=json.dumps(SCRIPT).encode())
    for unit in ("cairn-coordinator@.service", "cairn-broker.service"):
        machine.exec(["mkdir", "-p", f"/etc/systemd/system/{unit}.d"])
        machine.exec(["tee", f"/etc/systemd/system/{unit}.d/failpoint.conf"],
                     input=b"[Service]\nEnvironment=CAIRN_FAILPOINTS=agent-before-finish\n")
    machine.exec(["systemctl", "daemon-reload"])
    machine.exec(["systemctl", "stop", "cairn-broker.service"])
    review = cairn(machine, "workflow", "review", "/home/alice/networked.py").stdout.decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    run_id = cairn(machine, "launch", "/home/alice/networked.py", "--confirm", review_hash,
                   "--project", project, "--args", '{"goal": "news"}',
                   "--scripted", "test:fetch=/home/alice/fetch.json").stdout.decode().strip()
    data = wait_state(machine, run_id, ("blocked", "succeeded", "failed"))
    assert data["run"]["state"] == "blocked", data["run"]
    (op,) = data["operations"]
    assert op["state"] == "uncertain" and op["attempt"] == 1
    assert "cairn reconcile" in data["run"]["error"] or "reconcile" in data["run"]["error"]
    return run_id, project


def test_uncertain_op_waits_for_reconcile_with_the_real_result(machine: Machine) -> None:
    run_id, project = start_blocked_run(machine)
    # nothing happens by itself: no coordinator, no second attempt
    time.sleep(5)
    data = show(machine, run_id)
    assert data["run"]["state"] == "blocked"
    assert [u for u in data["units"] if "agent" in u] == [
        f"cairn-agent-{run_id}-root-1-1.service"]
    # only the owner decides; a result must match the output schema
    denied = cairn(machine, "reconcile", run_id, "root-1", "--no-effect", user="bob", check=False)
    assert denied.returncode != 0 and f"no run {run_id}" in denied.stderr.decode()
    machine.exec(["tee", "/home/alice/bad.json"], user="alice", input=b'{"summary": ""}')
    bad = cairn(machine, "reconcile", run_id, "root-1", "--result", "/home/alice/bad.json",
                check=False)
    assert bad.returncode != 0 and "does not match Report" in bad.stderr.decode()
    machine.exec(["tee", "/home/alice/real.json"], user="alice",
                 input=b'{"output": {"summary": "fetched by hand"}, "handoff": "checked"}')
    cairn(machine, "reconcile", run_id, "root-1", "--result", "/home/alice/real.json")
    data = wait_state(machine, run_id, ("succeeded", "failed", "blocked"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "fetched by hand"}
    assert any(e["event"] == "op-result-decided" for e in data["events"])
    again = cairn(machine, "retry", run_id, "root-1", check=False)
    assert again.returncode != 0 and "only an uncertain operation" in again.stderr.decode()


def test_retry_decision_runs_a_new_attempt(machine: Machine) -> None:
    run_id, project = start_blocked_run(machine)
    cairn(machine, "retry", run_id, "root-1")
    data = wait_state(machine, run_id, ("succeeded", "failed", "blocked"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["operations"][0]["attempt"] == 2
    assert data["run"]["output"] == {"summary": "fetched news"}
    assert machine.exec(["cat", f"{project}/fetched.txt"]).stdout == b"news\n"
