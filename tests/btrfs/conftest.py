"""A real Btrfs filesystem on a loop device for the storage and settlement tests.

One sparse image per session, attached with ``losetup`` and mounted; teardown always
unmounts and detaches, also when a test failed. Each test gets its own pool directory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import btrfsutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from attested import carry_out_attested  # noqa: E402

from cairn import paths, proc
from cairn.broker import verbs
from cairn.coordinator import context
from cairn.protocol.broker import BrokerReply
from cairn.storage import Pool, is_subvolume

IMAGE_SIZE = 1 << 30


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root to attach loop devices and mount Btrfs"
    for tool in ("mkfs.btrfs", "btrfs", "losetup", "mount", "umount"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"needs {tool} (btrfs-progs / util-linux)"
    return None


def _run(*argv: str) -> str:
    return proc.run(argv, timeout=120).stdout.decode().strip()


def delete_subvolumes_under(root: Path) -> None:
    """Delete every subvolume below ``root`` (nested ones included)."""
    for dirpath, dirnames, _files in os.walk(root):
        for name in list(dirnames):
            path = Path(dirpath, name)
            if is_subvolume(path):
                btrfsutil.delete_subvolume(os.fspath(path), recursive=True)
                dirnames.remove(name)


@pytest.fixture(scope="session")
def btrfs_mount() -> Iterator[Path]:
    """The mount point of a fresh 1 GiB Btrfs (world-traversable, so tests can act as
    another user inside it)."""
    reason = _missing_prerequisite()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="cairn-btrfs-"))
    base.chmod(0o755)
    image = base / "pool.img"
    mnt = base / "mnt"
    mnt.mkdir()
    device = ""
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(IMAGE_SIZE)
        _run("mkfs.btrfs", "-q", str(image))
        device = _run("losetup", "--find", "--show", str(image))
        _run("mount", "-t", "btrfs", device, str(mnt))
        mounted = True
        mnt.chmod(0o755)
        yield mnt
    finally:
        if mounted:
            proc.run(["umount", mnt], check=False)
            if os.path.ismount(mnt):
                proc.run(["umount", "-l", mnt], check=False)
        if device:
            proc.run(["losetup", "-d", device], check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pool(btrfs_mount: Path) -> Iterator[Pool]:
    """A fresh pool directory on the session filesystem; its runs are deleted after."""
    root = btrfs_mount / f"pool-{uuid.uuid4().hex[:12]}"
    root.mkdir()
    root.chmod(0o755)
    p = Pool.open(root)
    try:
        yield p
    finally:
        delete_subvolumes_under(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def run_id() -> str:
    return f"flow_{uuid.uuid4().hex}"


@pytest.fixture
def broker_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: Pool) -> Pool:
    """A host under ``tmp_path`` whose coordinators reach the real broker code in this
    process (``verbs.carry_out``) over ``pool``; returns the pool."""
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    for directory in (paths.journal_path().parent, paths.broker_db_path().parent,
                      paths.config_dir()):
        directory.mkdir(parents=True)
    paths.pool_dir().symlink_to(pool.root)
    monkeypatch.setattr(verbs.IntentContext, "pool", lambda self: pool)
    monkeypatch.setattr(context, "call_broker", lambda verb, run_id, **_: BrokerReply(
        ok=True, receipts=carry_out_attested(verb, run_id)))
    return pool
