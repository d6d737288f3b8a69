"""``cairn doctor``'s pool checks on a real Btrfs pool: on Btrfs, free space against the
reserve, and file times (``noatime``; ``cairn storage init`` mounts so,
tests/btrfs/test_storage.py)."""

from __future__ import annotations

from cairn import hostcheck
from cairn.storage import Pool


def test_a_btrfs_pool_passes_and_free_space_is_held_against_the_reserve(pool: Pool) -> None:
    on_btrfs, roomy, times = hostcheck.pool_checks(pool.root, reserve=1 << 20)
    assert on_btrfs.line() == f"ok    pool: {pool.root} on Btrfs"
    # this fixture's filesystem is mounted relatime, as mount does without options
    assert times.status == "warn" and "noatime" in times.fix
    assert roomy.status == "ok" and roomy.detail.endswith("free, reserve 0.0 GiB")
    free = pool.free_bytes()
    (_, tight, _) = hostcheck.pool_checks(pool.root, reserve=free // 2 + 1)
    assert tight.status == "warn" and tight.fix == "delete finished runs or grow the pool"
    (_, full, _) = hostcheck.pool_checks(pool.root, reserve=free + (1 << 30))
    assert full.status == "fail"
