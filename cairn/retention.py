"""Retention and reserves (ARCHITECTURE §6): the host's storage policy
(``/etc/cairn/storage.toml``), which runs a rule deletes, and what the pool holds.

Deleting itself is the broker's ``delete-v1`` (cairnd asks for it, ``daemon/lifecycle.py``);
this module only decides. A run's storage is deleted only when the run is finished and
settled: a run that is pending, running, waiting, paused or blocked, or whose frozen
proposal was never settled, is always kept, whatever a rule says.
"""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cairn import paths, storage
from cairn.config import Problems, load_file
from cairn.errors import StorageError, UsageError
from cairn.journal.rows import TERMINAL_RUN_STATES
from cairn.sizes import parse_size

POLICY_FILE = "storage.toml"
DEFAULT_RESERVE = "256M"
DEFAULT_KEEP_DAYS = 14
DEFAULT_KEEP_PER_USER = 20


class StoragePolicy(BaseModel):
    """``/etc/cairn/storage.toml``. Without the file the defaults apply: the daily timer
    deletes finished runs' storage after :data:`DEFAULT_KEEP_DAYS` days and beyond each
    user's :data:`DEFAULT_KEEP_PER_USER` newest, and every launch keeps the default reserve
    free; an unattended host's pool stays flat."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    keep_days: int = Field(default=DEFAULT_KEEP_DAYS, ge=0)
    keep_per_user: int = Field(default=DEFAULT_KEEP_PER_USER, ge=0)
    reserve: str = DEFAULT_RESERVE

    @field_validator("reserve")
    @classmethod
    def _size(cls, value: str) -> str:
        try:
            parse_size(value)
        except UsageError as exc:
            raise ValueError(f"reserve must be a size like 1G or 512M, not {value!r}") from exc
        return value

    @property
    def reserve_bytes(self) -> int:
        return parse_size(self.reserve)

    def rule(self) -> Rule:
        """The policy as a deletion rule."""
        return Rule(older_than=self.keep_days * 86400, keep=self.keep_per_user)


def policy_file() -> Path:
    return paths.config_dir() / POLICY_FILE


def load_policy(problems: Problems | None = None) -> StoragePolicy:
    """The host's storage policy (defaults when the file is missing); its problems are
    recorded in ``problems``, or raised as one ``ConfigError`` without it."""
    fix = 'its fields: keep_days = 14, keep_per_user = 20, reserve = "1G" (see cairn(1))'
    if problems is None:
        return load_file(policy_file(), StoragePolicy, fix=fix) or StoragePolicy()
    return problems.load(policy_file(), StoragePolicy, fix=fix) or StoragePolicy()


# --- which runs go ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunFacts:
    """What retention needs to know of one run, read from the journal."""

    run_id: str
    owner_uid: int
    state: str
    finished_at: float
    has_storage: bool
    storage_deleted: bool
    proposal_frozen: bool
    settled: bool


@dataclass(frozen=True)
class Rule:
    """Delete a finished run's storage when it finished more than ``older_than`` seconds
    ago, or when its owner has ``keep`` newer finished runs with storage; either is
    enough. ``None`` leaves that part out."""

    older_than: int | None = None
    keep: int | None = None


@dataclass(frozen=True)
class Verdict:
    run_id: str
    owner_uid: int
    delete: bool
    reason: str


def held_because(run: RunFacts) -> str | None:
    """Why the run's storage must stay whatever a rule says, or None when it may go."""
    if run.state not in TERMINAL_RUN_STATES:
        return f"it is {run.state}; only finished runs are deleted"
    if run.proposal_frozen and not run.settled:
        return "its proposal is not settled"
    return None


def select(runs: list[RunFacts], rule: Rule, now: float) -> list[Verdict]:
    """A verdict for every run that still has storage, newest first per owner."""
    verdicts: list[Verdict] = []
    kept_per_owner: dict[int, int] = {}
    live = [r for r in runs if r.has_storage and not r.storage_deleted]
    for run in sorted(live, key=lambda r: (r.owner_uid, -r.finished_at, r.run_id)):
        held = held_because(run)
        if held is not None:
            verdicts.append(Verdict(run.run_id, run.owner_uid, False, held))
            continue
        newer = kept_per_owner.get(run.owner_uid, 0)
        age = now - run.finished_at
        if rule.keep is not None and newer >= rule.keep:
            reason = f"its owner has {rule.keep} newer finished run(s)"
            verdicts.append(Verdict(run.run_id, run.owner_uid, True, reason))
        elif rule.older_than is not None and age > rule.older_than:
            reason = f"finished {_age(age)} ago"
            verdicts.append(Verdict(run.run_id, run.owner_uid, True, reason))
        else:
            kept_per_owner[run.owner_uid] = newer + 1
            verdicts.append(Verdict(run.run_id, run.owner_uid, False, "within the rule"))
    return verdicts


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


# --- what the pool holds ----------------------------------------------------------------


@dataclass(frozen=True)
class PoolUsage:
    root: str
    size: int
    used: int
    free: int
    reserve: int
    quotas: bool


def pool_usage(pool: storage.Pool, reserve: int) -> PoolUsage:
    """Size, used and free bytes of the pool's filesystem as ``statvfs`` reports them
    (free is what an unprivileged writer may still use)."""
    st = os.statvfs(pool.root)
    return PoolUsage(
        root=str(pool.root),
        size=st.f_blocks * st.f_frsize,
        used=(st.f_blocks - st.f_bfree) * st.f_frsize,
        free=st.f_bavail * st.f_frsize,
        reserve=reserve,
        quotas=pool.quota_enabled(),
    )


def run_exclusive_bytes(pool: storage.Pool, run_id: str) -> int | None:
    """Bytes only the run's subvolumes hold, from its level-1 qgroup in sysfs; None when
    quotas are off or the run has no qgroup (quotas are never turned on for this)."""
    qid = storage.run_qgroup_id(run_id)
    return qgroup_exclusive(pool, qid >> 48, qid & ((1 << 48) - 1))


def subvolume_exclusive_bytes(pool: storage.Pool, subvol_id: int) -> int | None:
    """Bytes only one subvolume holds (its level-0 qgroup); None when quotas are off."""
    return qgroup_exclusive(pool, 0, subvol_id)


def qgroup_exclusive(pool: storage.Pool, level: int, qgroup: int) -> int | None:
    """The exclusive bytes sysfs reports for qgroup ``level/qgroup`` of the pool, or None
    when quotas are off or the qgroup is not there."""
    if not pool.quota_enabled():
        return None
    try:
        path = Path("/sys/fs/btrfs", pool.fsid, "qgroups", f"{level}_{qgroup}", "exclusive")
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# _IOW(BTRFS_IOCTL_MAGIC, 65, struct btrfs_ioctl_subvol_wait {u64 subvolid; u32 mode;
# u32 count}), Linux 6.13+: mode COUNT answers how many deleted subvolumes still wait for
# the cleaner, to any user (listing them, as btrfsutil does, is root's).
_BTRFS_IOC_SUBVOL_SYNC_WAIT = 0x40109441
_SUBVOL_SYNC_COUNT = 2


def pending_deletions(pool: storage.Pool) -> int | None:
    """How many deleted subvolumes of the pool's filesystem still wait for Btrfs's cleaner
    to return their space; None where the kernel cannot say (before Linux 6.13)."""
    args = bytearray(struct.pack("=QII", 0, _SUBVOL_SYNC_COUNT, 0))
    try:
        fd = os.open(pool.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, _BTRFS_IOC_SUBVOL_SYNC_WAIT, args)
        finally:
            os.close(fd)
    except OSError:
        return None
    count: int = struct.unpack("=QII", args)[2]
    return count


def ensure_free_space(pool: storage.Pool, reserve_bytes: int) -> int:
    """Refuse (``StorageError``) when the pool has less than ``reserve_bytes`` available,
    saying whether Btrfs is still returning deleted subvolumes' space (then a retry in a
    few seconds is the fix, not another deletion); returns the available bytes."""
    free = pool.free_bytes()
    if free >= reserve_bytes:
        return free
    below = (f"storage pool {pool.root} has {free >> 20} MiB free, below the reserve of "
             f"{reserve_bytes >> 20} MiB")
    pending = pending_deletions(pool)
    if pending:
        raise StorageError(
            f"{below} while Btrfs still reclaims the space of {pending} deleted "
            "subvolume(s); try again in a few seconds",
            hint="'cairn storage df' shows the free space as it returns",
        )
    hint = "'cairn storage df' shows what each run holds; or grow the pool"
    if pending is None:
        hint += "; space of runs deleted just now may still be returning (up to a minute)"
    raise StorageError(f"{below}; delete finished runs with 'cairn prune'", hint=hint)


def admit(what: str) -> int:
    """Refuse ``what`` (a launch, fork or import) with a one-line ``StorageError`` naming
    the reserve, the free space and ``cairn prune`` when the pool is below the host's
    reserve; returns the free bytes."""
    policy = load_policy()
    pool = storage.Pool.open(paths.pool_dir())
    try:
        return ensure_free_space(pool, policy.reserve_bytes)
    except StorageError as exc:
        raise StorageError(f"{what} refused: {exc.message}", hint=exc.hint) from exc


# --- while agents write -----------------------------------------------------------------


@dataclass(frozen=True)
class PoolWatch:
    """The reserve held while an agent writes: its coordinator checks the pool ten times
    a second (free space net of writes Btrfs has not committed yet,
    :meth:`cairn.storage.Pool.free_bytes`) and stops the agent once the pool is below the
    reserve, before the pool is full and other runs' snapshots or settlements fail."""

    pool: storage.Pool
    reserve: int

    def check(self, what: str) -> None:
        """Raise the one-line ``pool full`` ``StorageError`` when the pool is below the
        reserve; ``what`` names the writer that is stopped."""
        free = self.pool.free_bytes()
        if free < self.reserve:
            raise StorageError(
                f"pool full: {what} stopped: storage pool {self.pool.root} has {free >> 20} "
                f"MiB free, below the reserve of {self.reserve >> 20} MiB",
                hint="'cairn storage df' shows what each run holds; 'cairn rm RUN' or "
                "'cairn prune' frees it; or grow the pool",
            )


def watch() -> PoolWatch:
    """The host pool and its reserve, for :class:`PoolWatch`."""
    return PoolWatch(storage.Pool.open(paths.pool_dir()), load_policy().reserve_bytes)
