"""One machine-wide admission for every launch, in a booted machine with the package
installed: many launches at once with a low limit in /etc/cairn/admission.toml all end
``succeeded``, never more than the limit hold a slot at once (read from the journal's
events), ``cairn list``/``show`` show ``queued`` runs with their place, a queued run is
cancelled, and a queued run survives a restart of cairnd and still starts."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from machine import TEST_USERS, Machine
from test_end_to_end import cairn, show

LAUNCHES = int(os.environ.get("CAIRN_ADMISSION_LAUNCHES", "64"))
LIMIT = 8
LAUNCHERS = 16  # `cairn launch` processes at once

# Read inside the machine, as root: every run's slot-holding interval from its events.
SLOT_INTERVALS = """
import json, sqlite3
db = sqlite3.connect("file:/var/lib/cairn/journal/journal.db?mode=ro", uri=True)
runs = {}
for run_id, event, at in db.execute(
    "SELECT run_id, event, at FROM events WHERE event IN ('run-created', 'run-queued',"
    " 'run-admitted', 'run-succeeded', 'run-failed', 'run-cancelled', 'run-stopped',"
    " 'run-waiting') ORDER BY cursor"):
    runs.setdefault(run_id, []).append((event, at))
state = {r: s for r, s in db.execute("SELECT run_id, state FROM runs")}
owner = {r: u for r, u in db.execute("SELECT run_id, owner_uid FROM runs")}
print(json.dumps({"events": runs, "state": state, "owner": owner}))
"""


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/etc/cairn/admission.toml"],
                     input=f"max_running_runs = {LIMIT}\n".encode())
        yield machine


def script(machine: Machine, user: str) -> str:
    """A scripted agent that finishes at once."""
    path = f"/home/{user}/agent-now.json"
    body = {"steps": [], "output": {"summary": "done"}, "handoff": ""}
    machine.exec(["tee", path], user=user, input=json.dumps(body).encode())
    return path


def launch(machine: Machine, user: str, agent: str) -> tuple[str, float, str]:
    """Launch builtin:implement on a new project; (run ID, seconds, what it said)."""
    project = f"/home/{user}/p-{secrets.token_hex(4)}"
    machine.exec(["mkdir", "-p", project], user=user)
    argv = ["cairn", "launch", "builtin:implement", "--project", project,
            "--args", json.dumps({"objective": "admission"}),
            "--scripted", f"builtin:implementer={agent}"]
    started = time.monotonic()
    proc = machine.exec(argv, user=user, timeout=300, check=False)
    took = time.monotonic() - started
    if proc.returncode != 0:
        pytest.fail(f"{user}'s launch failed: {proc.stderr.decode().strip()}\n"
                    f"the broker's log:\n{machine.journal('cairn-broker.service')[-6000:]}")
    return proc.stdout.decode().strip().splitlines()[-1], took, proc.stderr.decode()


def slot_intervals(machine: Machine) -> tuple[list[tuple[float, float]], dict[str, str]]:
    """(start, end) of every run's hold on a slot: from its launch (admitted at once) or
    its admission from the queue, to its end or its wait for a person."""
    data = json.loads(machine.exec(["python3", "-c", SLOT_INTERVALS]).stdout)
    intervals = []
    for events in data["events"].values():
        names = [e for e, _ in events]
        start_event = "run-admitted" if "run-queued" in names else "run-created"
        start = next((at for e, at in events if e == start_event), None)
        if start is None:  # still queued
            continue
        end = next((at for e, at in events if e not in
                    ("run-created", "run-queued", "run-admitted") and at >= start), None)
        intervals.append((start, end if end is not None else float("inf")))
    return intervals, data["state"]


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))
    held = most = 0
    for _, step in points:
        held += step
        most = max(most, held)
    return most


def wait_all_ended(machine: Machine, runs: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        _intervals, states = slot_intervals(machine)
        if all(states.get(r) in ("succeeded", "failed", "cancelled", "stopped") for r in runs):
            return states
        if time.monotonic() > deadline:
            left = {r: states.get(r) for r in runs if states.get(r) != "succeeded"}
            pytest.fail(f"runs not ended after {timeout}s: {left}")
        time.sleep(2)


def cancel_unended(machine: Machine) -> None:
    """Cancel every run a failed test left queued or running, so the next test starts on
    an idle machine."""
    data = json.loads(machine.exec(["python3", "-c", SLOT_INTERVALS]).stdout)
    user_of = {uid: name for name, uid in TEST_USERS.items()}
    for run_id, state in data["state"].items():
        if state in ("queued", "running", "waiting"):
            user = user_of[data["owner"][run_id]]
            machine.exec(["cairn", "cancel", "--yes", run_id], user=user, check=False)


@pytest.fixture
def idle_after(booted: Machine) -> Iterator[Machine]:
    yield booted
    cancel_unended(booted)


def test_many_launches_at_once_never_run_more_than_the_limit_and_all_succeed(
    idle_after: Machine,
) -> None:
    booted = idle_after
    agents = {user: script(booted, user) for user in ("alice", "bob")}
    users = ["alice", "bob"] * (LAUNCHES // 2)
    began = time.monotonic()
    with ThreadPoolExecutor(LAUNCHERS) as pool:
        launched = list(pool.map(lambda u: launch(booted, u, agents[u]), users))
    launching = time.monotonic() - began
    runs = [run_id for run_id, _took, _said in launched]
    assert len(set(runs)) == LAUNCHES and all(r.startswith("flow_") for r in runs)
    queued = [said for _r, _t, said in launched if "queued" in said]
    assert queued, "a launch over the limit says it is queued"
    assert "starts when a slot frees" in queued[0]

    states = wait_all_ended(booted, runs, timeout=60 * 20)
    ended = time.monotonic() - began
    assert {states[r] for r in runs} == {"succeeded"}
    intervals, _ = slot_intervals(booted)
    assert len(intervals) == LAUNCHES
    assert most_at_once(intervals) == LIMIT  # the limit was reached, never passed
    took = sorted(t for _r, t, _s in launched)
    print(f"\n{LAUNCHES} launches, {LAUNCHERS} at once, limit {LIMIT}: launching took "
          f"{launching:.1f}s, each launch median {took[len(took) // 2]:.2f}s, "
          f"max {took[-1]:.2f}s; all {LAUNCHES} ended after {ended:.1f}s")


def test_list_and_show_tell_a_queued_run_and_its_place_and_cancel_drops_it(
    booted: Machine,
) -> None:
    booted.exec(["tee", "/etc/cairn/admission.toml"], input=b"max_running_runs = 1\n")
    try:
        agent = f"/home/alice/agent-{secrets.token_hex(4)}.json"
        slow = {"steps": [{"action": "sleep", "seconds": 30}], "output": {"summary": "done"},
                "handoff": ""}
        booted.exec(["tee", agent], user="alice", input=json.dumps(slow).encode())
        holder, _took, _said = launch(booted, "alice", agent)
        first, took_first, said = launch(booted, "alice", agent)
        second, took_second, _said = launch(booted, "alice", agent)
        assert "queued (position 1)" in said
        print(f"\na queued launch on a machine at its limit returned in {took_first:.2f}s "
              f"and {took_second:.2f}s")
        listed = cairn(booted, "list").splitlines()
        # ID (a unique prefix of the run's hex digits), then STATE
        states = {run_id: row.split()[1] for row in listed[1:]
                  for run_id in (first, second) if run_id[5:].startswith(row.split()[0])}
        assert states == {first: "queued#1", second: "queued#2"}, listed
        data = show(booted, second)
        assert (data["run"]["state"], data["run"]["position"]) == ("queued", 2)
        assert "queued (position 2)" in cairn(booted, "show", second)

        # a queued run survives a restart of cairnd and still waits its turn
        booted.exec(["systemctl", "restart", "cairn.service"])
        assert show(booted, first)["run"]["state"] == "queued"

        assert cairn(booted, "cancel", "--yes", second).strip() == f"{second}: cancelled"
        cairn(booted, "cancel", "--yes", holder)
        deadline = time.monotonic() + 120
        while show(booted, first)["run"]["state"] == "queued":
            assert time.monotonic() < deadline, "the queued run never started"
            time.sleep(1)
        cairn(booted, "cancel", "--yes", first)
        assert show(booted, second)["run"]["state"] == "cancelled"
        events = [e["event"] for e in show(booted, second)["events"]]
        assert "run-admitted" not in events
    finally:
        booted.exec(["tee", "/etc/cairn/admission.toml"],
                    input=f"max_running_runs = {LIMIT}\n".encode())


def test_a_running_run_is_background_work(idle_after: Machine) -> None:
    """Every unit of a running run sits in cairn.slice and, where sessions share the CPU
    (this machine: systemd has no CPU controller), its session has the autogroup nice 19,
    so launches and people's shells keep their share while runs work."""
    booted = idle_after
    agent = f"/home/alice/agent-{secrets.token_hex(4)}.json"
    slow = {"steps": [{"action": "sleep", "seconds": 20}], "output": {"summary": "done"},
            "handoff": ""}
    booted.exec(["tee", agent], user="alice", input=json.dumps(slow).encode())
    run_id, _took, _said = launch(booted, "alice", agent)
    coordinator = f"cairn-coordinator@{run_id}.service"
    agent_unit = f"cairn-agent-{run_id}-root-1-1.service"
    deadline = time.monotonic() + 120
    while booted.exec(["systemctl", "is-active", agent_unit], check=False).returncode:
        assert time.monotonic() < deadline, f"{agent_unit} never started"
        time.sleep(0.5)
    autogroups = booted.exec(["cat", "/proc/sys/kernel/sched_autogroup_enabled"]).stdout
    for unit, slice_ in ((coordinator, "cairn.slice"), (agent_unit, "cairn-agents.slice")):
        shown = booted.exec(["systemctl", "show", "-p", "Slice", "-p", "MainPID", unit])
        props = dict(line.split("=", 1) for line in shown.stdout.decode().split())
        assert props["Slice"] == slice_, unit
        group = booted.exec(["cat", f"/proc/{props['MainPID']}/autogroup"]).stdout.decode()
        if autogroups.strip() == b"1":
            assert group.strip().endswith(" nice 19"), (unit, group)
    # The machine's own processes keep their share, after every run this machine started:
    # a unit's main process caught before its setsid() is still in PID 1's session.
    for unit in ("init.scope", "cairn.service", "cairn-broker.service", "dbus.service"):
        pid = "1" if unit == "init.scope" else booted.exec(
            ["systemctl", "show", "-p", "MainPID", "--value", unit]).stdout.decode().strip()
        group = booted.exec(["cat", f"/proc/{pid}/autogroup"]).stdout.decode()
        assert group.strip().endswith(" nice 0"), (unit, group)
    assert booted.exec(["systemctl", "show", "-p", "CPUWeight", "--value", "cairn.slice"]
                       ).stdout.decode().strip() == "20"
    cairn(booted, "cancel", "--yes", run_id)
