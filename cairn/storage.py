"""The Btrfs storage pool: run subvolumes (Q, W, S, P, C, F), receipts, quotas. Making a
loop-image pool is :mod:`cairn.storage_init`.

Only the root broker calls the mutating operations. Every subvolume is identified by its
UUID and its filesystem's UUID (the ``fsid`` that ``BTRFS_IOC_FS_INFO`` returns, the same
UUID ``btrfs filesystem show`` prints and ``/sys/fs/btrfs/<fsid>`` is named after); an
operation on a path that no longer resolves to the recorded pair is refused.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import btrfsutil

from cairn import proc
from cairn.errors import NotFound, ProcessFailed, StorageError, UsageError
from cairn.protocol.broker import SubvolumeReceipt as SubvolumeReceipt  # noqa: PLC0414  (re-export)

log = logging.getLogger(__name__)

# _IOR(BTRFS_IOCTL_MAGIC, 31, struct btrfs_ioctl_fs_info_args); the struct is 1024 bytes
# and the fsid sits at offset 16 (after u64 max_id and u64 num_devices).
_BTRFS_IOC_FS_INFO = 0x8400941F
_FS_INFO_SIZE = 1024
_FSID_OFFSET = 16

# Data Btrfs has promised since its last commit: extents written (bytes_reserved) and
# buffered writes not yet written (bytes_may_use).
_UNCOMMITTED_DATA = ("bytes_reserved", "bytes_may_use")

DEFAULT_RUN_QUOTA_BYTES = 4 << 30
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")

SettlementName = Literal["P", "C", "F"]


def filesystem_uuid(path: Path) -> str:
    """The Btrfs filesystem UUID (hex, dashed) of ``path``; ``StorageError`` if ``path`` is
    not on Btrfs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        buf = bytearray(_FS_INFO_SIZE)
        try:
            fcntl.ioctl(fd, _BTRFS_IOC_FS_INFO, buf)
        except OSError as exc:
            if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                raise StorageError(
                    f"{path} is not on Btrfs",
                    hint="run 'cairn storage init --loop 8G' as root",
                ) from exc
            raise StorageError(f"cannot query the filesystem of {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return str(uuid.UUID(bytes=bytes(buf[_FSID_OFFSET : _FSID_OFFSET + 16])))


def is_btrfs(path: Path) -> bool:
    """Whether ``path`` exists and lives on a Btrfs filesystem."""
    try:
        filesystem_uuid(path)
    except StorageError:
        return False
    return True


def is_same_filesystem(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are on the same Btrfs filesystem (so snapshots can cross)."""
    try:
        return filesystem_uuid(a) == filesystem_uuid(b)
    except StorageError:
        return False


def is_subvolume(path: Path) -> bool:
    """Whether ``path`` is the top directory of a Btrfs subvolume (never follows a final
    symlink)."""
    if path.is_symlink():
        return False
    try:
        return bool(btrfsutil.is_subvolume(os.fspath(path)))
    except btrfsutil.BtrfsUtilError:
        return False


def containing_subvolume(path: Path) -> tuple[Path, Path]:
    """The subvolume that holds ``path`` as reachable here, and ``path`` relative to it.

    Walks up from ``path`` (symlinks resolved) to the nearest subvolume top directory
    on the same filesystem; refuses a path reached through a bind mount of a
    subdirectory, whose containing subvolume is not visible.
    """
    target = path.resolve(strict=True)
    fsid = filesystem_uuid(target)
    probe = target
    while True:
        if is_subvolume(probe):
            return probe, target.relative_to(probe)
        parent = probe.parent
        if parent == probe or not is_btrfs(parent) or filesystem_uuid(parent) != fsid:
            raise StorageError(
                f"{path} is on Btrfs but its subvolume is not reachable from here",
                hint="import the project instead of snapshotting it in place",
            )
        probe = parent


def receipt(path: Path) -> SubvolumeReceipt:
    """The identity of the subvolume whose top directory is ``path``."""
    if not is_subvolume(path):
        if not path.exists() and not path.is_symlink():
            raise NotFound(f"subvolume {path} does not exist")
        raise StorageError(f"{path} is not a Btrfs subvolume")
    p = os.fspath(path)
    try:
        info = btrfsutil.subvolume_info(p)
        read_only = bool(btrfsutil.get_subvolume_read_only(p))
    except btrfsutil.BtrfsUtilError as exc:
        raise StorageError(f"cannot read subvolume {path}: {exc}") from exc
    return SubvolumeReceipt(
        path=p,
        subvol_id=int(info.id),
        uuid=bytes(info.uuid).hex(),
        fsid=filesystem_uuid(path),
        read_only=read_only,
        generation=int(info.generation),
    )


def parent_uuid(path: Path) -> str:
    """The UUID of the subvolume ``path`` was snapshotted from (zeros if none)."""
    try:
        return bytes(btrfsutil.subvolume_info(os.fspath(path)).parent_uuid).hex()
    except btrfsutil.BtrfsUtilError as exc:
        raise StorageError(f"cannot read subvolume {path}: {exc}") from exc


def verify(path: Path, expected: SubvolumeReceipt) -> SubvolumeReceipt:
    """Refuse unless ``path`` still resolves to the subvolume ``expected`` names; returns
    the current receipt (its generation may have moved on)."""
    try:
        current = receipt(path)
    except NotFound as exc:
        raise StorageError(
            f"subvolume {path} is gone (receipt uuid {expected.uuid})",
            hint="inspect the pool; do not recreate it by hand",
        ) from exc
    if current.uuid != expected.uuid or current.fsid != expected.fsid:
        raise StorageError(
            f"{path} is no longer the recorded subvolume (uuid {current.uuid}, "
            f"receipt {expected.uuid})",
            hint="something replaced it; inspect the pool before retrying",
        )
    return current


def metadata_stream(q: Path, p: Path) -> bytes:
    """``btrfs send --no-data -p Q P``: the kernel's description of how read-only ``p``
    differs from read-only ``q`` (root only). Root passes the bytes on and never parses
    them; :func:`cairn.settle.changes.changes_in` does, in the owner's candidate unit."""
    # the stream is metadata only, so it stays small
    return proc.run(_metadata_send(q, p)).stdout


def _metadata_send(base: Path, snap: Path) -> list[str | os.PathLike[str]]:
    """The argv of ``btrfs send --no-data -p BASE SNAP``, both checked to be read-only
    subvolumes (the kernel refuses anything else less clearly); -q keeps progress text
    off stderr."""
    for path in (base, snap):
        try:
            if not btrfsutil.get_subvolume_read_only(os.fspath(path)):
                raise StorageError(f"{path} must be a read-only snapshot to compute changes")
        except btrfsutil.BtrfsUtilError as exc:
            raise StorageError(f"{path} is not a Btrfs subvolume: {exc}") from exc
    return ["btrfs", "-q", "send", "--no-data", "-p", base, snap]


# A send stream: its magic and version, then commands, each a header (payload length,
# command, crc32c) and its payload. The frame (SUBVOL, SNAPSHOT, END) and UTIMES change no
# content: reading a file moves its atime, a file made and removed again its directory's.
_STREAM_MAGIC = b"btrfs-stream\x00"
_COMMAND_HEADER = struct.Struct("<IHI")
_FRAME_OR_TIMES = frozenset({1, 2, 20, 21})


def content_changed(base: Path, snap: Path) -> bool:
    """Whether read-only ``snap`` differs from read-only ``base`` in more than file times:
    a name, type, mode, link, xattr or extent (root only). Reads ``btrfs send --no-data
    -p BASE SNAP`` as it comes, only its commands' headers (never a path), and stops at
    the first change: an agent that changed much costs no more than one that changed
    little."""
    with proc.reading(_metadata_send(base, snap)) as stream:
        magic = stream.read(len(_STREAM_MAGIC) + 4)
        if not magic.startswith(_STREAM_MAGIC):
            raise StorageError(f"btrfs send of {snap} gave no send stream")
        while header := stream.read(_COMMAND_HEADER.size):
            if len(header) < _COMMAND_HEADER.size:
                raise StorageError(f"btrfs send of {snap} gave a cut-off send stream")
            length, command, _crc = _COMMAND_HEADER.unpack(header)
            if command not in _FRAME_OR_TIMES:
                return True
            if len(stream.read(length)) < length:
                raise StorageError(f"btrfs send of {snap} gave a cut-off send stream")
    return False


class Pool:
    """A directory of run subvolumes on one Btrfs filesystem (ARCHITECTURE §6)."""

    def __init__(self, root: Path, fsid: str) -> None:
        self.root = root
        self.fsid = fsid
        self._data_allocation = Path("/sys/fs/btrfs", fsid, "allocation", "data")

    @classmethod
    def open(cls, root: Path) -> Pool:
        """Open the pool at ``root`` (a directory or subvolume on Btrfs)."""
        if not root.is_dir():
            raise NotFound(
                f"storage pool {root} does not exist",
                hint="run 'cairn storage init --loop 8G' as root",
            )
        try:
            fsid = filesystem_uuid(root)
        except StorageError as exc:
            raise StorageError(
                f"storage pool {root} is not on Btrfs",
                hint="run 'cairn storage init --loop 8G' as root",
            ) from exc
        return cls(root, fsid)

    # -- layout -------------------------------------------------------------------------

    def run_dir(self, run: str) -> Path:
        return self.root / "runs" / _checked_name(run, "run")

    def q_path(self, run: str) -> Path:
        return self.run_dir(run) / "Q"

    def q_import_path(self, run: str) -> Path:
        return self.run_dir(run) / "Q.import"

    def w_path(self, run: str, scope: str, gen: int) -> Path:
        if gen < 0:
            raise UsageError(f"workspace generation must be >= 0, not {gen}")
        return self.run_dir(run) / "scopes" / _checked_name(scope, "scope") / f"W.{gen}"

    def checkpoint_path(self, run: str, op: str) -> Path:
        return self.run_dir(run) / "checkpoints" / _checked_name(op, "operation")

    def settlement_path(self, run: str, name: SettlementName) -> Path:
        if name not in ("P", "C", "F"):
            raise UsageError(f"settlement subvolume must be P, C or F, not {name!r}")
        return self.run_dir(run) / name

    def run_subvolumes(self, run: str) -> list[Path]:
        """Every layout subvolume of ``run`` that exists, deepest first."""
        rd = self.run_dir(run)
        found: list[Path] = []
        scopes = rd / "scopes"  # each scope's W generations and hot spare
        if scopes.is_dir():
            for scope in sorted(scopes.iterdir()):
                if scope.is_dir() and not scope.is_symlink():
                    found.extend(p for p in sorted(scope.iterdir()) if is_subvolume(p))
        ckpt = rd / "checkpoints"
        if ckpt.is_dir():
            found.extend(p for p in sorted(ckpt.iterdir()) if is_subvolume(p))
        found.extend(rd / n for n in ("F", "C", "P", "Q.import", "Q") if is_subvolume(rd / n))
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    # -- operations ---------------------------------------------------------------------

    def _check_inside(self, path: Path) -> None:
        try:
            path.relative_to(self.root)
        except ValueError as exc:
            raise StorageError(f"{path} is outside the storage pool {self.root}") from exc

    def _prepare_parent(self, dst: Path) -> None:
        self._check_inside(dst)
        dst.parent.mkdir(parents=True, exist_ok=True, mode=0o755)

    def create_subvolume(
        self, dst: Path, *, owner: tuple[int, int] | None = None, qgroup: int | None = None
    ) -> SubvolumeReceipt:
        """Create an empty writable subvolume at ``dst`` (owned by ``owner`` if given).

        An existing writable, non-snapshot subvolume at ``dst`` is taken as this very
        operation finished before a crash, and its receipt is returned.
        """
        if dst.exists() or dst.is_symlink():
            if not is_subvolume(dst):
                raise StorageError(f"{dst} exists and is not a subvolume")
            rec = receipt(dst)
            if rec.read_only or parent_uuid(dst) != "00" * 16:
                raise StorageError(f"{dst} exists and is not the expected empty subvolume")
            return rec
        self._prepare_parent(dst)
        self._refuse_if_quota_unusable()
        try:
            btrfsutil.create_subvolume(os.fspath(dst), **_inherit(qgroup))
        except btrfsutil.BtrfsUtilError as exc:
            raise StorageError(f"cannot create subvolume {dst}: {exc}") from exc
        if owner is not None:
            os.chown(dst, owner[0], owner[1])
        log.info("created subvolume %s", dst)
        return receipt(dst)

    def snapshot(
        self, src: Path, dst: Path, *, read_only: bool, qgroup: int | None = None
    ) -> SubvolumeReceipt:
        """Snapshot subvolume ``src`` at ``dst``.

        If ``dst`` already is a snapshot of ``src`` with the same read-only flag (a crash
        after the snapshot), its receipt is returned; anything else at ``dst`` is refused.
        """
        if not is_subvolume(src):
            raise StorageError(f"snapshot source {src} is not a subvolume")
        src_uuid = receipt(src).uuid
        if dst.exists() or dst.is_symlink():
            if is_subvolume(dst):
                rec = receipt(dst)
                if parent_uuid(dst) == src_uuid and rec.read_only == read_only:
                    return rec
            raise StorageError(f"{dst} exists and is not a snapshot of {src}")
        self._prepare_parent(dst)
        self._refuse_if_quota_unusable()
        try:
            btrfsutil.create_snapshot(
                os.fspath(src), os.fspath(dst), read_only=read_only, **_inherit(qgroup)
            )
        except btrfsutil.BtrfsUtilError as exc:
            if exc.errno == errno.ENOSPC:
                raise  # the broker names the full pool and what frees it
            raise StorageError(f"cannot snapshot {src} to {dst}: {exc}") from exc
        log.info("snapshot %s -> %s%s", src, dst, " (read-only)" if read_only else "")
        return receipt(dst)

    def receipt(self, path: Path) -> SubvolumeReceipt:
        return receipt(path)

    def remint(
        self, src: Path, expected: SubvolumeReceipt, dst: Path, *, qgroup: int | None = None
    ) -> SubvolumeReceipt:
        """Another run's read-only snapshot ``src``, still the one ``expected`` names, as a
        new read-only subvolume at ``dst`` of its own (a new UUID; ``src`` untouched)."""
        self._check_inside(src)
        self._check_inside(dst)
        verify(src, expected)
        if not expected.read_only or not receipt(src).read_only:
            raise StorageError(f"{src} is not a read-only snapshot; only those are reminted")
        return self.snapshot(src, dst, read_only=True, qgroup=qgroup)

    def verify(self, path: Path, expected: SubvolumeReceipt) -> SubvolumeReceipt:
        return verify(path, expected)

    def delete(self, path: Path, expected: SubvolumeReceipt) -> None:
        """Delete the subvolume at ``path`` (and any subvolumes nested in it) if it is
        still the one ``expected`` names; an already absent path is done."""
        self._check_inside(path)
        if not path.exists() and not path.is_symlink():
            return
        verify(path, expected)
        _delete_subvolume(path)

    def delete_run(self, run: str) -> list[str]:
        """Delete every subvolume of ``run`` (deepest first) and its directories; returns
        the deleted paths. The run's qgroup, if any, is destroyed too."""
        deleted: list[str] = []
        for sub in self.run_subvolumes(run):
            _delete_subvolume(sub)
            deleted.append(os.fspath(sub))
        rd = self.run_dir(run)
        if rd.exists():
            # An agent may have made subvolumes of its own in its scratch space (/state);
            # they belong to the run and go with it.
            for leftover in _subvolumes_under(rd):
                if filesystem_uuid(leftover) != self.fsid:
                    raise StorageError(f"{leftover} in run {run} is on another filesystem")
                _delete_subvolume(leftover)
                deleted.append(os.fspath(leftover))
            shutil.rmtree(rd)
        if self.quota_enabled():
            proc.run(["btrfs", "qgroup", "destroy", run_qgroup_name(run), self.root], check=False)
        return deleted

    # -- quotas and space ---------------------------------------------------------------

    def quota_enabled(self) -> bool:
        """Whether Btrfs quotas are on for the pool's filesystem (sysfs ``qgroups/``
        exists only then)."""
        return Path("/sys/fs/btrfs", self.fsid, "qgroups").is_dir()

    def quota_problem(self) -> str | None:
        """Why quota data cannot be trusted right now (inconsistent or rescanning), or
        None when it can or quotas are off."""
        if not self.quota_enabled():
            return None
        flag = Path("/sys/fs/btrfs", self.fsid, "qgroups", "inconsistent")
        if flag.exists() and flag.read_text().strip() not in ("", "0"):
            return "quota data is inconsistent"
        out = proc.run(["btrfs", "quota", "rescan", "-s", self.root], check=False)
        text = (out.stdout or b"").decode(errors="replace").lower()
        if out.returncode == 0 and "no rescan" not in text and "rescan" in text:
            return "a quota rescan is running"
        return None

    def _refuse_if_quota_unusable(self) -> None:
        problem = self.quota_problem()
        if problem:
            raise StorageError(
                f"storage pool {self.root}: {problem}; refusing to take a snapshot",
                hint="wait for 'btrfs quota rescan -w' to finish, then retry",
            )

    def ensure_run_qgroup(self, run: str, limit_bytes: int = DEFAULT_RUN_QUOTA_BYTES) -> int | None:
        """With quotas on, make the run's level-1 qgroup with an exclusive limit and return
        its packed id (pass it as ``qgroup=`` when creating the run's subvolumes); with
        quotas off, None. Never enables quotas."""
        if not self.quota_enabled():
            return None
        name = run_qgroup_name(run)
        try:
            proc.run(["btrfs", "qgroup", "create", name, self.root])
        except ProcessFailed as exc:
            if "exist" not in exc.stderr.lower():
                raise StorageError(f"cannot create qgroup {name}: {exc.message}") from exc
        proc.run(["btrfs", "qgroup", "limit", "-e", str(limit_bytes), name, self.root])
        return run_qgroup_id(run)

    def free_bytes(self) -> int:
        """Bytes still free for data: statfs's available space less the data Btrfs has
        handed to writes since its last transaction commit. statfs counts those only at
        the commit (every 30 s, or when a new chunk is allocated), so alone it stays up to
        a data chunk too high while someone writes."""
        st = os.statvfs(self.root)
        return max(0, st.f_bavail * st.f_frsize - self.uncommitted_data_bytes())

    def uncommitted_data_bytes(self) -> int:
        """Data space Btrfs has reserved for writes it has not committed (sysfs
        ``allocation/data/bytes_reserved`` plus ``bytes_may_use``, readable by anyone); 0
        where sysfs does not say."""
        try:
            return sum(
                int((self._data_allocation / name).read_text()) for name in _UNCOMMITTED_DATA
            )
        except (OSError, ValueError):
            return 0


def run_qgroup_id(run: str) -> int:
    """The packed level-1 qgroup id of a run: ``1/<first 48 bits of the run's hex>``."""
    _checked_name(run, "run")
    digits = run.rsplit("_", 1)[-1]
    if not re.fullmatch(r"[0-9a-f]{12,}", digits):
        raise UsageError(f"run id {run!r} has no hex suffix to derive a qgroup from")
    return (1 << 48) | int(digits[:12], 16)


def run_qgroup_name(run: str) -> str:
    qid = run_qgroup_id(run)
    return f"{qid >> 48}/{qid & ((1 << 48) - 1)}"


def _inherit(qgroup: int | None) -> dict[str, object]:
    """Keyword arguments that put a new subvolume into ``qgroup`` (btrfsutil rejects an
    explicit None)."""
    if qgroup is None:
        return {}
    inherit = btrfsutil.QgroupInherit()
    inherit.add_group(qgroup)
    return {"qgroup_inherit": inherit}


def _checked_name(name: str, what: str) -> str:
    if not _NAME_RE.match(name) or name in (".", ".."):
        raise UsageError(f"invalid {what} name {name!r}")
    return name


def _subvolumes_under(top: Path) -> Iterator[Path]:
    """Subvolumes below ``top`` that are reached through plain directories (never through
    a symlink, never into a subvolume: deleting it deletes what it holds)."""
    for dirpath, dirnames, _files in os.walk(top):
        for name in list(dirnames):
            path = Path(dirpath, name)
            if is_subvolume(path):
                dirnames.remove(name)
                yield path


def _delete_subvolume(path: Path) -> None:
    """Delete the subvolume at ``path`` with every subvolume nested in it, also those an
    agent made read-only (a read-only subvolume cannot lose a nested one otherwise)."""
    p = os.fspath(path)
    try:
        nested = [
            os.path.join(p, rel) for rel, _id in btrfsutil.SubvolumeIterator(p, post_order=True)
        ]
        for sub in [p, *nested] if nested else []:
            if btrfsutil.get_subvolume_read_only(sub):
                btrfsutil.set_subvolume_read_only(sub, False)
        btrfsutil.delete_subvolume(p, recursive=True)
    except btrfsutil.BtrfsUtilError as exc:
        raise StorageError(f"cannot delete subvolume {path}: {exc}") from exc
    log.info("deleted subvolume %s%s", path, f" and {len(nested)} nested in it" if nested else "")
