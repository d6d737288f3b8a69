"""The one durable file replacement: temp file in the same directory, fsync, rename, fsync
of the directory; nothing left behind when it fails."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cairn import fsutil


def test_writes_and_replaces_leaving_only_the_file(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    fsutil.write_atomic(target, "first\n")
    fsutil.write_atomic(target, b"second\n")
    assert target.read_bytes() == b"second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_mode(tmp_path: Path) -> None:
    target = tmp_path / "boundary.json"
    fsutil.write_atomic(target, "{}", mode=0o644)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_the_file_then_its_directory_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fsutil.write_atomic(tmp_path / "finish.json", "{}")
    assert len(synced) == 2
    assert Path(synced[0]).parent == tmp_path and synced[0].endswith(".tmp")
    assert synced[1] == str(tmp_path)


def test_a_failed_rename_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("keep")
    with pytest.raises(IsADirectoryError):
        fsutil.write_atomic(target, "new")
    assert (target / "inside").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_syncfs_commits_the_filesystem_of_an_open_fd_and_refuses_a_closed_one(
    tmp_path: Path,
) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor") as caught:
        fsutil.syncfs(fd)  # a closed fd: EBADF, not the sync(2) fallback
    assert caught.value.errno == errno.EBADF
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sync: Callable[[int], object] = fsutil.syncfs  # its result is what is asserted
        assert sync(fd) is None
    finally:
        os.close(fd)


def test_on_btrfs_tells_the_filesystem_type_stat_reports(tmp_path: Path) -> None:
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                          text=True, check=True).stdout.strip()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert fsutil.on_btrfs(fd) is (kind == "btrfs")
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor") as caught:
        fsutil.on_btrfs(fd)  # closed
    assert caught.value.errno == errno.EBADF


def test_copy_bytes_copies_every_chunk(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)  # more than one chunk
    (tmp_path / "src").write_bytes(data)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(tmp_path / "dst", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert fsutil.copy_bytes(src, dst) == len(data)
    finally:
        os.close(src)
        os.close(dst)
    assert (tmp_path / "dst").read_bytes() == data
