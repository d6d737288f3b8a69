"""The change set from root's tree-search record (:mod:`cairn.treesearch`, read by
:mod:`cairn.settle.generations`) is the send stream's (:func:`cairn.settle.changes.changes`)
on the same real Btrfs snapshots: every kind of change, a subpath, metadata only, swapped
directories, hard links, a symlink replaced by a directory, random sequences of edits;
and there is no record (the caller sends) where P does not descend from Q."""

from __future__ import annotations

import ctypes
import fcntl
import os
import random
from pathlib import Path

import btrfsutil
import pytest
from test_changes import base_tree, frozen_pair, random_ops

from cairn import treesearch
from cairn.settle.changes import ChangeSet, changes
from cairn.settle.generations import RecordError, changes_from_record
from cairn.storage import Pool
from cairn.treesearch import change_record

pytestmark = pytest.mark.btrfs
FICLONE = 0x40049409  # _IOW(0x94, 9, int)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def sets(cs: ChangeSet) -> dict[str, list[str]]:
    return {"created": cs.created, "modified": cs.modified, "deleted": cs.deleted,
            "metadata": cs.metadata}


def generation_changes(q: Path, p: Path, subpath: str = "") -> ChangeSet:
    record = change_record(q, p)
    assert record is not None
    return changes_from_record(record, q, p, subpath=subpath)


def same_as_send(q: Path, p: Path, subpath: str = "") -> ChangeSet:
    found = generation_changes(q, p, subpath=subpath)
    sent = changes(q, p, subpath=subpath)
    assert sets(found) == sets(sent)
    # what the settlement reads them for: more directories, more pairs, never fewer
    assert set(sent.touched) <= set(found.touched)
    assert set(sent.renamed) <= set(found.renamed)
    return found


def every_kind(w: Path) -> None:
    (w / "proj/new.txt").write_text("new\n")
    (w / "proj/src/main.py").write_text("main v2\n")
    os.unlink(w / "proj/docs/readme.md")
    os.rename(w / "proj/run.sh", w / "proj/start.sh")
    os.rename(w / "proj/src/pkg", w / "proj/src/lib")
    os.chmod(w / "proj/start.sh", 0o755)
    os.unlink(w / "proj/link")
    os.symlink("src/lib/a.py", w / "proj/link")
    (w / "proj/shared").write_text("linked v2\n")
    os.setxattr(w / "proj/src/main.py", "user.k", b"v")
    os.rmdir(w / "proj/empty")
    (w / "proj/newdir/deep").mkdir(parents=True)
    (w / "other/x").write_text("outside\n")
    os.rename(w / "other/moveme", w / "proj/moved-in")


def test_every_kind_of_change_whole_and_under_a_subpath(pool: Pool, run_id: str) -> None:
    q, p = frozen_pair(pool, run_id, base_tree, every_kind)
    whole = same_as_send(q, p)
    assert "other/x" in whole.modified and "proj/src/lib/a.py" in whole.created
    inside = same_as_send(q, p, "proj")
    assert {"shared", "docs/shared-link", "link"} <= set(inside.modified)
    assert sets(same_as_send(q, p, "./proj/")) == sets(inside)  # as a unit's argument says it


def test_metadata_only_and_no_change(pool: Pool, run_id: str) -> None:
    def change(w: Path) -> None:
        os.chmod(w / "proj/src/main.py", 0o600)
        os.chown(w / "proj/docs/readme.md", 1000, 1000)
        os.setxattr(w / "proj/run.sh", "user.note", b"1")
        os.utime(w / "proj/src/pkg/a.py", (1, 1))  # times only: no change to settle

    q, p = frozen_pair(pool, run_id, base_tree, change)
    assert same_as_send(q, p, "proj").metadata == ["docs/readme.md", "run.sh", "src/main.py"]


def test_nothing_changed(pool: Pool, run_id: str) -> None:
    q, p = frozen_pair(pool, run_id, base_tree, lambda w: None)
    assert same_as_send(q, p).is_empty()


def test_swapped_directories_and_a_new_hard_link(pool: Pool, run_id: str) -> None:
    def change(w: Path) -> None:
        os.rename(w / "proj/src", w / "proj/tmp")
        os.rename(w / "proj/docs", w / "proj/src")
        os.rename(w / "proj/tmp", w / "proj/docs")
        os.link(w / "proj/run.sh", w / "proj/run-again.sh")

    q, p = frozen_pair(pool, run_id, base_tree, change)
    found = same_as_send(q, p)
    assert "proj/run-again.sh" in found.created and "proj/run.sh" not in found.paths()


@pytest.mark.parametrize("seed", range(60))
def test_random_edits(pool: Pool, run_id: str, seed: int) -> None:
    rng = random.Random(seed)

    def setup(w: Path) -> None:
        base_tree(w)
        if seed % 2:
            random_ops(w, rng, 40, "a")

    q, p = frozen_pair(pool, run_id, setup, lambda w: random_ops(w, rng, 80, "g"))
    same_as_send(q, p)
    same_as_send(q, p, "proj")


def test_the_sequence_that_renamed_and_wrote_a_hard_linked_file(
    pool: Pool, run_id: str
) -> None:
    rng = random.Random(27)
    q, p = frozen_pair(pool, run_id, base_tree, lambda w: random_ops(w, rng, 80, "g"))
    same_as_send(q, p)


def test_a_symlink_replaced_by_a_directory_is_not_looked_through(
    pool: Pool, run_id: str
) -> None:
    def setup(w: Path) -> None:
        base_tree(w)
        os.symlink("src", w / "proj/alias")

    def change(w: Path) -> None:
        os.unlink(w / "proj/alias")
        (w / "proj/alias").mkdir()
        (w / "proj/alias/pkg").write_text("not Q's proj/src/pkg\n")

    q, p = frozen_pair(pool, run_id, setup, change)
    found = same_as_send(q, p, "proj")
    assert "alias/pkg" in found.created and "alias" in found.modified


def test_no_record_where_p_does_not_descend_from_q(pool: Pool, run_id: str) -> None:
    q, _p = frozen_pair(pool, run_id, base_tree, lambda w: None)
    other = pool.checkpoint_path(run_id, "unrelated")
    other.parent.mkdir(parents=True, exist_ok=True)
    pool.create_subvolume(pool.w_path(run_id, "other", 0))
    base_tree(pool.w_path(run_id, "other", 0))
    pool.snapshot(pool.w_path(run_id, "other", 0), other, read_only=True)
    assert change_record(q, other) is None


def test_no_record_from_a_snapshot_taken_before_q(pool: Pool, run_id: str) -> None:
    """A snapshot of Q's source taken before Q holds older items than Q whose
    transactions do not tell them apart: no record, the send stream says it."""
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    base_tree(w)
    early = pool.checkpoint_path(run_id, "early")
    early.parent.mkdir(parents=True, exist_ok=True)
    pool.snapshot(w, early, read_only=True)
    (w / "proj/src/main.py").write_text("changed before Q\n")
    q = pool.q_path(run_id)
    pool.snapshot(w, q, read_only=True)
    assert change_record(q, early) is None
    assert "proj/src/main.py" in changes(q, early).modified


def test_a_record_that_is_not_one_is_refused(pool: Pool, run_id: str) -> None:
    def change(w: Path) -> None:
        (w / "proj/new").write_text("n")

    q, p = frozen_pair(pool, run_id, base_tree, change)
    record = change_record(q, p)
    assert record is not None
    for broken in (b"", b"btrfs-stream\x00", record[:-1]):
        with pytest.raises(RecordError):
            changes_from_record(broken, q, p)


def q_w_p(pool: Pool, run_id: str) -> tuple[Path, Path, Path]:
    """Q, W made from Q and P frozen from W, as a run makes them."""
    project = pool.w_path(run_id, "project", 0)
    pool.create_subvolume(project)
    base_tree(project)
    q = pool.q_path(run_id)
    pool.snapshot(project, q, read_only=True)
    w = pool.w_path(run_id, "root", 1)
    pool.snapshot(q, w, read_only=False)
    (w / "proj/src/main.py").write_text("main v2\n")
    p = pool.settlement_path(run_id, "P")
    pool.snapshot(w, p, read_only=True)
    return q, w, p


def test_a_chain_through_w_is_followed_and_one_broken_is_not(pool: Pool, run_id: str) -> None:
    q, w, p = q_w_p(pool, run_id)
    assert same_as_send(q, p).modified == ["proj/src/main.py"]
    pool.delete(w, pool.receipt(w))  # the subvolume between them is gone: P's past unknown
    assert change_record(q, p) is None


def test_no_record_over_its_bound_or_of_a_writable_or_missing_snapshot(
    pool: Pool, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, w, p = q_w_p(pool, run_id)
    assert change_record(q, w) is None  # W may change while it is read
    assert change_record(q, p.parent / "absent") is None
    monkeypatch.setattr(treesearch, "RECORD_LIMIT", 200)
    assert change_record(q, p) is None


def test_content_changed_without_a_new_extent_is_modified(pool: Pool, run_id: str) -> None:
    """A reflink, a copy the kernel makes one of, a truncate back to the same size and a
    hole punched change what a file holds with no extent newer than Q: its extents
    differ from Q's all the same."""
    size = 8192

    def setup(w: Path) -> None:
        base_tree(w)
        for name in ("cloned", "copied", "truncated", "punched", "source"):
            (w / "proj" / name).write_bytes(bytes([len(name)]) * size)

    def change(w: Path) -> None:
        proj = w / "proj"
        with open(proj / "source", "rb") as src, open(proj / "cloned", "r+b") as dst:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        with open(proj / "source", "rb") as src, open(proj / "copied", "r+b") as dst:
            os.copy_file_range(src.fileno(), dst.fileno(), size, 0, 0)
        os.truncate(proj / "truncated", 0)
        os.truncate(proj / "truncated", size)
        fd = os.open(proj / "punched", os.O_RDWR)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
            assert libc.fallocate(fd, mode, ctypes.c_long(0), ctypes.c_long(4096)) == 0
        finally:
            os.close(fd)

    q, p = frozen_pair(pool, run_id, setup, change)
    for name in ("cloned", "copied", "truncated", "punched"):
        assert os.stat(q / "proj" / name).st_size == os.stat(p / "proj" / name).st_size
    assert same_as_send(q, p, "proj").modified == ["cloned", "copied", "punched", "truncated"]


def test_a_number_a_new_inode_took_does_not_hide_the_deletion(pool: Pool, run_id: str) -> None:
    """The last inode deleted, its number is free again once the tree is loaded anew (a
    snapshot of W, a remount): a new file takes it, and the old name is still deleted."""
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    base_tree(w)
    (w / "proj/last").write_text("the highest inode\n")
    number = os.lstat(w / "proj/last").st_ino
    q = pool.q_path(run_id)
    pool.snapshot(w, q, read_only=True)
    os.unlink(w / "proj/last")
    again = pool.w_path(run_id, "root", 1)
    pool.snapshot(w, again, read_only=False)
    (again / "proj/docs/new").write_text("takes the number\n")
    assert os.lstat(again / "proj/docs/new").st_ino == number
    p = pool.settlement_path(run_id, "P")
    pool.snapshot(again, p, read_only=True)
    found = same_as_send(q, p, "proj")
    assert (found.created, found.deleted) == (["docs/new"], ["last"])


def test_no_record_of_a_q_changed_after_it_was_made(pool: Pool, run_id: str) -> None:
    q, w, p = q_w_p(pool, run_id)
    btrfsutil.set_subvolume_read_only(os.fspath(q), False)
    (q / "proj/src/main.py").write_text("changed in Q\n")
    btrfsutil.set_subvolume_read_only(os.fspath(q), True)
    assert change_record(q, p) is None


def test_a_directory_made_again_under_its_old_name_and_number(pool: Pool, run_id: str) -> None:
    """A build deletes its output directory and makes it again: the new directory takes
    the old one's name and number, and what the old one held is still deleted."""
    w = pool.w_path(run_id, "root", 0)
    pool.create_subvolume(w)
    base_tree(w)
    (w / "proj/dist").mkdir()
    (w / "proj/dist/old.txt").write_text("old build\n")
    number = os.lstat(w / "proj/dist").st_ino
    q = pool.q_path(run_id)
    pool.snapshot(w, q, read_only=True)
    os.unlink(w / "proj/dist/old.txt")
    os.rmdir(w / "proj/dist")
    again = pool.w_path(run_id, "root", 1)
    pool.snapshot(w, again, read_only=False)
    (again / "proj/dist").mkdir()
    (again / "proj/dist/new.txt").write_text("new build\n")
    assert os.lstat(again / "proj/dist").st_ino == number
    p = pool.settlement_path(run_id, "P")
    pool.snapshot(again, p, read_only=True)
    found = same_as_send(q, p, "proj")
    assert (found.created, found.deleted) == (["dist/new.txt"], ["dist/old.txt"])


def test_a_large_directory_between_two_changed_files_is_skipped(
    pool: Pool, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two changed files with an unchanged directory of many entries between their
    numbers: one search of both would read all its entries; the record skips them and
    is the same."""
    def setup(w: Path) -> None:
        base_tree(w)
        (w / "proj/a.txt").write_text("a\n")
        (w / "proj/big").mkdir()
        (w / "proj/b.txt").write_text("b\n")
        for i in range(40):
            (w / f"proj/big/{i}").write_text(f"{i}\n")

    def change(w: Path) -> None:
        (w / "proj/a.txt").write_text("a v2\n")
        (w / "proj/b.txt").write_text("b v2\n")

    q, p = frozen_pair(pool, run_id, setup, change)
    a, big, b = (os.lstat(q / "proj" / n).st_ino for n in ("a.txt", "big", "b.txt"))
    assert (big - a, b - big) == (1, 1)
    read: list[int] = []
    search = treesearch._search

    def counted(*args: object, **kwargs: object) -> object:
        for item in search(*args, **kwargs):  # type: ignore[arg-type]
            read.append(item[0])
            yield item

    monkeypatch.setattr(treesearch, "_search", counted)
    assert same_as_send(q, p, "proj").modified == ["a.txt", "b.txt"]
    assert read.count(big) < 80  # of its 80 entries in each of Q and P, a few are read


def test_names_past_what_one_ref_item_holds_are_read_from_extended_refs(
    pool: Pool, run_id: str
) -> None:
    """Hundreds of long names of one file in one directory overflow its INODE_REF item:
    the kernel keeps the rest as INODE_EXTREF items, which the record reads too."""
    def setup(w: Path) -> None:
        base_tree(w)
        (w / "proj/many").mkdir()
        (w / "proj/many/target").write_text("one file\n")

    def change(w: Path) -> None:
        for i in range(120):
            os.link(w / "proj/many/target", w / f"proj/many/{'n' * 200}{i}")
        (w / "proj/many/target").write_text("one file, changed\n")

    q, p = frozen_pair(pool, run_id, setup, change)
    found = same_as_send(q, p, "proj")
    assert len(found.created) == 120 and found.modified == ["many/target"]


def test_no_record_when_more_inodes_changed_than_it_could_hold(
    pool: Pool, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, _w, p = q_w_p(pool, run_id)
    monkeypatch.setattr(treesearch, "_MAX_CHANGED", 0)
    assert change_record(q, p) is None
