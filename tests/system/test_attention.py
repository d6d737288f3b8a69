"""Attention goes to a person (issue 27), in one booted machine: an approval nobody
answers expires at its deadline by cairnd's timer alone and the workflow receives the
rejection and finishes; a ``blocked`` run runs alice's notification hook with the run,
its state and the command to run next, and ``cairn inbox`` lists it with that command.

Needs a package that installs units/user/ (cairn-notify.path enabled for every user
manager).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

REPO = Path(__file__).resolve().parents[2]
NETWORKED = (REPO / "tests" / "system" / "data" / "networked.py").read_text()
FETCH = {"steps": [{"action": "write", "path": "fetched.txt", "content": "{prompt}\n"}],
         "output": {"summary": "fetched {prompt}"}}
APPROVE = '''"""Ask for a release approval that expires after a minute; report the decision."""

from typing import Any

from cairn.workflow import Field, Model, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Report(Model):
    summary: str = Field(min_length=1)


@workflow(description="Approve, then report.", input=Goal, output=Report)
async def run(flow: Any, args: Goal) -> Report:
    decision = await flow.approve(f"Ship {args.goal}?", expires_in=60, on_expiry="reject")
    return Report(summary=f"{decision.approved} {decision.outcome}: {decision.reason}")
'''
HOOKS = "/home/alice/.config/cairn/notify.d"
RECORD = """#!/bin/sh
cat > "/home/alice/notified-$CAIRN_NOTIFY_EVENT-$CAIRN_RUN.json"
"""


@pytest.fixture(scope="module")
def machine(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as booted:
        booted.enable_user_manager("alice")
        booted.exec(["tee", "/home/alice/approve.py"], user="alice", input=APPROVE.encode())
        booted.exec(["tee", "/home/alice/networked.py"], user="alice",
                    input=NETWORKED.encode())
        booted.exec(["tee", "/home/alice/fetch.json"], user="alice",
                    input=json.dumps(FETCH).encode())
        booted.exec(["mkdir", "-p", HOOKS], user="alice")
        booted.exec(["tee", f"{HOOKS}/record"], user="alice", input=RECORD.encode())
        booted.exec(["chmod", "0755", f"{HOOKS}/record"], user="alice")
        wait_until("cairn-notify.service", lambda: booted.exec(
            ["systemctl", "--user", "is-active", "cairn-notify.service"], user="alice",
            check=False).stdout.decode().strip() == "active")
        wait_until("the notifier's cursor", lambda: read(
            booted, "/home/alice/.local/state/cairn/notify-cursor"))
        yield booted


def cairn(machine: Machine, *argv: str, check: bool = True) -> str:
    return machine.exec(["cairn", *argv], user="alice", check=check, timeout=120).stdout.decode()


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    return dict(json.loads(cairn(machine, "show", run_id, "--json")))


def read(machine: Machine, path: str) -> str | None:
    out = machine.exec(["cat", path], check=False)
    return out.stdout.decode() if out.returncode == 0 else None


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 180,
               explain: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}" + (f"\n{explain()}" if explain else ""))
        time.sleep(0.5)


def launch(machine: Machine, path: str, *extra: str) -> str:
    review = cairn(machine, "workflow", "review", path)
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = f"/home/alice/p-{time.monotonic_ns()}"
    machine.exec(["mkdir", "-p", project], user="alice")
    out = cairn(machine, "launch", path, "--confirm", review_hash, "--project", project,
                "--args", json.dumps({"goal": "1.2"}), *extra)
    return out.strip().splitlines()[-1]


@pytest.mark.clock  # waits out the approval's deadline
def test_an_unanswered_approval_expires_and_the_workflow_finishes(machine: Machine) -> None:
    run_id = launch(machine, "/home/alice/approve.py")
    asked = time.monotonic()
    wait_until("the run to wait", lambda: show(machine, run_id)["run"]["state"] == "waiting",
               explain=lambda: machine.journal(run_id=run_id)[-3000:])
    inbox = cairn(machine, "inbox")
    assert f"{run_id} root-1-approval approval: Ship 1.2?" in inbox
    assert f"cairn approve {run_id} root-1-approval --fingerprint sha256:" in inbox
    raw = wait_until("the waiting notification",
                     lambda: read(machine, f"/home/alice/notified-waiting-{run_id}.json"))
    (item,) = json.loads(raw)["waiting"]
    assert item["kind"] == "approval" and item["question"] == "Ship 1.2?"
    assert item["command"].startswith(f"cairn approve {run_id} root-1-approval --fingerprint")
    # nobody runs anything: cairnd's timer expires the request and wakes the run
    done = wait_until("the run to finish after the expiry",
                      lambda: show(machine, run_id)["run"]["state"] == "succeeded" or None,
                      timeout=150, explain=lambda: machine.journal(run_id=run_id)[-3000:])
    assert done
    elapsed = time.monotonic() - asked
    data = show(machine, run_id)
    summary = data["run"]["output"]["summary"]
    assert summary.startswith("False expired: no decision before the deadline"), summary
    assert 55 <= elapsed <= 120, elapsed
    assert "nothing waits for you" in cairn(machine, "inbox") or run_id not in cairn(
        machine, "inbox")
    print(f"approval expired and run finished {elapsed:.1f} s after it was asked")


def test_a_blocked_run_notifies_and_is_in_the_inbox(machine: Machine) -> None:
    for unit in ("cairn-coordinator@.service", "cairn-broker.service"):
        machine.exec(["mkdir", "-p", f"/etc/systemd/system/{unit}.d"])
        machine.exec(["tee", f"/etc/systemd/system/{unit}.d/failpoint.conf"],
                     input=b"[Service]\nEnvironment=CAIRN_FAILPOINTS=agent-before-finish\n")
    machine.exec(["systemctl", "daemon-reload"])
    machine.exec(["systemctl", "stop", "cairn-broker.service"])
    run_id = launch(machine, "/home/alice/networked.py",
                    "--scripted", "test:fetch=/home/alice/fetch.json")
    wait_until("the run to block", lambda: show(machine, run_id)["run"]["state"] in (
        "blocked", "failed", "succeeded"), explain=lambda: machine.journal(run_id=run_id)[-3000:])
    assert show(machine, run_id)["run"]["state"] == "blocked"
    command = f"cairn reconcile {run_id} root-1 --no-effect"
    raw = wait_until("the blocked notification",
                     lambda: read(machine, f"/home/alice/notified-blocked-{run_id}.json"))
    event = json.loads(raw)
    assert event["event"] == "blocked" and event["run_id"] == run_id
    assert event["state"] == "blocked"
    (item,) = event["waiting"]
    assert item["kind"] == "blocked" and item["op_id"] == "root-1"
    assert item["command"] == command
    assert f"cairn retry {run_id} root-1" in item["commands"]
    assert f"next: {command}" in event["summary"]
    inbox = cairn(machine, "inbox")
    assert f"{run_id} root-1 blocked: " in inbox and f"  {command}" in inbox
    (listed,) = [i for i in json.loads(cairn(machine, "inbox", "--json"))
                 if i["run_id"] == run_id]
    assert listed["kind"] == "blocked" and listed["commands"][0] == command
    cairn(machine, "cancel", "--yes", run_id)
