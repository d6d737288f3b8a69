"""What the pool refuses before it touches Btrfs: paths outside it, names and generations
it does not make, and files that are not on Btrfs at all. The pool here is a plain
directory (no Btrfs needed to refuse); the snapshots themselves are tests/btrfs's."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn import storage
from cairn.errors import NotFound, StorageError, UsageError

RUN = "flow_" + "e" * 32


@pytest.fixture
def pool(tmp_path: Path) -> storage.Pool:
    (tmp_path / "pool").mkdir()
    return storage.Pool(tmp_path / "pool", "stand-in")


def test_what_is_not_on_btrfs_is_said_so(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot open .*missing: No such file"):
        storage.filesystem_uuid(tmp_path / "missing")
    assert storage.is_btrfs(tmp_path) is False
    assert storage.is_btrfs(tmp_path / "missing") is False
    assert storage.is_same_filesystem(tmp_path, tmp_path) is False
    (tmp_path / "link").symlink_to(tmp_path)
    assert storage.is_subvolume(tmp_path / "link") is False  # a link is never followed
    with pytest.raises(NotFound, match="subvolume .*missing does not exist"):
        storage.receipt(tmp_path / "missing")
    with pytest.raises(StorageError, match="is not a Btrfs subvolume"):
        storage.receipt(tmp_path)
    with pytest.raises(StorageError, match="is not a Btrfs subvolume"):
        storage.metadata_stream(tmp_path, tmp_path)


def test_the_pool_makes_only_its_own_names(pool: storage.Pool) -> None:
    with pytest.raises(UsageError, match="workspace generation must be >= 0, not -1"):
        pool.w_path(RUN, "root", -1)
    with pytest.raises(UsageError, match="settlement subvolume must be P, C or F, not 'Q'"):
        pool.settlement_path(RUN, "Q")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        pool.checkpoint_path(RUN, "../../etc")


def test_nothing_is_made_outside_the_pool(pool: storage.Pool, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="is outside the storage pool"):
        pool.create_subvolume(tmp_path / "elsewhere")
    (pool.root / "plain").mkdir()
    with pytest.raises(StorageError, match="plain exists and is not a subvolume"):
        pool.create_subvolume(pool.root / "plain")
