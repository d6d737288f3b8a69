"""The entries of a tree as the three-way apply compares them (:class:`EntryState`),
read through :class:`Tree`: every directory reached component by component from the
root without following a symlink, and kept open for the walk."""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cairn.pathrules import check_relative, parent
from cairn.untrusted import OpenDirs

_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

EntryKind = Literal["absent", "file", "dir", "symlink", "other", "blocked"]


@dataclass(frozen=True, slots=True)
class EntryState:
    """What apply compares: type, permission bits, content hash, symlink target.
    ``blocked`` means a parent directory is missing as a directory (e.g. a symlink)."""

    kind: EntryKind
    mode: int = 0
    sha256: str = ""
    target: str = ""


ABSENT = EntryState(kind="absent")


class Blocked(Exception):
    """A component of the path exists but is not a directory (a symlink, a file)."""


class Tree(OpenDirs):
    """The directories of one root, each opened from its parent (``O_NOFOLLOW``, so
    listable) and kept open for the walk. ``settled``: the tree does not change during
    the walk (a read-only snapshot, or the live tree while only being classified: every
    write re-checks its target), so a directory found missing is remembered as missing."""

    def __init__(self, root: Path, settled: bool = False) -> None:
        super().__init__(root)
        self.missing: set[str] | None = set() if settled else None

    def dir(self, rel: str) -> int | None:
        """The fd of directory ``rel`` ("" is the root); None when a component is missing;
        raises ``Blocked`` when a component exists but is not a directory. Valid until
        the next call."""
        if not rel:
            return self.root_fd
        fd = self.cached(rel)
        if fd is not None:
            return fd
        if self.missing is not None and rel in self.missing:
            return None
        head, _, name = rel.rpartition("/")
        pfd = self.dir(head)
        if pfd is None:
            return None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
        except FileNotFoundError:
            if self.missing is not None:
                self.missing.add(rel)
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                raise Blocked(rel) from exc
            raise
        return self.keep(rel, fd)

    def parent(self, path: str) -> int | None:
        return self.dir(parent(path))

    def state(self, path: str) -> EntryState:
        """The state of ``path`` in this tree."""
        try:
            fd = self.parent(path)
        except Blocked:
            return EntryState(kind="blocked")
        if fd is None:
            return ABSENT
        return state_in(fd, path.rpartition("/")[2])


EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def same_state(a: EntryState, b: EntryState) -> bool:
    """``a == b``, field by field (the three-way check's comparison, made often)."""
    return (a.kind, a.mode, a.sha256, a.target) == (b.kind, b.mode, b.sha256, b.target)


@functools.lru_cache(maxsize=4096)
def _known(
    kind: Literal["file", "dir", "symlink"], mode: int, sha256: str = "", target: str = ""
) -> EntryState:
    """A state read from the kernel (its fields already of their declared types), built
    without validation and shared: most entries of one apply look alike."""
    return EntryState(kind, mode, sha256, target)


def hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def state_in(dir_fd: int, name: str) -> EntryState:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return ABSENT
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        if st.st_size == 0:  # what an empty file hashes to; it is also empty when read
            return _known("file", mode, EMPTY_SHA256)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            return _known("file", mode, hash_fd(fd))
        finally:
            os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        return _known("dir", mode)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
        return _known("symlink", 0, "", target)
    return EntryState(kind="other", mode=mode)


def entry_state(root: Path, path: str) -> EntryState:
    """The state of ``root/path`` without following symlinks anywhere on the way."""
    check_relative(path)
    with Tree(root) as tree:
        return tree.state(path)
