"""People in the loop in a booted machine (ARCHITECTURE §10): questions that outlive the
coordinator, capability policy with approvals, and durable pause/resume/stop/cancel —
driven only through the cairn CLI, as alice and bob would."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

REPO = Path(__file__).resolve().parents[2]
NETWORKED = (REPO / "tests" / "system" / "data" / "networked.py").read_text()

ASK = '''"""Ask a person, then paint with the answer."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Choice(Model):
    colour: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


paint = agent(profile="test:paint", access="write", output=Step)


@workflow(description="Ask, then paint.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    choice = await flow.ask(f"Which colour for the {args.goal}?", schema=Choice)
    result = await flow.agent(paint, prompt=f"paint the {args.goal} {choice.colour}")
    step: Step = result.output
    return step
'''

TWO_STEPS = '''"""A slow first step, then a second one."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


slow = agent(profile="test:slow", access="write", output=Step)
fast = agent(profile="test:fast", access="write", output=Step)


@workflow(description="Two steps.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    a = await flow.agent(slow, prompt=args.goal)
    b = await flow.agent(fast, prompt=a.output.summary)
    step: Step = b.output
    return step
'''

SCRIPTS = {
    "paint": {"steps": [{"action": "write", "path": "colour.txt", "content": "{prompt}\n"}],
              "output": {"summary": "did: {prompt}"}},
    "slow": {"steps": [{"action": "sleep", "seconds": 6},
                       {"action": "write", "path": "slow.txt", "content": "{prompt}\n"}],
             "output": {"summary": "slow {prompt}"}},
    "fast": {"steps": [{"action": "write", "path": "fast.txt", "content": "{prompt}\n"}],
             "output": {"summary": "fast {prompt}"}},
    "fetch": {"steps": [{"action": "write", "path": "fetched.txt", "content": "{prompt}\n"}],
              "output": {"summary": "fetched {prompt}"}},
}
FINISHED = ("succeeded", "failed", "stopped", "cancelled")


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    """One machine for the module; every test works on its own runs and resets policy."""
    with Machine(deb, with_pool=True) as machine:
        for name, source in (("ask", ASK), ("two_steps", TWO_STEPS), ("networked", NETWORKED)):
            machine.exec(["tee", f"/home/alice/{name}.py"], user="alice",
                         input=source.encode())
        for name, script in SCRIPTS.items():
            machine.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                         input=json.dumps(script).encode())
        yield machine


@pytest.fixture
def machine(booted: Machine) -> Iterator[Machine]:
    yield booted
    booted.exec(["rm", "-f", "/etc/cairn/policy.toml"])


def cairn(machine: Machine, *argv: str, user: str = "alice",
          check: bool = True) -> Any:
    return machine.exec(["cairn", *argv], user=user, check=check, timeout=120)


def launch(machine: Machine, workflow: str, profiles: list[str], goal: str) -> str:
    path = f"/home/alice/{workflow}.py"
    review = cairn(machine, "workflow", "review", path).stdout.decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = f"/home/alice/p-{workflow}-{time.monotonic_ns()}"
    machine.exec(["mkdir", "-p", project], user="alice")
    scripted = [a for p in profiles for a in ("--scripted", f"test:{p}=/home/alice/{p}.json")]
    out = cairn(machine, "launch", path, "--confirm", review_hash, "--project", project,
                "--args", json.dumps({"goal": goal}), *scripted)
    return str(out.stdout.decode().strip().splitlines()[-1])


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    return dict(json.loads(cairn(machine, "show", run_id, "--json").stdout))


def wait_state(machine: Machine, run_id: str, states: tuple[str, ...],
               timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data = show(machine, run_id)
        if data["run"]["state"] in states:
            return data
        if time.monotonic() > deadline:
            pytest.fail(f"{run_id} stuck at {data['run']['state']}:\n"
                        + machine.journal(run_id=run_id)[-4000:])
        time.sleep(0.5)


def coordinator_active(machine: Machine, run_id: str) -> bool:
    out = machine.exec(["systemctl", "is-active", f"cairn-coordinator@{run_id}.service"],
                       check=False)
    return out.stdout.decode().strip() in ("active", "activating", "deactivating")


def wait_coordinator_gone(machine: Machine, run_id: str) -> None:
    """The run is marked waiting just before its coordinator exits; it must then be gone."""
    deadline = time.monotonic() + 15
    while coordinator_active(machine, run_id):
        assert time.monotonic() < deadline, f"the coordinator of {run_id} stays active"
        time.sleep(0.2)


def inbox(machine: Machine, user: str = "alice") -> list[dict[str, Any]]:
    return list(json.loads(cairn(machine, "inbox", "--json", user=user).stdout))


def doctor_clean(machine: Machine, run_id: str) -> None:
    out = cairn(machine, "doctor", run_id, "--json", check=False)
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["problems"] == 0, report


def set_policy(machine: Machine, text: str) -> None:
    machine.exec(["mkdir", "-p", "/etc/cairn"])
    machine.exec(["tee", "/etc/cairn/policy.toml"], input=text.encode())


def test_question_waits_without_a_coordinator_and_resumes_with_the_answer(
        machine: Machine) -> None:
    run_id = launch(machine, "ask", ["paint"], "shed")
    wait_state(machine, run_id, ("waiting",))
    wait_coordinator_gone(machine, run_id)
    time.sleep(3)  # nothing comes back by itself
    assert show(machine, run_id)["run"]["state"] == "waiting"
    assert not coordinator_active(machine, run_id)
    (item,) = [i for i in inbox(machine) if i["run_id"] == run_id]
    assert item["kind"] == "question" and item["question"] == "Which colour for the shed?"
    challenge = item["challenge"]
    assert [i for i in inbox(machine, "bob") if i["run_id"] == run_id] == []

    bob = cairn(machine, "answer", run_id, "--challenge", challenge, '{"colour": "blue"}',
                user="bob", check=False)
    assert bob.returncode != 0 and f"no run {run_id}" in bob.stderr.decode()
    stale = cairn(machine, "answer", run_id, "--challenge", "sha256:" + "0" * 64,
                  '{"colour": "red"}', check=False)
    assert stale.returncode != 0
    assert f"the current one is {challenge}" in stale.stderr.decode()
    invalid = cairn(machine, "answer", run_id, "--challenge", challenge, '{"colour": ""}',
                    check=False)
    assert invalid.returncode != 0 and "does not match Choice" in invalid.stderr.decode()

    machine.exec(["tee", "/home/alice/answer.json"], user="alice", input=b'{"colour": "red"}')
    out = cairn(machine, "answer", run_id, "--challenge", challenge, "--file",
                "/home/alice/answer.json")
    assert "answered" in out.stdout.decode()
    data = wait_state(machine, run_id, FINISHED)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "did: paint the shed red"}
    ask_op, paint_op = data["operations"]
    assert ask_op["kind"] == "ask" and ask_op["state"] == "committed"
    assert paint_op["request"]["prompt"] == "paint the shed red"
    project = data["run"]["project"]
    assert machine.exec(["cat", f"{project}/colour.txt"]).stdout == b"paint the shed red\n"

    again = cairn(machine, "answer", run_id, "--challenge", challenge, '{"colour":"red"}')
    assert "already has this answer" in again.stdout.decode()
    other = cairn(machine, "answer", run_id, "--challenge", challenge, '{"colour": "green"}',
                  check=False)
    assert other.returncode != 0 and "already answered" in other.stderr.decode()
    doctor_clean(machine, run_id)


def wait_approval(machine: Machine, run_id: str) -> dict[str, Any]:
    wait_state(machine, run_id, ("waiting",))
    wait_coordinator_gone(machine, run_id)
    (item,) = [i for i in inbox(machine) if i["run_id"] == run_id]
    assert item["kind"] == "approval"
    return item


def test_approval_rechecks_policy_and_has_exactly_one_winner(machine: Machine) -> None:
    set_policy(machine, '[capabilities]\n"network:host" = "require_approval"\n')
    run_id = launch(machine, "networked", ["fetch"], "news")
    item = wait_approval(machine, run_id)
    assert item["prepared"]["prompt"] == "news"
    assert item["evaluation"]["capabilities"]["network:host"] == "require_approval"
    req, fingerprint = item["request_id"], item["fingerprint"]

    bob = cairn(machine, "approve", run_id, req, "--fingerprint", fingerprint, user="bob",
                check=False)
    assert bob.returncode != 0 and f"no run {run_id}" in bob.stderr.decode()

    set_policy(machine, '[capabilities]\n"network:host" = "deny"\n')
    denied = cairn(machine, "approve", run_id, req, "--fingerprint", fingerprint, check=False)
    assert denied.returncode != 0 and "now denies network:host" in denied.stderr.decode()
    assert show(machine, run_id)["run"]["state"] == "waiting"

    set_policy(machine, '[capabilities]\n"network:host" = "require_approval"\n')
    results: list[Any] = []

    def approve() -> None:
        results.append(cairn(machine, "approve", run_id, req, "--fingerprint", fingerprint,
                             check=False))

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 1], [(r.stdout, r.stderr) for r in results]
    loser = next(r for r in results if r.returncode)
    assert "already answered" in loser.stderr.decode()

    data = wait_state(machine, run_id, FINISHED)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "fetched news"}
    approved = [e for e in data["events"] if e["event"] == "approval-approved"]
    assert len(approved) == 1 and approved[0]["data"]["actor_uid"] == 1001
    doctor_clean(machine, run_id)


def test_approval_past_its_deadline_is_refused_and_recorded_expired(machine: Machine) -> None:
    set_policy(machine, 'approval_deadline_sec = 2\n[capabilities]\n'
               '"network:host" = "require_approval"\n')
    run_id = launch(machine, "networked", ["fetch"], "late")
    item = wait_approval(machine, run_id)
    time.sleep(3)
    late = cairn(machine, "approve", run_id, item["request_id"], "--fingerprint",
                 item["fingerprint"], check=False)
    assert late.returncode != 0 and "recorded as expired" in late.stderr.decode()
    data = wait_state(machine, run_id, FINISHED)
    assert data["run"]["state"] == "failed"
    assert "expired" in data["run"]["error"] and "did not run" in data["run"]["error"]
    assert [o["state"] for o in data["operations"]] == ["not-started"]
    assert any(e["event"] == "approval-expired" for e in data["events"])
    assert not [u for u in data["units"] if "agent" in u]
    doctor_clean(machine, run_id)


def test_reject_means_the_operation_did_not_run(machine: Machine) -> None:
    set_policy(machine, '[capabilities]\n"network:host" = "require_approval"\n')
    run_id = launch(machine, "networked", ["fetch"], "nope")
    item = wait_approval(machine, run_id)
    cairn(machine, "reject", run_id, item["request_id"], "--reason", "not on this host")
    data = wait_state(machine, run_id, FINISHED)
    assert data["run"]["state"] == "failed" and "not on this host" in data["run"]["error"]
    assert not [u for u in data["units"] if "agent" in u]
    project = data["run"]["project"]
    assert machine.exec(["test", "-e", f"{project}/fetched.txt"], check=False).returncode != 0
    doctor_clean(machine, run_id)


def wait_first_agent(machine: Machine, run_id: str) -> None:
    deadline = time.monotonic() + 120
    while not any(op["state"] == "started" for op in show(machine, run_id)["operations"]):
        assert time.monotonic() < deadline, machine.journal(run_id=run_id)[-3000:]
        time.sleep(0.3)


def test_pause_then_resume(machine: Machine) -> None:
    run_id = launch(machine, "two_steps", ["slow", "fast"], "pr")
    wait_first_agent(machine, run_id)
    assert "pause requested" in cairn(machine, "pause", run_id).stdout.decode()
    data = wait_state(machine, run_id, ("paused", *FINISHED))
    assert data["run"]["state"] == "paused"
    assert [(o["op_id"], o["state"]) for o in data["operations"]] == [("root-1", "committed")]
    wait_coordinator_gone(machine, run_id)
    doctor_clean(machine, run_id)
    time.sleep(2)
    assert show(machine, run_id)["run"]["state"] == "paused"
    assert "resumed" in cairn(machine, "resume", run_id).stdout.decode()
    data = wait_state(machine, run_id, FINISHED)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    project = data["run"]["project"]
    assert machine.exec(["cat", f"{project}/fast.txt"]).stdout == b"slow pr\n"
    doctor_clean(machine, run_id)
    refused = cairn(machine, "pause", run_id, check=False)
    assert refused.returncode != 0 and "already succeeded" in refused.stderr.decode()


def test_stop_lets_the_running_agent_finish_and_starts_nothing_new(machine: Machine) -> None:
    run_id = launch(machine, "two_steps", ["slow", "fast"], "st")
    wait_first_agent(machine, run_id)
    cairn(machine, "stop", run_id)
    data = wait_state(machine, run_id, FINISHED)
    assert data["run"]["state"] == "stopped"
    ops = data["operations"]
    assert [(o["op_id"], o["state"]) for o in ops] == [("root-1", "committed")]
    assert ops[0]["checkpoint"] is not None  # the running agent finished its boundary
    assert len([u for u in data["units"] if "agent" in u]) == 1
    wait_coordinator_gone(machine, run_id)
    doctor_clean(machine, run_id)


def test_cancel_waiting_and_active_runs(machine: Machine) -> None:
    waiting = launch(machine, "ask", ["paint"], "door")
    wait_state(machine, waiting, ("waiting",))
    assert "cancelled" in cairn(machine, "cancel", "--yes", waiting).stdout.decode()
    data = show(machine, waiting)
    assert data["run"]["state"] == "cancelled"
    assert [o["state"] for o in data["operations"]] == ["not-started"]
    assert [i for i in inbox(machine) if i["run_id"] == waiting] == []
    doctor_clean(machine, waiting)

    active = launch(machine, "two_steps", ["slow", "fast"], "ca")
    wait_first_agent(machine, active)
    # a watcher in its own unit, as alice: it must print exactly one completion line
    machine.exec(["systemd-run", "--unit", f"watch-{active}", "--uid", "alice",
                  "-p", "StandardOutput=file:/tmp/watch.out", "cairn", "watch", active])
    cairn(machine, "cancel", "--yes", active)
    data = wait_state(machine, active, FINISHED)
    assert data["run"]["state"] == "cancelled"
    # the running agent was stopped, not waited for: its effects are uncertain
    assert [(o["op_id"], o["state"]) for o in data["operations"]] == [("root-1", "uncertain")]
    active_units = machine.exec(["systemctl", "list-units", "--plain", "--no-legend",
                                 "--state=active", f"cairn-agent-{active}*"]).stdout.strip()
    assert active_units == b""
    wait_coordinator_gone(machine, active)
    doctor_clean(machine, active)
    refused = cairn(machine, "resume", active, check=False)
    assert refused.returncode != 0 and "already cancelled" in refused.stderr.decode()

    deadline = time.monotonic() + 20
    while True:
        lines = machine.exec(["cat", "/tmp/watch.out"]).stdout.decode().splitlines()
        if lines and lines[-1].startswith(f"{active} cancelled"):
            break
        assert time.monotonic() < deadline, lines
        time.sleep(0.5)
    assert sum(1 for line in lines if line.startswith(active)) == 1
    assert any("cancel-requested" in line for line in lines)


def test_watch_reconnects_and_rebuilds_from_the_journal(machine: Machine) -> None:
    run_id = launch(machine, "ask", ["paint"], "gate")
    wait_state(machine, run_id, ("waiting",))
    (item,) = [i for i in inbox(machine) if i["run_id"] == run_id]
    cairn(machine, "answer", run_id, "--challenge", item["challenge"], '{"colour": "teal"}')
    wait_state(machine, run_id, FINISHED)
    # a new watcher, long after the launching terminal is gone, sees the whole history
    out = cairn(machine, "watch", run_id)
    lines = out.stdout.decode().splitlines()
    assert any("question-asked" in line for line in lines)
    assert any("question-answered" in line for line in lines)
    assert lines[-1] == f'{run_id} succeeded: {{"summary": "did: paint the gate teal"}}'
