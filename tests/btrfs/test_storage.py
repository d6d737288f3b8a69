"""Pool operations on a real loop-mounted Btrfs."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import btrfsutil
import pytest

from cairn import hostcheck, proc, retention
from cairn.errors import StorageError, UsageError
from cairn.settle.inventory import inventories_equal
from cairn.storage import (
    Pool,
    containing_subvolume,
    content_changed,
    is_same_filesystem,
    run_qgroup_name,
)
from cairn.storage_init import init_loop_pool, remove_loop_pool

pytestmark = pytest.mark.btrfs


def populate(w: Path) -> None:
    (w / "src").mkdir()
    (w / "src" / "main.py").write_text("print('hi')\n")
    (w / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(w / "run.sh", 0o755)
    (w / "secret").write_text("s")
    os.chmod(w / "secret", 0o600)
    os.symlink("src/main.py", w / "link")
    os.symlink("nowhere", w / "dangling")
    (w / "empty").mkdir()
    (w / "build").mkdir()
    (w / "build" / "out.o").write_bytes(b"\x7fELF" + bytes(100))
    (w / ".gitignore").write_text("build/\n*.log\n")
    (w / "debug.log").write_text("ignored but kept\n")


def test_checkpoint_holds_exactly_w_and_w_continues(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    populate(w)
    s = pool.checkpoint_path(run_id, "op-1")
    rec = pool.snapshot(w, s, read_only=True)
    assert rec.read_only and rec.fsid == pool.fsid
    assert inventories_equal(w, s)
    assert stat.S_IMODE(os.lstat(s / "run.sh").st_mode) == 0o755
    assert os.readlink(s / "link") == "src/main.py"
    assert (s / "empty").is_dir() and not any((s / "empty").iterdir())
    assert (s / "build" / "out.o").exists() and (s / "debug.log").exists()

    (w / "src" / "main.py").write_text("changed\n")
    (w / "new").write_text("after the boundary\n")
    assert (s / "src" / "main.py").read_text() == "print('hi')\n"
    assert not (s / "new").exists()
    assert not inventories_equal(w, s)
    with pytest.raises(OSError, match="Read-only file system") as exc:
        (s / "src" / "main.py").write_text("x")
    assert exc.value.errno == errno.EROFS
    pool.verify(w, pool.receipt(w))  # W is still the same subvolume after S


def test_forked_lanes_do_not_see_each_other(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    populate(w)
    fork = pool.checkpoint_path(run_id, "fork-1")
    pool.snapshot(w, fork, read_only=True)
    a = pool.snapshot(fork, pool.w_path(run_id, "lane-a", 0), read_only=False)
    b = pool.snapshot(fork, pool.w_path(run_id, "lane-b", 0), read_only=False)
    assert a.uuid != b.uuid and not a.read_only
    (Path(a.path) / "only-a").write_text("a")
    (Path(b.path) / "src" / "main.py").write_text("b")
    assert not (Path(b.path) / "only-a").exists()
    assert (Path(a.path) / "src" / "main.py").read_text() == "print('hi')\n"
    assert (w / "src" / "main.py").read_text() == "print('hi')\n"


def test_snapshot_is_idempotent_and_refuses_a_foreign_destination(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    q = pool.q_path(run_id)
    first = pool.snapshot(w, q, read_only=True)
    again = pool.snapshot(w, q, read_only=True)
    assert again.uuid == first.uuid
    with pytest.raises(StorageError, match="not a snapshot"):
        pool.snapshot(w, q, read_only=False)
    other = pool.settlement_path(run_id, "C")
    pool.create_subvolume(other)
    with pytest.raises(StorageError, match="not a snapshot"):
        pool.snapshot(w, other, read_only=False)
    assert pool.create_subvolume(other).uuid == pool.receipt(other).uuid


def test_delete_refuses_a_path_whose_uuid_changed(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    s = pool.checkpoint_path(run_id, "op-1")
    old = pool.snapshot(w, s, read_only=True)
    pool.delete(s, old)
    assert not s.exists()
    pool.delete(s, old)  # already gone: done
    replacement = pool.snapshot(w, s, read_only=True)
    assert replacement.uuid != old.uuid
    with pytest.raises(StorageError, match="no longer the recorded subvolume"):
        pool.delete(s, old)
    with pytest.raises(StorageError):
        pool.verify(s, old)
    assert s.exists()
    pool.delete(s, replacement)
    assert not s.exists()


def test_delete_run_removes_every_subvolume_including_nested(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    populate(w)
    btrfsutil.create_subvolume(os.fspath(w / "nested"))  # an agent may make one
    pool.snapshot(w, pool.q_path(run_id), read_only=True)
    pool.snapshot(w, pool.checkpoint_path(run_id, "op-1"), read_only=True)
    pool.snapshot(w, pool.settlement_path(run_id, "P"), read_only=True)
    pool.snapshot(pool.q_path(run_id), pool.w_path(run_id, "root", 1), read_only=False)
    subs = pool.run_subvolumes(run_id)
    assert len(subs) == 5
    deleted = pool.delete_run(run_id)
    assert len(deleted) == 5
    assert not pool.run_dir(run_id).exists()


def test_open_refuses_a_directory_not_on_btrfs() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        if proc.run(["stat", "-f", "-c", "%T", d]).stdout.strip() == b"btrfs":
            pytest.skip("/var/tmp is on Btrfs here")
        with pytest.raises(StorageError, match="is not on Btrfs") as exc:
            Pool.open(Path(d))
        assert exc.value.hint and "storage init --loop" in exc.value.hint


def test_layout_and_names(pool: Pool, run_id: str) -> None:
    assert pool.q_path(run_id) == pool.root / "runs" / run_id / "Q"
    assert pool.w_path(run_id, "s1", 3).name == "W.3"
    assert pool.settlement_path(run_id, "F").name == "F"
    with pytest.raises(UsageError):
        pool.checkpoint_path(run_id, "../escape")
    assert run_qgroup_name(run_id).startswith("1/")


def test_containing_subvolume_and_same_filesystem(pool: Pool, btrfs_mount: Path) -> None:
    home = pool.root / "home"
    pool.create_subvolume(home)
    project = home / "alice" / "proj"
    project.mkdir(parents=True)
    sub, rel = containing_subvolume(project)
    assert sub == home and rel == Path("alice/proj")
    assert is_same_filesystem(project, pool.root)
    assert not is_same_filesystem(project, Path("/proc"))
    retention.ensure_free_space(pool, 1 << 20)
    with pytest.raises(StorageError, match="below the reserve"):
        retention.ensure_free_space(pool, 1 << 50)


def test_loop_pool_with_quotas(tmp_path: Path, run_id: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="cairn-looppool-"))
    loop = None
    try:
        loop = init_loop_pool(base / "pool.img", "300M", base / "mnt")
        with pytest.raises(StorageError, match="already a mount point"):
            init_loop_pool(base / "other.img", "300M", base / "mnt")
        assert not (base / "other.img").exists()
        pool = Pool.open(Path(loop.mountpoint))
        assert pool.fsid == loop.fsid
        # mounted noatime, so an agent's reads change nothing a boundary compares
        assert hostcheck.file_times_check(Path(loop.mountpoint)).status == "ok"
        assert not pool.quota_enabled()
        assert pool.ensure_run_qgroup(run_id) is None  # never enables quotas itself
        proc.run(["btrfs", "quota", "enable", loop.mountpoint])
        proc.run(["btrfs", "quota", "rescan", "-w", loop.mountpoint])
        assert pool.quota_enabled() and pool.quota_problem() is None
        qid = pool.ensure_run_qgroup(run_id, limit_bytes=64 << 20)
        assert qid is not None and qid >> 48 == 1
        assert pool.ensure_run_qgroup(run_id, limit_bytes=64 << 20) == qid  # idempotent
        w = pool.w_path(run_id, "root", 0)
        pool.create_subvolume(w, qgroup=qid)
        (w / "f").write_bytes(os.urandom(1 << 20))
        s = pool.snapshot(w, pool.checkpoint_path(run_id, "op-1"), read_only=True, qgroup=qid)
        show = proc.run(["btrfs", "qgroup", "show", "-pce", "--raw", loop.mountpoint])
        rows = show.stdout.decode()
        name = run_qgroup_name(run_id)
        assert any(line.split()[0] == name and str(64 << 20) in line for line in
                   rows.splitlines() if line.split())
        assert any(line.split()[0] == f"0/{s.subvol_id}" and name in line
                   for line in rows.splitlines() if line.split())
        pool.delete_run(run_id)
    finally:
        if loop is not None:
            remove_loop_pool(loop)
        assert not proc.run(["losetup", "-j", os.fspath(base / "pool.img")]).stdout.strip()
        for leftover in base.iterdir():
            if leftover.is_dir():
                leftover.rmdir()
        base.rmdir()


def test_loop_pool_with_a_chosen_node_size(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="cairn-looppool-"))
    with pytest.raises(UsageError, match="node size"):
        init_loop_pool(base / "pool.img", "300M", base / "mnt", node_size=5000)
    assert not (base / "pool.img").exists()
    loop = None
    try:
        loop = init_loop_pool(base / "pool.img", "300M", base / "mnt", node_size=4096)
        super_block = proc.run(["btrfs", "inspect-internal", "dump-super", loop.image])
        assert ["nodesize", "4096"] in [
            line.split() for line in super_block.stdout.decode().splitlines()
        ]
    finally:
        if loop is not None:
            remove_loop_pool(loop)
        assert not proc.run(["losetup", "-j", os.fspath(base / "pool.img")]).stdout.strip()
        for leftover in base.iterdir():
            if leftover.is_dir():
                leftover.rmdir()
        base.rmdir()


def test_remint_gives_another_run_its_own_copy_and_leaves_the_source(
    pool: Pool, run_id: str
) -> None:
    """cairn replay: a source run's checkpoint becomes the new run's own read-only
    snapshot (a new UUID, same tree); the source's is untouched and still verifies, and
    deleting the new run leaves it."""
    w = pool.w_path(run_id, "root", 1)
    pool.create_subvolume(w)
    populate(w)
    source = pool.checkpoint_path(run_id, "root-2")
    taken = pool.snapshot(w, source, read_only=True)
    replayed = f"flow_{'0' * 31}1"
    copy = pool.checkpoint_path(replayed, "root-2")
    minted = pool.remint(source, taken, copy)
    assert minted.uuid != taken.uuid and minted.read_only and minted.fsid == taken.fsid
    assert minted.path == str(copy) and inventories_equal(source, copy)
    assert pool.remint(source, taken, copy).uuid == minted.uuid  # a retry after a crash
    pool.verify(source, taken)
    with pytest.raises(StorageError, match="not a read-only snapshot"):
        pool.remint(w, pool.receipt(w), pool.checkpoint_path(replayed, "w"))
    with pytest.raises(StorageError, match="no longer the recorded subvolume"):
        pool.remint(source, minted, pool.checkpoint_path(replayed, "other"))
    assert not pool.checkpoint_path(replayed, "w").exists()
    assert not pool.checkpoint_path(replayed, "other").exists()
    pool.delete_run(replayed)
    assert not copy.exists()
    assert pool.verify(source, taken).uuid == taken.uuid
    assert (source / "src" / "main.py").read_text() == "print('hi')\n"


def test_nothing_but_the_operations_own_result_is_taken_at_its_destination(
    pool: Pool, run_id: str
) -> None:
    """A crash-retried create or snapshot takes over only what it would have made; any
    other subvolume or directory there is refused, and a plain directory is no source."""
    w = pool.w_path(run_id, "root", 1)
    pool.create_subvolume(w)
    s = pool.checkpoint_path(run_id, "op-1")
    pool.snapshot(w, s, read_only=True)
    with pytest.raises(StorageError, match=f"{s} exists and is not the expected empty subvolume"):
        pool.create_subvolume(s)  # a snapshot, and read-only
    other = pool.w_path(run_id, "root", 2)
    pool.create_subvolume(other)
    with pytest.raises(StorageError, match=f"{other} exists and is not a snapshot of {w}"):
        pool.snapshot(w, other, read_only=False)
    plain = pool.run_dir(run_id) / "plain"
    plain.mkdir()
    with pytest.raises(StorageError, match=f"snapshot source {plain} is not a subvolume"):
        pool.snapshot(plain, pool.w_path(run_id, "root", 3), read_only=False)
    with pytest.raises(StorageError, match=f"{plain} exists and is not a subvolume"):
        pool.create_subvolume(plain)
    with pytest.raises(StorageError, match=f"{plain} is not a Btrfs subvolume"):
        pool.receipt(plain)


def _agent_boundary(pool: Pool, run_id: str, name: str, act: Callable[[Path], object]) -> bool:
    """What root sees at a boundary: a checkpoint, a W made from it, ``act`` on that W (an
    agent at work), the W's next checkpoint, and whether the two differ."""
    base = pool.checkpoint_path(run_id, f"{name}-base")
    w = pool.w_path(run_id, name, 1)
    source = pool.w_path(run_id, name, 0)
    pool.create_subvolume(source)
    populate(source)
    pool.snapshot(source, base, read_only=True)
    pool.snapshot(base, w, read_only=False)
    act(w)
    after = pool.checkpoint_path(run_id, f"{name}-after")
    pool.snapshot(w, after, read_only=True)
    return content_changed(base, after)


def _make_and_remove(w: Path) -> None:
    (w / "src" / "scratch.tmp").write_text("gone before the boundary")
    (w / "src" / "scratch.tmp").unlink()
    os.mkdir(w / "tmpdir")
    os.rmdir(w / "tmpdir")


def _read_everything(w: Path) -> None:
    for path in w.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.read_bytes()
    os.utime(w / "run.sh")  # a touch is a time, not a change


@pytest.mark.parametrize(("act", "changed"), [
    (_read_everything, False),
    (_make_and_remove, False),
    (lambda w: (w / "src" / "main.py").write_text("print('bye')\n"), True),
    (lambda w: (w / "NOTES.md").write_text("new\n"), True),
    (lambda w: (w / "secret").unlink(), True),
    (lambda w: os.chmod(w / "secret", 0o644), True),
    (lambda w: os.rename(w / "src", w / "lib"), True),
    (lambda w: os.symlink("run.sh", w / "again"), True),
], ids=["reads-and-touch", "made-and-removed", "edit", "new-file", "delete", "chmod",
        "rename", "symlink"])
def test_content_changed_sees_what_an_agent_changed_not_what_it_read(
    pool: Pool, run_id: str, act: Callable[[Path], object], changed: bool
) -> None:
    assert _agent_boundary(pool, run_id, "scope", act) is changed


def test_content_changed_reads_a_long_stream_of_times_as_no_change(
    pool: Pool, run_id: str
) -> None:
    """An agent that touches every file of a large tree makes root read a stream of
    thousands of UTIMES commands, header by header, and still see no change."""
    def fill(w: Path) -> None:
        for n in range(3000):
            (w / "src" / f"f{n}.py").write_text("x\n")

    def touch_again(w: Path) -> None:
        for n in range(3000):
            os.utime(w / "src" / f"f{n}.py", (n, n))

    base = pool.checkpoint_path(run_id, "many-base")
    source = pool.w_path(run_id, "many", 0)
    pool.create_subvolume(source)
    populate(source)
    fill(source)
    pool.snapshot(source, base, read_only=True)
    w = pool.w_path(run_id, "many", 1)
    pool.snapshot(base, w, read_only=False)
    touch_again(w)
    after = pool.checkpoint_path(run_id, "many-after")
    pool.snapshot(w, after, read_only=True)
    assert content_changed(base, after) is False
    os.unlink(w / "src" / "f2999.py")
    later = pool.checkpoint_path(run_id, "many-later")
    pool.snapshot(w, later, read_only=True)
    assert content_changed(base, later) is True
