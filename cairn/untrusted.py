"""Reading what a less trusted process left behind (ARCHITECTURE §8): the one way.

Everything an agent can write (``/outputs``, ``/workspace``, ``/state``, the proposal P)
and everything the run owner's helper units write (import stats, apply results) is
hostile input to the coordinator, the broker and apply. Such a file is reached only
through this module:

- relative to a *trusted* directory (a path the reader created, or a dir fd), never
  following a symbolic link in any component (``openat2`` with ``RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``; where the kernel or a seccomp filter
  refuses ``openat2``, a per-component ``O_NOFOLLOW`` walk that is just as strict);
- opened ``O_NONBLOCK | O_NOCTTY | O_CLOEXEC``, so a FIFO or a device never blocks;
- checked with ``fstat`` on the open file: a regular file, of an expected owner, with
  one link (unless the caller says hard links are legitimate), no larger than a limit;
- read to at most ``limit + 1`` bytes, refused when that much arrives.

Every refusal is an :class:`UntrustedFileError` with a one-line message; an absent file
is its subclass :class:`UntrustedFileMissing`.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import logging
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, Self, TypeVar

from cairn.errors import CairnError
from cairn.pathrules import plain_parts

if TYPE_CHECKING:  # for the type checker only: the root broker loads this module
    from cairn.protocol.jsonvalue import JSONValue

__all__ = [
    "Dirs",
    "UntrustedFileError",
    "UntrustedFileMissing",
    "is_regular_file",
    "kind_of",
    "list_names",
    "lstat",
    "open_dir",
    "open_file",
    "read_bytes",
    "read_json",
    "read_text",
    "readlink",
    "write_new",
]

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

Base = Path | int
"""A trusted directory: a path the caller vouches for, or an open directory fd."""
Owners = int | Collection[int] | None
"""Acceptable ``st_uid`` values; ``None`` accepts any owner (read-only snapshots only)."""

_SYS_OPENAT2 = 437  # the same number on every architecture Cairn targets
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC  # search permission is enough
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
DIRS_OPEN = 128  # directory fds one :class:`OpenDirs` keeps open (well below the default 1,024)


class UntrustedFileError(CairnError):
    """A file written by a less trusted process was refused (link, type, owner, size).
    ``reason`` is the message without the file's location."""

    code = "untrusted-file"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.reason = reason


class UntrustedFileMissing(UntrustedFileError):
    """The file (or a directory on its way) does not exist."""

    code = "untrusted-file-missing"


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
# None: not tried yet; False: the kernel or a seccomp filter refuses it (use the walk).
openat2_works: bool | None = None


def _openat2(dir_fd: int, rel: str, flags: int) -> int:
    how = _OpenHow(
        flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    )
    for _ in range(8):  # EAGAIN: a concurrent rename; the kernel asks to try again
        fd = int(
            _libc.syscall(
                ctypes.c_long(_SYS_OPENAT2),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(os.fsencode(rel)),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), rel)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


def _walk_open(dir_fd: int, parts: list[str], flags: int) -> int:
    """``openat`` one component at a time, each with ``O_NOFOLLOW``."""
    cur = dir_fd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=cur)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=cur)
    finally:
        if cur != dir_fd:
            os.close(cur)


def _parts(rel: str) -> list[str]:
    parts = plain_parts(rel)
    if parts is None:
        raise UntrustedFileError(repr(rel), "not a plain relative path")
    return parts


@contextmanager
def _dir_fd(base: Base) -> Iterator[int]:
    if isinstance(base, int):
        yield base
        return
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UntrustedFileMissing(str(base), "does not exist") from None
    except OSError as exc:
        raise UntrustedFileError(str(base), f"cannot open: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _where(base: Base, rel: str) -> str:
    return f"{base}/{rel}" if isinstance(base, Path) else rel


def _open_beneath(dir_fd: int, rel: str, flags: int, where: str) -> int:
    """Open ``rel`` beneath ``dir_fd`` following no link; typed errors for refusals."""
    global openat2_works  # noqa: PLW0603  (learnt once per process: the kernel's answer)
    parts = _parts(rel)
    try:
        if openat2_works is not False:
            try:
                fd = _openat2(dir_fd, rel, flags)
                openat2_works = True
                return fd
            except OSError as exc:
                if openat2_works or exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                    raise
                openat2_works = False
        return _walk_open(dir_fd, parts, flags)
    except OSError as exc:
        raise _refusal(exc, where) from None


def _refusal(exc: OSError, where: str) -> UntrustedFileError:
    """The typed error for an open that the kernel refused."""
    if exc.errno == errno.ENOENT:
        return UntrustedFileMissing(where, "does not exist")
    if exc.errno in (errno.ELOOP, errno.EXDEV):
        return UntrustedFileError(where, "a symbolic link on the way; not followed")
    if exc.errno == errno.ENOTDIR:
        return UntrustedFileError(where, "a component is not a directory")
    return UntrustedFileError(where, f"cannot open: {exc.strerror}")


def _open_in(base: Dirs, rel: str, flags: int) -> int:
    """:func:`_open_beneath` from the parent of ``rel`` that ``base`` holds open (reached
    following no link): the last component is opened ``O_NOFOLLOW``."""
    dir_fd, name = base.parent(rel)
    try:
        return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, _where(base.base, rel)) from None


def _logged(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Log every refusal but an absent file: a planted link or FIFO is worth a line."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except UntrustedFileMissing:
            raise
        except UntrustedFileError as exc:
            log.warning("refused: %s", exc)
            raise

    return wrapper


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a refusal: "a symbolic link", "a FIFO", ..."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check_owner(st: os.stat_result, where: str, owner: Owners) -> None:
    if owner is not None:
        owners = {owner} if isinstance(owner, int) else set(owner)
        if st.st_uid not in owners:
            wanted = " or ".join(str(u) for u in sorted(owners))
            raise UntrustedFileError(where, f"belongs to uid {st.st_uid}, not {wanted}")


def _check(st: os.stat_result, where: str, owner: Owners, single_link: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedFileError(where, f"{kind_of(st.st_mode)}, not a regular file")
    _check_owner(st, where, owner)
    if single_link and st.st_nlink != 1:
        raise UntrustedFileError(where, f"{st.st_nlink} hard links; expected one")


@_logged
def open_file(
    base: Base | Dirs, rel: str, *, owner: Owners, limit: int, single_link: bool = True
) -> int:
    """An fd (the caller closes it) of the regular file ``rel`` beneath ``base``, opened
    without following any link and without blocking, owned by ``owner``, with one link
    unless ``single_link`` is False, and at most ``limit`` bytes large when opened."""
    if isinstance(base, Dirs):
        where = _where(base.base, rel)
        fd = _open_in(base, rel, _READ_FLAGS)
    else:
        where = _where(base, rel)
        with _dir_fd(base) as dir_fd:
            fd = _open_beneath(dir_fd, rel, _READ_FLAGS, where)
    try:
        st = os.fstat(fd)
        _check(st, where, owner, single_link)
        if st.st_size > limit:
            raise UntrustedFileError(where, f"larger than {limit} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd


@_logged
def read_bytes(
    base: Base, rel: str, *, owner: Owners, limit: int, single_link: bool = True
) -> bytes:
    """The content of ``rel`` beneath ``base`` under the checks of :func:`open_file`;
    refused if more than ``limit`` bytes arrive (the file may grow while read)."""
    fd = open_file(base, rel, owner=owner, limit=limit, single_link=single_link)
    chunks: list[bytes] = []
    got = 0
    try:
        while got <= limit:
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise UntrustedFileError(_where(base, rel), f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if got > limit:
        raise UntrustedFileError(_where(base, rel), f"larger than {limit} bytes")
    return b"".join(chunks)


@_logged
def read_text(base: Base, rel: str, *, owner: Owners, limit: int) -> str:
    """:func:`read_bytes` decoded as strict UTF-8."""
    data = read_bytes(base, rel, owner=owner, limit=limit)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise UntrustedFileError(_where(base, rel), "not UTF-8 text") from None


@_logged
def read_json(base: Base, rel: str, *, owner: Owners, limit: int) -> JSONValue:
    """:func:`read_bytes` parsed as JSON."""
    data = read_bytes(base, rel, owner=owner, limit=limit)
    try:
        value: JSONValue = json.loads(data)
    except (ValueError, RecursionError):
        raise UntrustedFileError(_where(base, rel), "not valid JSON") from None
    return value


@_logged
def open_dir(base: Base, rel: str, *, owner: Owners) -> int:
    """An fd (the caller closes it) of the directory ``rel`` beneath ``base`` that
    :func:`list_names` can list, reached without following any link, owned by
    ``owner``; a link or anything but a directory is refused."""
    where = _where(base, rel)
    with _dir_fd(base) as dir_fd:
        fd = _open_beneath(dir_fd, rel, _LIST_FLAGS, where)
    try:
        _check_owner(os.fstat(fd), where, owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def list_names(dir_fd: int, *, limit: int) -> tuple[list[str], bool]:
    """The names in the directory ``dir_fd`` (from :func:`open_dir`), at most ``limit``
    of them, and whether any were left unread: a directory of millions of entries costs
    no more than ``limit`` to look at."""
    names: list[str] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if len(names) == limit:
                return names, True
            names.append(entry.name)
    return names, False


def is_regular_file(base: Base, rel: str, *, owner: Owners) -> bool:
    """Whether ``rel`` beneath ``base`` is a regular file of ``owner`` with one link,
    reached without following any link. Opens with ``O_PATH`` only: never reads, never
    blocks, no side effect on a device. A refusal of any kind is False."""
    try:
        with _dir_fd(base) as dir_fd:
            fd = _open_beneath(dir_fd, rel, _PATH_FLAGS, _where(base, rel))
    except UntrustedFileMissing:
        return False
    except UntrustedFileError as exc:
        log.warning("refused: %s", exc)
        return False
    try:
        _check(os.fstat(fd), _where(base, rel), owner, True)
    except UntrustedFileError as exc:
        log.warning("refused: %s", exc)
        return False
    finally:
        os.close(fd)
    return True


@contextmanager
def _parent(base: Base, rel: str) -> Iterator[tuple[int, str]]:
    """The fd of the directory holding ``rel`` (reached following no link) and the name."""
    parts = _parts(rel)
    with _dir_fd(base) as dir_fd:
        if len(parts) == 1:
            yield dir_fd, parts[0]
            return
        parent = "/".join(parts[:-1])
        fd = _open_beneath(dir_fd, parent, _DIR_FLAGS, _where(base, parent))
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)


class OpenDirs:
    """Directory fds beneath one root, each opened by the subclass without following a
    link and kept open for many look-ups (the most recently used :data:`DIRS_OPEN`) in
    a tree that does not change under the reader, or one only the reader writes
    (:meth:`forget` a directory it removed). Use as a context manager."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fds: OrderedDict[str, int] = OrderedDict()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        os.close(self.root_fd)

    def cached(self, rel: str) -> int | None:
        """The open fd of ``rel`` (now the most recently used), or None."""
        fd = self.fds.get(rel)
        if fd is not None:
            self.fds.move_to_end(rel)
        return fd

    def keep(self, rel: str, fd: int) -> int:
        """Hold ``fd`` as the directory ``rel``, closing the least recently used beyond
        :data:`DIRS_OPEN`; returns ``fd``."""
        self.fds[rel] = fd
        while len(self.fds) > DIRS_OPEN:
            os.close(self.fds.popitem(last=False)[1])
        return fd

    def forget(self, rel: str) -> None:
        """Close what is open at or below ``rel`` (a directory just removed)."""
        for key in [k for k in self.fds if k == rel or k.startswith(rel + "/")]:
            os.close(self.fds.pop(key))


class Dirs(OpenDirs):
    """The directories beneath a trusted root, each opened as :func:`open_file` reaches
    one (no link followed in any component, ``O_PATH``)."""

    def dir(self, rel: str) -> int:
        """The fd of the directory ``rel`` ("" is the root), valid until the next call;
        :class:`UntrustedFileError` (or :class:`UntrustedFileMissing`) as :func:`lstat`
        would raise for an entry below it."""
        if not rel:
            return self.root_fd
        fd = self.cached(rel)
        if fd is not None:
            return fd
        return self.keep(rel, _open_beneath(self.root_fd, rel, _DIR_FLAGS,
                                            _where(self.base, rel)))

    def parent(self, rel: str) -> tuple[int, str]:
        """The fd of the directory holding ``rel`` (see :meth:`dir`) and its last name.
        :func:`lstat`, :func:`open_file` and :func:`readlink` take a :class:`Dirs` as
        their ``base`` and read through it."""
        head, _, name = rel.rpartition("/")
        _parts(rel)
        return self.dir(head), name


@_logged
def lstat(base: Base | Dirs, rel: str) -> os.stat_result:
    """``lstat`` of ``rel`` beneath ``base`` where no *parent* component may be a link
    (the last one is not followed either). Absent: :class:`UntrustedFileMissing`."""
    if isinstance(base, Dirs):
        dir_fd, name = base.parent(rel)
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise UntrustedFileMissing(_where(base.base, rel), "does not exist") from None
    with _parent(base, rel) as (dir_fd, name):
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise UntrustedFileMissing(_where(base, rel), "does not exist") from None


@_logged
def readlink(base: Base | Dirs, rel: str) -> str:
    """The target of the symbolic link ``rel`` beneath ``base`` (no parent followed)."""
    if isinstance(base, Dirs):
        dir_fd, name = base.parent(rel)
        try:
            return os.readlink(name, dir_fd=dir_fd)
        except OSError as exc:
            raise UntrustedFileError(_where(base.base, rel), str(exc.strerror)) from None
    with _parent(base, rel) as (dir_fd, name):
        try:
            return os.readlink(name, dir_fd=dir_fd)
        except OSError as exc:
            raise UntrustedFileError(_where(base, rel), str(exc.strerror)) from None


@_logged
def remove(base: Base, name: str) -> None:
    """Unlink ``name`` in ``base`` (a directory a less trusted user may write) if it is
    there, whatever it is but a directory, never following it."""
    (name,) = _parts(name)
    with _dir_fd(base) as dir_fd:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UntrustedFileError(_where(base, name), "a directory") from None


@_logged
def write_new(base: Base, name: str, data: bytes, *, mode: int, uid: int, gid: int) -> None:
    """Replace ``name`` in ``base`` (a directory a less trusted user may write) with a new
    file: whatever was there is unlinked, never written through; ``O_EXCL|O_NOFOLLOW``
    refuses anything planted in between."""
    (name,) = _parts(name)
    with _dir_fd(base) as dir_fd:
        remove(dir_fd, name)
        try:
            fd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
        except FileExistsError:
            raise UntrustedFileError(_where(base, name), "reappeared; not written") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
