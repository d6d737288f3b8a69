"""The four authorities cross-checked, and fencing of a coordinator that lost its lease."""

from __future__ import annotations

import json
import time

import pytest
from machine import Machine
from test_recovery import check_run, launch, prepare, script, unit_starts


def test_doctor_reports_missing_and_foreign_snapshots(machine: Machine) -> None:
    project, args = prepare(machine)
    run_id = launch(machine, project, args)
    check_run(machine, run_id, project)
    clean = machine.exec(["cairn", "doctor", run_id], user="alice", check=False)
    assert clean.returncode == 0, clean.stdout.decode()

    checkpoint = f"/var/lib/cairn/pool/runs/{run_id}/checkpoints/root-2"
    machine.exec(["btrfs", "property", "set", checkpoint, "ro", "false"])
    machine.exec(["btrfs", "subvolume", "delete", checkpoint])
    missing = machine.exec(["cairn", "doctor", run_id], user="alice", check=False)
    assert missing.returncode == 1
    assert f"missing subvolume {checkpoint}" in missing.stdout.decode()

    machine.exec(["btrfs", "subvolume", "create", checkpoint])  # same path, another subvolume
    foreign = machine.exec(["cairn", "doctor", run_id, "--json"], user="alice", check=False)
    assert foreign.returncode == 1
    (report,) = json.loads(foreign.stdout)["runs"]
    assert any(p.startswith(f"foreign subvolume at {checkpoint}") for p in report["problems"])


JOURNAL_IS_FREE = (
    "import sqlite3; db = sqlite3.connect('/var/lib/cairn/journal/journal.db',"
    " timeout=0, isolation_level=None); db.execute('BEGIN IMMEDIATE'); db.execute('ROLLBACK')"
)


def freeze_outside_a_transaction(machine: Machine, unit: str) -> None:
    """SIGSTOP the unit's coordinator at a moment it holds no journal write lock: stopped
    inside a transaction it would block every writer (see the test below for what the
    second coordinator then says), which is not the fencing this file tests."""
    for _ in range(50):
        machine.exec(["systemctl", "kill", "--kill-whom=main", "--signal=SIGSTOP", unit])
        probe = ["runuser", "-u", "cairn", "--", "python3", "-c", JOURNAL_IS_FREE]
        if machine.exec(probe, check=False).returncode == 0:
            return
        machine.exec(["systemctl", "kill", "--kill-whom=main", "--signal=SIGCONT", unit])
        time.sleep(0.05)
    raise AssertionError(f"{unit} held the journal's write lock at 50 tries")


@pytest.mark.clock  # waits out a lease
def test_fenced_coordinator_cannot_commit(machine: Machine) -> None:
    project, args = prepare(machine)
    machine.exec(
        ["tee", "/home/alice/second.json"],
        user="alice",
        input=json.dumps(script("second", sleep=75)).encode(),
    )
    run_id = launch(machine, project, args)
    unit = f"cairn-coordinator@{run_id}.service"
    deadline = time.monotonic() + 120
    while True:
        data = json.loads(machine.exec(["cairn", "show", run_id, "--json"], user="alice").stdout)
        if any(o["op_id"] == "root-2" and o["state"] == "started" for o in data["operations"]):
            break
        assert time.monotonic() < deadline
        time.sleep(0.3)
    freeze_outside_a_transaction(machine, unit)
    coordinator = ["/usr/libexec/cairn/cairn-coordinator", run_id]
    second = machine.exec(["runuser", "-u", "cairn", "--", *coordinator], check=False, timeout=60)
    assert second.returncode == 0 and "is held by" in second.stderr.decode()
    time.sleep(65)  # the stopped coordinator's lease runs out
    machine.exec(["systemd-run", "--unit=cairn-takeover", "-p", "User=cairn", *coordinator])
    time.sleep(5)
    machine.exec(["systemctl", "kill", "--kill-whom=main", "--signal=SIGCONT", unit])
    data = check_run(machine, run_id, project)
    tokens = [e["data"]["token"] for e in data["events"] if e["event"] == "lease-acquired"]
    assert tokens == sorted(tokens) and len(tokens) >= 2
    assert unit_starts(machine, run_id) == {"root-1": [1], "root-2": [1], "root-3": [1]}
    fenced = machine.journal(unit=unit)
    assert "lease" in fenced and ("lost" in fenced or "fenced" in fenced), fenced[-3000:]
