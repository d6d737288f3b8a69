"""`cairn diff` shows every change as git does, and `cairn rm` returns the space before it
says done, in one booted machine: new (empty too), deleted, mode-only files and links in
the patch; a pool filled past its reserve, emptied by `cairn rm`, takes the very next
launch; a deletion Btrfs still reclaims is named in the refusal instead of `cairn prune`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn
from test_escapes import fresh_project, run_script

POOL = "/var/lib/cairn/pool"
MIB = 1 << 20


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/etc/cairn/storage.toml"], input=b'reserve = "256M"\n')
        yield machine


def launch_refused(machine: Machine, project: str) -> tuple[int, str]:
    script = "/home/alice/noop.json"
    machine.exec(["tee", script], user="alice", input=json.dumps(
        {"steps": [], "output": {"summary": "x"}, "handoff": "x"}).encode())
    refused = machine.exec(["cairn", "launch", "builtin:implement", "--project", project,
                            "--args", '{"objective": "x"}',
                            "--scripted", f"builtin:implementer={script}"],
                           user="alice", check=False)
    return refused.returncode, refused.stderr.decode()


def free_now(machine: Machine) -> int:
    """The pool's free bytes as a launch sees them: no sync, no wait."""
    avail, block = machine.exec(["stat", "-f", "-c", "%a %S", POOL]).stdout.decode().split()
    return int(avail) * int(block)


def test_diff_shows_new_empty_deleted_mode_only_and_link_changes(booted: Machine) -> None:
    steps: list[dict[str, Any]] = [
        {"action": "write", "path": "src/__init__.py", "content": ""},
        {"action": "delete", "path": "src/pkg/lib.py"},
        {"action": "chmod", "path": "src/app.py", "mode": 0o755},
        {"action": "symlink", "path": "current", "target": "src/app.py"},
        {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    ]
    _, run_id, data = run_script(booted, steps, "every kind")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]

    patch = cairn(booted, "diff", run_id, "--patch")

    assert "diff --git a/src/__init__.py b/src/__init__.py\nnew file mode 100644\n" in patch
    assert ("diff --git a/src/pkg/lib.py b/src/pkg/lib.py\ndeleted file mode 100644\n"
            "--- a/src/pkg/lib.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-X = 1\n") in patch
    assert "diff --git a/src/app.py b/src/app.py\nold mode 100644\nnew mode 100755\n" in patch
    assert ("diff --git a/current b/current\nnew file mode 120000\n--- /dev/null\n"
            "+++ b/current\n@@ -0,0 +1 @@\n+src/app.py\n\\ No newline at end of file\n") in patch
    assert "+- every kind\n" in patch
    # git applies the patch: the project as it was, plus the patch, is the proposal
    work = Path(tempfile.mkdtemp(prefix="cairn-diff-space."))
    try:
        for name, text in (("CHANGELOG.md", "# Changelog\n"), ("src/app.py", "print('hi')\n"),
                           ("src/pkg/lib.py", "X = 1\n")):
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(text)
        subprocess.run(["git", "apply", "-"], cwd=work, input=patch.encode(), check=True)
        assert os.readlink(work / "current") == "src/app.py"
        assert (work / "src" / "app.py").stat().st_mode & 0o777 == 0o755
        assert (work / "src" / "__init__.py").read_bytes() == b""
        assert not (work / "src" / "pkg" / "lib.py").exists()
        assert (work / "CHANGELOG.md").read_text() == "# Changelog\n- every kind\n"
    finally:
        shutil.rmtree(work)


def test_rm_of_the_run_that_filled_the_pool_lets_the_next_launch_in_at_once(
    booted: Machine,
) -> None:
    free = free_now(booted)
    fill_mib = (free - 128 * MIB) // MIB
    steps = [{"action": "run", "argv": ["dd", "if=/dev/zero", "of=fill.bin", "bs=1M",
                                        f"count={fill_mib}", "status=none"]}]
    project, run_id, data = run_script(booted, steps, "fill", timeout=600)
    # the agent is stopped once the pool crosses its reserve ("pool full"); either way the
    # run's W holds the filler until the run is removed
    assert data["run"]["state"] == "succeeded" or (
        data["run"]["state"] == "failed" and "pool full" in data["run"]["error"]
    ), data["run"]["error"]
    # the live project (not on the pool) may hold the filler too: the run's copies stay
    booted.exec(["rm", "-f", f"{project}/fill.bin"], user="alice")
    booted.exec(["btrfs", "filesystem", "sync", POOL])
    assert free_now(booted) < 256 * MIB
    code, err = launch_refused(booted, project)
    assert code == 1 and "delete finished runs with 'cairn prune'" in err, err

    out = cairn(booted, "rm", "--yes", run_id)

    assert out.startswith(f"deleted {run_id} (") and "space reclaimed: the pool has " in out, out
    assert free_now(booted) > 512 * MIB  # no sync, no wait: the space is back already
    _, after, data = run_script(booted, [{"action": "append", "path": "CHANGELOG.md",
                                          "content": "- {prompt}\n"}], "right after rm")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]


def test_a_launch_while_btrfs_still_reclaims_says_to_retry_not_to_prune(booted: Machine) -> None:
    # A long commit interval keeps the cleaner asleep after a deletion no one waits for.
    booted.exec(["mount", "-o", "remount,commit=300", POOL])
    try:
        free = free_now(booted)
        booted.exec(["btrfs", "subvolume", "create", f"{POOL}/scratch"])
        booted.exec(["fallocate", "-l", str(free - 128 * MIB), f"{POOL}/scratch/blob"])
        booted.exec(["btrfs", "filesystem", "sync", POOL])
        booted.exec(["btrfs", "subvolume", "delete", f"{POOL}/scratch"])
        project = fresh_project(booted)

        code, err = launch_refused(booted, project)

        first = err.splitlines()[0]
        assert code == 1, err
        assert first.startswith(f"cairn: launch refused: storage pool {POOL} has "), first
        assert ("while Btrfs still reclaims the space of 1 deleted subvolume(s); try again "
                "in a few seconds") in first
        assert "prune" not in first
    finally:
        booted.exec(["mount", "-o", "remount,commit=30", POOL])
        booted.exec(["btrfs", "subvolume", "sync", POOL], timeout=300)
