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
from cairn.settle import apply as apply_module
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
    # a hard link within the change set stays one file, in F and in the live project
    for tree in (f, live):
        new, linked = (os.stat(tree / "src" / name) for name in ("new.py", "linked.py"))
        assert new.st_ino == linked.st_ino and new.st_nlink == 2, tree
    # what docs/settlement.md says is not kept: an xattr-only change, mtimes
    assert "docs/guide.md" in accepted and "docs/guide.md" not in result.applied
    assert "user.only" not in xattrs(live / "docs" / "guide.md")
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


def linking_agent(w: Path) -> None:
    """Hard links within the change set: a new file under three names in two
    directories (one replacing a file of Q), a changed file linked from a new name, and
    a new name for a file the run did not change."""
    (w / "src" / "shared.py").write_text("shared\n")
    (w / "assets").mkdir()
    os.link(w / "src" / "shared.py", w / "assets" / "shared-copy.py")
    os.unlink(w / "src" / "util.py")
    os.link(w / "src" / "shared.py", w / "src" / "util.py")
    (w / "src" / "app.py").write_text("v2\n")
    os.link(w / "src" / "app.py", w / "src" / "app-alias.py")
    os.link(w / "docs" / "guide.md", w / "guide-link.md")  # guide.md itself unchanged
    os.link(w / "src" / "shared.py", w / ".git" / "shared")  # a refused name of the group


def test_hard_links_within_the_change_set_stay_one_file(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    live = live_project(pool)
    q, f, accepted, report = settle_run(pool, run_id, live, linking_agent,
                                        SettlementPolicy())
    assert ".git/shared" not in accepted
    result = apply(q, f, live, accepted, tmp_path / "receipts.jsonl")
    assert result.status == "applied"

    def inode(rel: str) -> int:
        return os.stat(live / rel, follow_symlinks=False).st_ino

    group = ("src/shared.py", "assets/shared-copy.py", "src/util.py")
    assert {inode(rel) for rel in group} == {inode("src/shared.py")}
    assert os.stat(live / "src" / "shared.py").st_nlink == 3  # not the refused fourth
    assert (live / "src" / "util.py").read_text() == "shared\n"
    assert inode("src/app.py") == inode("src/app-alias.py")
    assert (live / "src" / "app-alias.py").read_text() == "v2\n"
    # a link to a file outside the change set is a file of its own; that file is untouched
    assert inode("guide-link.md") != inode("docs/guide.md")
    assert (live / "guide-link.md").read_text() == "guide\n"
    assert os.stat(live / "docs" / "guide.md").st_nlink == 1
    assert not (live / ".git" / "shared").exists()


def test_links_the_apply_cannot_keep_are_named(
    pool: Pool, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, linking_agent, SettlementPolicy())
    monkeypatch.setattr(apply_module, "BATCH", 1)  # each path in a batch of its own
    result = apply(q, f, live, accepted, tmp_path / "receipts.jsonl")
    assert result.status == "applied"
    # the first name of each file is written, the later ones are copies, and named
    assert result.links_not_kept == ["src/app.py", "src/shared.py", "src/util.py"]
    assert os.stat(live / "src" / "shared.py").st_nlink == 1
    assert (live / "src" / "util.py").read_text() == "shared\n"
