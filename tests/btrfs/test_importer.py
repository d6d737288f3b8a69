"""Importing a project into a staging subvolume."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cairn import proc
from cairn.importer import Progress, copy_tree
from cairn.progress import PROGRESS_FILE
from cairn.progress_relay import read_report
from cairn.settle.inventory import inventories_equal
from cairn.storage import Pool

pytestmark = pytest.mark.btrfs
REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def make_project(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "m.py").write_text("m\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o750)
    (root / "private").write_text("p\n")
    os.chmod(root / "private", 0o600)
    os.symlink("src/pkg/m.py", root / "link")
    os.symlink("/does/not/exist", root / "dangling")
    (root / "empty" / "nested-empty").mkdir(parents=True)
    (root / "readonly-dir").mkdir()
    (root / "readonly-dir" / "f").write_text("f\n")
    os.chmod(root / "readonly-dir", 0o555)
    os.setxattr(root / "src" / "pkg" / "m.py", "user.origin", b"test")
    (root / "hard-a").write_text("shared\n")
    os.link(root / "hard-a", root / "hard-b")
    os.mkfifo(root / "fifo")
    os.utime(root / "private", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))


def test_copy_preserves_the_tree(pool: Pool, run_id: str, btrfs_mount: Path) -> None:
    src = btrfs_mount / f"src-{run_id}"
    src.mkdir()
    make_project(src)
    dst = pool.q_import_path(run_id)
    pool.create_subvolume(dst)
    seen: list[Progress] = []
    stats = copy_tree(src, dst, progress=seen.append)
    assert stats.skipped_special == 1 and stats.skipped[0].path == "fifo"
    assert stats.hardlinks == 1 and stats.symlinks == 2 and stats.unreadable == 0
    assert seen and seen[-1].bytes_done == stats.bytes == seen[-1].bytes_total
    os.unlink(src / "fifo")
    assert inventories_equal(src, dst)  # names, types, modes, owners, bytes, xattrs
    assert os.readlink(dst / "dangling") == "/does/not/exist"
    assert os.stat(dst / "hard-a").st_ino == os.stat(dst / "hard-b").st_ino
    assert os.stat(dst / "private").st_mtime_ns == os.stat(src / "private").st_mtime_ns
    assert stat.S_IMODE(os.stat(dst / "readonly-dir").st_mode) == 0o555
    assert (dst / "empty" / "nested-empty").is_dir()
    # a snapshot of the staging subvolume is the run's Q
    q = pool.snapshot(dst, pool.q_path(run_id), read_only=True)
    assert inventories_equal(dst, Path(q.path))
    os.chmod(src / "readonly-dir", 0o755)


def test_import_as_owner_reports_what_it_cannot_read(
    pool: Pool, run_id: str, btrfs_mount: Path
) -> None:
    src = btrfs_mount / f"src-{run_id}"
    src.mkdir()
    (src / "mine.txt").write_text("mine\n")
    (src / "root-only.txt").write_text("secret\n")
    os.chmod(src / "root-only.txt", 0o600)
    (src / "closed").mkdir()
    (src / "closed" / "inside").write_text("x\n")
    os.chmod(src / "closed", 0o700)
    for path in (src, src / "mine.txt"):
        os.chown(path, NOBODY, NOBODY)
    dst = pool.q_import_path(run_id)
    pool.create_subvolume(dst, owner=(NOBODY, NOBODY))
    out = proc.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         os.environ.get("CAIRN_TEST_PYTHON", str(REPO / ".venv/bin/python")),
         "-m", "cairn.importer", src, dst],
        env={"PYTHONPATH": str(REPO)}, cwd="/",
    )
    stats = json.loads(out.stdout)
    assert stats["files"] == 1 and stats["unreadable"] == 2
    assert {s["path"] for s in stats["skipped"]} == {"root-only.txt", "closed"}
    assert (dst / "mine.txt").read_text() == "mine\n"
    assert not (dst / "root-only.txt").exists()  # not copied as an empty file
    assert not (dst / "closed").exists()  # not copied as an empty directory
    assert b"imported" in out.stderr


def test_refuses_a_non_empty_destination(pool: Pool, run_id: str, btrfs_mount: Path) -> None:
    from cairn.errors import UsageError

    dst = pool.q_import_path(run_id)
    pool.create_subvolume(dst)
    (dst / "x").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        copy_tree(btrfs_mount, dst)


class StepClock:
    """Each read is ``step`` seconds after the one before: a copy that takes that long
    per entry, without waiting for it."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_import_reports_progress_at_least_once_a_second(
    pool: Pool, run_id: str, btrfs_mount: Path
) -> None:
    """3,000 entries at 2 ms each take 6 s of the injected clock: reports come every
    half second of it (never two within one), each of the counted totals."""
    src = btrfs_mount / f"src-{run_id}"
    for d in range(30):
        (src / f"d{d}").mkdir(parents=True)
        for f in range(99):
            (src / f"d{d}" / f"f{f}").write_bytes(b"x" * f)
    dst = pool.q_import_path(run_id)
    pool.create_subvolume(dst)
    clock = StepClock(0.002)
    seen: list[tuple[float, Progress]] = []
    copy_tree(src, dst, progress=lambda r: seen.append((clock.now, r)), clock=clock)
    times = [at for at, _ in seen]
    assert len(seen) >= 11
    assert all(0.5 <= b - a <= 1.0 for a, b in zip(times, times[1:-1], strict=False))
    assert all(r.total == 3000 and r.bytes_total == 30 * sum(range(99)) for _, r in seen)
    assert seen[-1][1].done == 3000 and seen[-1][1].bytes_done == 30 * sum(range(99))


def test_the_import_helper_keeps_a_progress_file(
    pool: Pool, run_id: str, btrfs_mount: Path, tmp_path: Path
) -> None:
    src = btrfs_mount / f"src-{run_id}"
    src.mkdir()
    make_project(src)
    os.unlink(src / "fifo")
    dst = pool.q_import_path(run_id)
    pool.create_subvolume(dst)
    progress = tmp_path / "progress"
    progress.mkdir()
    proc.run(
        [os.environ.get("CAIRN_TEST_PYTHON", str(REPO / ".venv/bin/python")),
         "-m", "cairn.importer", src, dst, "--progress", progress],
        env={"PYTHONPATH": str(REPO)}, cwd="/", timeout=120,
    )
    assert os.listdir(progress) == [PROGRESS_FILE]
    final = read_report(progress, os.geteuid())
    assert final is not None and final.done == final.total and final.total > 10
    os.chmod(src / "readonly-dir", 0o755)
