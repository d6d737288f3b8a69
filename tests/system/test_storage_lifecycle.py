"""Retention and reserves on a booted machine with a 2 GiB loop pool (docs/storage.md):
a nightly-like loop of runs under a policy of 5 keeps free space stable, `cairn rm` of a
running run is refused, `cairn show` of a deleted run still tells its history, a pool
filled to its reserve refuses the next launch in one line, and an agent writing past the
reserve is stopped."""

from __future__ import annotations

import json
from typing import Any

from machine import Machine
from test_end_to_end import (
    SCRIPT,
    cairn,
    finished,
    launch,
    make_project,
    show,
    wait_for,
    write_script,
)

POOL = "/var/lib/cairn/pool"
MIB = 1 << 20
BLOB_MIB = 16

# Each run replaces blob.bin with BLOB_MIB MiB of fresh random bytes (new extents in W,
# its checkpoint, P, C and F) and appends to the changelog.
BLOB_SCRIPT = {
    "steps": [
        {
            "action": "run",
            "argv": ["dd", "if=/dev/urandom", "of=blob.bin", "bs=1M", f"count={BLOB_MIB}",
                     "status=none"],
        },
        {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    ],
    "output": {"summary": "{prompt}"},
    "handoff": "wrote blob.bin",
}


def settled_free(machine: Machine) -> int:
    """The pool's free bytes once deleted subvolumes are cleaned up and committed."""
    machine.exec(["btrfs", "subvolume", "sync", POOL], timeout=300)
    machine.exec(["btrfs", "filesystem", "sync", POOL])
    avail, block = machine.exec(["stat", "-f", "-c", "%a %S", POOL]).stdout.decode().split()
    return int(avail) * int(block)


def set_policy(machine: Machine, text: str) -> None:
    machine.exec(["tee", "/etc/cairn/storage.toml"], input=text.encode())


def df(machine: Machine) -> dict[str, Any]:
    """``cairn storage df --all`` as root (the administrator's view)."""
    out = machine.exec(["cairn", "storage", "df", "--all", "--json"]).stdout
    data: dict[str, Any] = json.loads(out)
    return data


def test_a_loop_of_runs_under_retention_keeps_free_space_stable(machine: Machine) -> None:
    set_policy(machine, "keep_per_user = 5\n")
    project = make_project(machine)
    script = write_script(machine, BLOB_SCRIPT)
    runs: list[str] = []
    free_after: dict[int, int] = {}
    for night in range(1, 31):
        run_id = launch(machine, project, script, f"night {night}")
        data = wait_for(machine, run_id, finished, timeout=300)
        assert data["run"]["state"] == "succeeded", data["run"]["error"]
        runs.append(run_id)
        # What the timer does each night: cairn prune as root, by the host policy.
        machine.exec(["systemctl", "start", "cairn-retention.service"], timeout=300)
        if night in (10, 30):
            free_after[night] = settled_free(machine)

    held = [r["run_id"] for r in df(machine)["runs"]]
    assert sorted(held) == sorted(runs[-5:])
    # 20 more runs wrote 20 x 16 MiB; without retention free space would have fallen by
    # at least that much.
    drift = abs(free_after[30] - free_after[10])
    assert drift < 64 * MIB, (free_after, drift)
    oldest = show(machine, runs[0])
    assert oldest["storage"]["deleted"] is True and oldest["run"]["state"] == "succeeded"
    log = machine.journal(unit="cairn-retention.service")
    assert "deleted " + runs[0] in log, log[-3000:]


def test_rm_of_a_running_run_is_refused_in_one_line(machine: Machine) -> None:
    project = make_project(machine)
    script = json.loads(SCRIPT)
    script["steps"].insert(0, {"action": "sleep", "seconds": 60})
    run_id = launch(machine, project, write_script(machine, script), "slow")
    wait_for(machine, run_id, lambda d: any(o["state"] == "started" for o in d["operations"]))

    refused = machine.exec(["cairn", "rm", "--yes", run_id], user="alice", check=False)

    assert refused.returncode == 2
    lines = refused.stderr.decode().splitlines()
    assert lines[0] == (
        f"cairn: run {run_id} is kept: it is running; only finished runs are deleted"
    ), lines
    assert len(lines) == 2 and lines[1].startswith("hint: ")
    assert machine.exec(["test", "-d", f"{POOL}/runs/{run_id}/scopes/root/W.1"],
                        check=False).returncode == 0
    cairn(machine, "cancel", "--yes", run_id)
    wait_for(machine, run_id, finished, timeout=180)


def test_show_of_a_deleted_run_tells_its_history_and_that_its_storage_is_gone(
    machine: Machine,
) -> None:
    project = make_project(machine)
    run_id = launch(machine, project, write_script(machine, SCRIPT), "add an entry")
    before = wait_for(machine, run_id, finished)
    assert before["run"]["state"] == "succeeded", before["run"]["error"]
    checkpoint = before["operations"][0]["checkpoint"]["s"]["path"]

    # bob may neither see nor delete it
    other = machine.exec(["cairn", "rm", "--yes", run_id], user="bob", check=False)
    assert other.returncode != 0 and f"no run {run_id}" in other.stderr.decode()

    out = cairn(machine, "rm", "--yes", run_id)
    assert out.startswith(f"deleted {run_id} (") and "subvolumes)" in out
    assert machine.exec(["test", "-e", f"{POOL}/runs/{run_id}"], check=False).returncode != 0
    assert machine.exec(["test", "-e", checkpoint], check=False).returncode != 0
    listed = machine.exec(["btrfs", "subvolume", "list", POOL]).stdout.decode()
    assert run_id not in listed

    after = show(machine, run_id)
    assert after["storage"]["deleted"] is True and after["storage"]["subvolumes"] >= 4
    assert after["run"]["state"] == "succeeded"
    assert [o["state"] for o in after["operations"]] == ["committed"]
    assert after["settlement"]["status"] == "applied"
    text = cairn(machine, "show", run_id)
    assert "storage: deleted" in text and "(deleted)" in text
    assert "+- add an entry" in cairn(machine, "diff", run_id)
    assert "ok" in cairn(machine, "doctor", run_id)
    assert cairn(machine, "rm", "--yes", run_id).strip() == f"{run_id}: storage already gone"


def test_a_pool_filled_to_its_reserve_refuses_the_next_launch(machine: Machine) -> None:
    set_policy(machine, 'reserve = "256M"\n')
    project = make_project(machine)
    script = write_script(machine, SCRIPT)
    free = settled_free(machine)
    machine.exec(["fallocate", "-l", str(free - 128 * MIB), f"{POOL}/filler"])
    assert settled_free(machine) < 256 * MIB

    refused = machine.exec(
        ["cairn", "launch", "builtin:implement", "--project", project,
         "--args", json.dumps({"objective": "x"}),
         "--scripted", f"builtin:implementer={script}"],
        user="alice", check=False,
    )

    assert refused.returncode == 1
    first = refused.stderr.decode().splitlines()[0]
    assert first.startswith(f"cairn: launch refused: storage pool {POOL} has "), first
    assert "MiB free, below the reserve of 256 MiB" in first
    assert "delete finished runs with 'cairn prune'" in first
    assert json.loads(cairn(machine, "ps", "--json")) == []  # no run was recorded

    machine.exec(["rm", f"{POOL}/filler"])
    settled_free(machine)
    run_id = launch(machine, project, script, "after the filler")
    assert wait_for(machine, run_id, finished)["run"]["state"] == "succeeded"


def test_checkpoints_lists_each_snapshot_with_its_operation_then_says_it_is_deleted(
    machine: Machine,
) -> None:
    project = make_project(machine)
    run_id = launch(machine, project, write_script(machine, SCRIPT), "checkpoint me")
    before = wait_for(machine, run_id, finished)
    assert before["run"]["state"] == "succeeded", before["run"]["error"]
    s = before["operations"][0]["checkpoint"]["s"]

    listed = json.loads(cairn(machine, "checkpoints", run_id, "--json"))
    (only,) = listed["checkpoints"]
    assert (only["op_id"], only["kind"], only["scope"], only["op_state"]) == (
        before["operations"][0]["op_id"], "agent", "root", "committed")
    assert (only["path"], only["uuid"], only["deleted"]) == (s["path"], s["uuid"], False)
    assert only["exclusive"] is None or only["exclusive"] > 0
    text = cairn(machine, "checkpoints", run_id)
    assert s["path"] in text and ("unknown" in text or "iB" in text)

    other = machine.exec(["cairn", "checkpoints", run_id], user="bob", check=False)
    assert other.returncode != 0 and f"no run {run_id}" in other.stderr.decode()

    cairn(machine, "rm", "--yes", run_id)
    gone = json.loads(cairn(machine, "checkpoints", run_id, "--json"))
    assert gone["storage"]["deleted"] is True
    assert [(c["path"], c["deleted"], c["exclusive"]) for c in gone["checkpoints"]] == [
        (s["path"], True, None)]
    assert "storage deleted" in cairn(machine, "checkpoints", run_id)


CHANGE_THEN_FILL = '''"""Two agents: a small change, then one that fills the pool."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


first = agent(profile="test:first", access="write", output=Step)
fill = agent(profile="test:fill", access="write", output=Step)


@workflow(description="Change, then fill.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    await flow.agent(first, prompt=f"note {args.goal}")
    result = await flow.agent(fill, prompt="fill the pool")
    step: Step = result.output
    return step
'''
FIRST = {"steps": [{"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"}],
         "output": {"summary": "{prompt}"}, "handoff": "noted"}
# 16 MiB at a time, each written through, until ENOSPC (its coordinator stops it first).
FILL = {"steps": [{"action": "run", "argv": ["sh", "-c",
                                             "i=0; while dd if=/dev/urandom of=fill.$i bs=1M "
                                             "count=16 conv=fsync status=none; do i=$((i+1)); "
                                             "done; echo dd=$?"]}],
        "output": {"summary": "filled"}, "handoff": "filled"}


def test_an_agent_writing_past_the_reserve_is_stopped_and_its_run_fails_in_one_line(
    machine: Machine,
) -> None:
    set_policy(machine, 'reserve = "256M"\n')
    project = make_project(machine)
    machine.exec(["tee", "/home/alice/fill.py"], user="alice", input=CHANGE_THEN_FILL.encode())
    for name, scripted in (("first", FIRST), ("fill", FILL)):
        machine.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                     input=json.dumps(scripted).encode())
    review = cairn(machine, "workflow", "review", "/home/alice/fill.py")
    review_hash = review.strip().splitlines()[-1].split()[-1]
    run_id = cairn(machine, "launch", "/home/alice/fill.py", "--confirm", review_hash,
                   "--project", project, "--args", '{"goal": "g"}',
                   "--scripted", "test:first=/home/alice/first.json",
                   "--scripted", "test:fill=/home/alice/fill.json").strip().splitlines()[-1]
    data = wait_for(machine, run_id, finished, timeout=600)

    assert data["run"]["state"] == "failed"
    error = data["run"]["error"]
    # its coordinator stopped the agent once the pool fell below the reserve
    assert error.startswith(f"pool full: agent root-2 stopped: storage pool {POOL} has "), error
    assert "below the reserve of 256 MiB" in error and "\n" not in error
    ops = {op["op_id"]: op for op in data["operations"]}
    assert ops["root-1"]["state"] == "committed" and ops["root-1"]["checkpoint"]
    assert ops["root-2"]["state"] == "failed"
    assert machine.exec(["cat", f"{project}/CHANGELOG.md"]).stdout == b"# Changelog\n"
    free = settled_free(machine)
    print(f"free once the agent was stopped: {free // MIB} MiB")
    # stopped within half the reserve of crossing it, though the agent writes ~150 MiB/s
    # and Btrfs's statfs moves by whole data chunks (208 MiB on this pool)
    assert free > 128 * MIB
    integrity = machine.exec(["python3", "-c", (
        "import sqlite3; print(sqlite3.connect('/var/lib/cairn/journal/journal.db')"
        ".execute('PRAGMA integrity_check').fetchone()[0])")]).stdout.decode().strip()
    assert integrity == "ok"
    doctor = machine.exec(["cairn", "doctor", run_id, "--json"], user="alice", check=False)
    (checked,) = json.loads(doctor.stdout)["runs"]
    assert doctor.returncode == 0 and checked["problems"] == [], checked

    # The failed run may go and its space comes back.
    cairn(machine, "rm", "--yes", run_id)
    assert settled_free(machine) > 1024 * MIB
    script = write_script(machine, SCRIPT)
    after = launch(machine, project, script, "after the full pool")
    assert wait_for(machine, after, finished)["run"]["state"] == "succeeded"
