"""The live apply keeps the ``user.*`` xattrs F gives what it writes, on real Btrfs, and
names the paths whose xattrs a live filesystem refuses (a loop ext4, whose blocks hold
less than a Btrfs xattr may) instead of failing the apply."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_settle import live_project, settle_run

from cairn import proc
from cairn.settle.apply import apply
from cairn.settle.paths import SettlementPolicy
from cairn.storage import Pool

pytestmark = pytest.mark.btrfs
BIG = b"x" * 8000  # fits a Btrfs xattr (up to about a node), not an ext4 block


def tagging_agent(w: Path) -> None:
    """Content and xattrs: a changed file, a new one, a new empty one, a new directory."""
    (w / "src" / "app.py").write_text("v2\n")
    os.setxattr(w / "src" / "app.py", "user.note", b"reviewed")
    (w / "src" / "new.py").write_text("new\n")
    os.setxattr(w / "src" / "new.py", "user.big", BIG)
    os.setxattr(w / "src" / "new.py", "user.small", b"kept")
    (w / "src" / "empty.py").touch()
    os.setxattr(w / "src" / "empty.py", "user.kind", b"marker")
    (w / "assets").mkdir()
    os.setxattr(w / "assets", "user.owner", b"design")
    (w / "assets" / "logo.txt").write_text("logo\n")
    os.setxattr(w / "docs" / "guide.md", "user.only", b"an xattr, no other change")
    os.link(w / "src" / "new.py", w / "src" / "linked.py")


def xattrs(path: Path) -> dict[str, bytes]:
    return {n: os.getxattr(path, n) for n in os.listxattr(path) if n.startswith("user.")}


def test_written_files_and_made_directories_carry_fs_xattrs(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    live = live_project(pool)
    os.setxattr(live / "src" / "app.py", "user.before", b"q")  # Q's: F keeps it too
    q, f, accepted, _ = settle_run(pool, run_id, live, tagging_agent, SettlementPolicy())
    assert xattrs(f / "src" / "app.py") == {"user.before": b"q", "user.note": b"reviewed"}
    started = time.time()
    result = apply(q, f, live, accepted, tmp_path / "receipts.jsonl")
    assert result.status == "applied" and result.xattrs_not_kept == []
    for rel in ("src/app.py", "src/new.py", "src/empty.py", "assets", "assets/logo.txt"):
        assert xattrs(live / rel) == xattrs(f / rel), rel
    assert xattrs(live / "src" / "new.py")["user.big"] == BIG
    # what docs/settlement.md says is not kept: an xattr-only change, a hard link, mtimes
    assert "docs/guide.md" in accepted and "docs/guide.md" not in result.applied
    assert "user.only" not in xattrs(live / "docs" / "guide.md")
    new, linked = (os.stat(live / "src" / name) for name in ("new.py", "linked.py"))
    assert new.st_ino != linked.st_ino and new.st_nlink == linked.st_nlink == 1
    assert new.st_mtime >= started


@pytest.fixture
def ext4_dir() -> Iterator[Path]:
    """A directory on a fresh loop ext4 (4 KiB blocks, user xattrs on), always
    unmounted and detached afterwards."""
    base = Path(tempfile.mkdtemp(prefix="cairn-ext4-"))
    image, mnt = base / "live.img", base / "mnt"
    mnt.mkdir()
    device, mounted = "", False
    try:
        with open(image, "wb") as fh:
            fh.truncate(64 << 20)
        proc.run(["mkfs.ext4", "-q", "-b", "4096", "-O", "^ea_inode", image], timeout=120)
        device = proc.run(["losetup", "--find", "--show", image],
                          timeout=60).stdout.decode().strip()
        proc.run(["mount", "-t", "ext4", "-o", "user_xattr", device, mnt], timeout=60)
        mounted = True
        yield mnt
    finally:
        if mounted:
            proc.run(["umount", mnt], check=False, timeout=60)
        if device:
            proc.run(["losetup", "-d", device], check=False, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def test_a_live_filesystem_that_refuses_an_xattr_is_named_not_failed(
    pool: Pool, run_id: str, tmp_path: Path, ext4_dir: Path
) -> None:
    source = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, source, tagging_agent, SettlementPolicy())
    live = ext4_dir / "project"
    proc.run(["cp", "-a", f"{q}/.", live], timeout=60)  # Q's tree, on another filesystem
    result = apply(q, f, live, accepted, tmp_path / "receipts.jsonl")
    assert result.status == "applied"
    # only the file with the xattr too big for ext4 (and its hard link, the same file in F)
    assert result.xattrs_not_kept == ["src/linked.py", "src/new.py"]
    assert (live / "src" / "new.py").read_text() == "new\n"  # F's content all the same
    assert xattrs(live / "src" / "new.py") == {"user.small": b"kept"}
    assert xattrs(live / "src" / "app.py") == xattrs(f / "src" / "app.py")
    assert xattrs(live / "assets") == {"user.owner": b"design"}
