"""`cairn replay SOURCE --through OP` in a booted machine (ARCHITECTURE §12): a new run
imports the source's root boundary (operations committed with provenance, checkpoints
reminted as its own subvolumes), runs the rest fresh and settles into the live project;
the source run is untouched. And what is refused: another user's run, an operation
inside a lane, a run whose storage was deleted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_lanes
from machine import Machine
from test_recovery import check_run, launch, prepare, unit_starts


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        yield machine


def cairn(machine: Machine, *argv: str, user: str = "alice") -> str:
    return machine.exec(["cairn", *argv], user=user, timeout=120).stdout.decode()


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json"))
    return data


def subvolume_uuid(machine: Machine, path: str) -> str:
    out = machine.exec(["btrfs", "subvolume", "show", path]).stdout.decode()
    (uuid,) = [line.split()[-1] for line in out.splitlines()
               if line.strip().startswith("UUID:")]
    return uuid


def refused(machine: Machine, *argv: str, user: str = "alice") -> str:
    proc = machine.exec(["cairn", *argv], user=user, check=False, timeout=120)
    assert proc.returncode != 0, proc.stdout.decode()
    return proc.stderr.decode()


def test_replay_through_the_second_agent_imports_two_and_runs_the_third_fresh(
    booted: Machine,
) -> None:
    project, args = prepare(booted)
    source = launch(booted, project, args)
    check_run(booted, source, project)
    # The source's changes are taken back, so the replay's own result is what reaches the
    # live project (its Q is the source's Q).
    assert json.loads(cairn(booted, "revert", "--yes", source, "--json"))["status"] == "applied"
    assert booted.exec(["cat", f"{project}/log.txt"]).stdout.decode() == "start\n"
    source_before = show(booted, source)

    out = json.loads(cairn(booted, "replay", source, "--through", "root-2", "--json"))
    assert out["source_run"] == source and out["imported"] == ["root-1", "root-2"]
    new = out["run_id"]
    assert new != source
    data = check_run(booted, new, project)  # output and live files as a whole run's

    assert data["replayed_from"] == {"run_id": source, "through": "root-2", "imported": 2}
    ops = {o["op_id"]: o for o in data["operations"]}
    assert sorted(ops) == ["root-1", "root-2", "root-3"]
    assert all(o["state"] == "committed" for o in ops.values())
    assert ops["root-1"]["imported_from"] == {"run_id": source, "op_id": "root-1"}
    assert ops["root-2"]["imported_from"] == {"run_id": source, "op_id": "root-2"}
    assert ops["root-3"]["imported_from"] is None
    assert unit_starts(booted, new) == {"root-3": [1]}  # only the third agent ran again
    assert data["settlement"]["status"] == "applied"
    text = cairn(booted, "show", new)
    assert f"replayed from {source} through root-2 (2 operations imported" in text
    assert f"imported from {source} root-1" in text

    pool = "/var/lib/cairn/pool/runs"
    for name in ("Q", "checkpoints/root-1", "checkpoints/root-2"):
        mine = subvolume_uuid(booted, f"{pool}/{new}/{name}")
        theirs = subvolume_uuid(booted, f"{pool}/{source}/{name}")
        assert mine != theirs, name
    listed = json.loads(cairn(booted, "checkpoints", new, "--json"))["checkpoints"]
    assert sorted((c["op_id"], c["reminted"]) for c in listed) == [
        ("root-1", True), ("root-2", True), ("root-3", False)]
    assert show(booted, source) == source_before  # the source run is untouched
    # Every reminted snapshot is explained by the new run's receipts, and the live project
    # holds what it applied.
    doctor = booted.exec(["cairn", "doctor", new], user="alice", check=False, timeout=180)
    assert doctor.returncode == 0, doctor.stdout.decode()

    # The new run's snapshots are its own: deleting the source's storage leaves them, and
    # the source can no longer be replayed.
    cairn(booted, "rm", "--yes", source)
    for name in ("Q", "checkpoints/root-1", "checkpoints/root-2"):
        booted.exec(["btrfs", "subvolume", "show", f"{pool}/{new}/{name}"])
    err = refused(booted, "replay", source, "--through", "root-2")
    assert f"the storage of {source} was deleted (cairn rm)" in err
    assert "launch the workflow again instead" in err


def test_another_user_cannot_replay_a_run_and_a_lane_is_never_chosen_alone(
    booted: Machine,
) -> None:
    run_id, project = test_lanes.launch(booted, ["a", "b"])
    data = test_lanes.check_result(booted, run_id, project, ["a", "b"])
    runs_before = {r["run_id"] for r in json.loads(cairn(booted, "list", "--json"))}

    err = refused(booted, "replay", run_id, "--through", "root-1", user="bob")
    assert f"no run {run_id}" in err

    fork = next(o for o in data["operations"] if o["kind"] == "map")
    lane_op = next(o for o in data["operations"] if o["scope"] != "root")
    err = refused(booted, "replay", run_id, "--through", lane_op["op_id"])
    assert f"{lane_op['op_id']} is inside a lane; a lane cannot be replayed without its " \
        f"siblings and join (replay through its fork {fork['op_id']})" in err
    err = refused(booted, "replay", run_id, "--through", "root-9")
    assert f"run {run_id} has no operation root-9" in err
    after = {r["run_id"] for r in json.loads(cairn(booted, "list", "--json"))}
    assert after == runs_before  # nothing was recorded


def test_replay_through_a_fork_imports_every_lane_and_runs_the_join_after_it(
    booted: Machine,
) -> None:
    # The lanes' project is shared with the test before: what its run applied goes, so
    # the gathering agent sees only this run's lane files.
    booted.exec(["rm", "-f", "/home/alice/lanes/parent.txt", "/home/alice/lanes/seen.txt"],
                user="alice")
    run_id, project = test_lanes.launch(booted, ["c", "d"])
    data = test_lanes.check_result(booted, run_id, project, ["c", "d"])
    fork = next(o for o in data["operations"] if o["kind"] == "map")
    lanes = sorted(o["op_id"] for o in data["operations"] if o["scope"] != "root")

    out = json.loads(cairn(booted, "replay", run_id, "--through", fork["op_id"], "--json"))
    assert sorted(out["imported"]) == sorted([fork["op_id"], *lanes])
    replayed = test_lanes.check_result(booted, out["run_id"], project, ["c", "d"])
    fresh = [o["op_id"] for o in replayed["operations"] if o["imported_from"] is None]
    assert fresh == [o["op_id"] for o in data["operations"]
                     if o["scope"] == "root" and o["kind"] == "agent"]
    assert list(unit_starts(booted, out["run_id"])) == fresh
