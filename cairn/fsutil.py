"""Durable file replacement, the one way Cairn writes a file that must survive a crash
whole: a reader sees the old content or the new, never part of either, and once the call
returns the new content and its name are on disk. Also the one way Cairn copies a file's
data between descriptors (:func:`copy_file_data`), and makes the world-readable
directories a less trusted reader gets (:func:`mkdirs_public`)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import secrets
from pathlib import Path


def mkdirs_public(path: Path) -> None:
    """Create ``path`` and missing parents, each world-readable (0755, umask aside): what
    the coordinator lays out for agents to read through a read-only bind."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir()
        os.chmod(directory, 0o755)  # noqa: S103  (world-readable is this helper's contract)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a create, rename or unlink) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data``: write a new temporary file in the same directory,
    fsync it, rename it over ``path``, then fsync the directory so the rename survives a
    crash too. ``mode`` sets the file's permissions; without it they follow the umask."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666)
    try:
        with open(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def syncfs(fd: int) -> None:
    """Make everything written to the filesystem holding ``fd`` durable, in one commit
    (``syncfs(2)``; on Btrfs one transaction instead of a log commit per file). Where a
    seccomp filter refuses it, ``sync(2)`` does the same for every filesystem."""
    if _libc().syncfs(fd) != 0:
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM):
            raise OSError(err, os.strerror(err))
        os.sync()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


_FICLONE = 0x40049409
_CHUNK = 1 << 20
_BTRFS_SUPER_MAGIC = 0x9123683E
_STATFS_SIZE = 256  # struct statfs is 120 bytes on 64-bit Linux; its f_type comes first


def on_btrfs(fd: int) -> bool:
    """Whether the filesystem holding ``fd`` is Btrfs (``fstatfs(2)``'s ``f_type``)."""
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _libc().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF == _BTRFS_SUPER_MAGIC


def clone_file(src_fd: int, dst_fd: int) -> bool:
    """Make ``dst_fd`` share every byte of ``src_fd`` (a reflink, ``FICLONE``: metadata
    only, no data written); False where the filesystem cannot (then nothing changed)."""
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
    except OSError:
        return False  # not the same filesystem, or no reflink support
    return True


def copy_file_data(src_fd: int, dst_fd: int) -> int:
    """Copy every byte of ``src_fd`` to ``dst_fd`` (a reflink when the filesystem can);
    the number of bytes ``dst_fd`` then holds."""
    if clone_file(src_fd, dst_fd):
        return os.fstat(dst_fd).st_size
    return copy_bytes(src_fd, dst_fd)


def copy_bytes(src_fd: int, dst_fd: int) -> int:
    """Write every byte read from ``src_fd`` to ``dst_fd``; the number written."""
    total = 0
    while True:
        chunk = os.read(src_fd, _CHUNK)
        if not chunk:
            return total
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view) :]
        total += len(chunk)


# What a filesystem answers when it cannot hold an extended attribute: none at all, none
# of this size, or no room left for it.
XATTR_REFUSED = frozenset({errno.ENOTSUP, errno.E2BIG, errno.ERANGE, errno.ENOSPC,
                           errno.EDQUOT})


def copy_user_xattrs(src: int | str, dst: int | str, *, fresh: bool = False) -> list[str]:
    """Make the ``user.*`` xattrs of ``dst`` those of ``src`` (open fds, or the
    ``/proc/self/fd`` names of ``O_PATH`` fds); ``fresh``: ``dst`` was just created, so
    it has none yet. Returns the names ``dst``'s filesystem refused to hold
    (:data:`XATTR_REFUSED`); nothing is copied from a filesystem without xattrs."""
    try:
        wanted = sorted(n for n in os.listxattr(src) if n.startswith("user."))
        have = set() if fresh else {n for n in os.listxattr(dst) if n.startswith("user.")}
    except OSError as exc:
        if exc.errno == errno.ENOTSUP:
            return []
        raise
    for name in have - set(wanted):
        os.removexattr(dst, name)
    refused = []
    for name in wanted:
        try:
            os.setxattr(dst, name, os.getxattr(src, name))
        except OSError as exc:
            if exc.errno not in XATTR_REFUSED:
                raise
            refused.append(name)
    return refused
