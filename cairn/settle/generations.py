"""The change set of Q and P from root's record of the inodes P changed since Q
(:func:`cairn.treesearch.change_record`), read in the owner's candidate unit: the same
:class:`~cairn.settle.changes.ChangeSet` the send stream gives
(:func:`~cairn.settle.changes.changes_in`), at a cost that grows with the leaves P wrote,
not with the tree.

A changed inode's names in Q and in P say where it was and where it is; a file whose
extents or size differ was modified at every name it kept, any other changed inode whose
mode, owner or xattrs differ changed its metadata there. A changed directory's listings
in Q and P give the entries that left it without their inode changing (a file whose last
name went, or whose number a new inode took). A directory that moved or went takes its
subtree along, read from Q and P (a directory in a moved one the owner may not list is
left out, as the settlement refuses it by name). A path something occupies in P and
that existed in Q is modified, else created. Where Q or P cannot be read so (a changed
directory the owner may not list), :class:`Unlistable` says so, and root hands over the
send stream instead.

Beside the send stream's change set, ``touched`` holds every name in P of a changed inode
(the stream's: the names whose times it set, a subset) and ``renamed`` pairs every name an
inode left with every name it gained (the stream's pairs are among them): both err on the
side the settlement reads them for, nested subvolumes looked for in more directories and
a rename's halves tied in more pairs. ``modified`` may also name a file whose extents
changed but not its bytes (defragmented, space preallocated), which the stream leaves
out: the candidate then copies the same bytes.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cairn.errors import StorageError
from cairn.settle.changes import ChangeSet, project_scope, scoped_change_set

# The record's layout; cairn.treesearch (root, which writes it) holds the same constants.
_MAGIC = b"cairn-tree-changes\x00\x02"
_SINCE = struct.Struct("<Q")
_ENTRY = struct.Struct("<BQBQI")
_TREE_Q, _TREE_P = 0, 1
_TOP_DIR = 256
_INODE_ITEM, _INODE_REF, _INODE_EXTREF, _XATTR_ITEM, _EXTENT_DATA = 1, 12, 13, 24, 108
_INODE = struct.Struct("<QQQ")  # generation, transid, size
_OWNER_MODE = struct.Struct("<44xIII")  # uid, gid, mode
_REF = struct.Struct("<QH")  # index, name length
_EXTREF = struct.Struct("<QQH")  # parent, index, name length
_XATTR = struct.Struct("<25xHHx")  # btrfs_dir_item: key, transid, data and name length, type


class RecordError(StorageError):
    """The record is not one root writes."""


class Unlistable(StorageError):
    """Q or P holds a directory the change set needs listed that the owner may not read:
    the send stream, which names every change, is needed instead."""


@dataclass(slots=True)
class _Inode:
    """One inode as a tree holds it: what settlement compares, and its names."""

    generation: int = -1  # the transaction that made it: tells a reused number apart
    transid: int = 0
    size: int = 0
    mode: int = 0
    owner: tuple[int, int] = (0, 0)
    names: list[tuple[int, bytes]] = field(default_factory=list)  # (directory, name)
    xattrs: dict[bytes, bytes] = field(default_factory=dict)
    extents: list[tuple[int, bytes]] = field(default_factory=list)  # (file offset, item)

    def add(self, kind: int, offset: int, data: bytes) -> None:
        if kind == _INODE_ITEM:
            self.generation, self.transid, self.size = _INODE.unpack_from(data, 0)
            uid, gid, self.mode = _OWNER_MODE.unpack_from(data, 0)
            self.owner = (uid, gid)
        elif kind == _INODE_REF:
            pos = 0
            while pos < len(data):
                _index, length = _REF.unpack_from(data, pos)
                pos += _REF.size
                self.names.append((offset, data[pos:pos + length]))
                pos += length
        elif kind == _INODE_EXTREF:
            pos = 0
            while pos < len(data):
                parent, _index, length = _EXTREF.unpack_from(data, pos)
                pos += _EXTREF.size
                self.names.append((parent, data[pos:pos + length]))
                pos += length
        elif kind == _XATTR_ITEM:
            pos = 0
            while pos < len(data):
                data_length, name_length = _XATTR.unpack_from(data, pos)
                start = pos + _XATTR.size
                name = data[start:start + name_length]
                self.xattrs[name] = data[start + name_length:start + name_length + data_length]
                pos = start + name_length + data_length
        elif kind == _EXTENT_DATA:
            self.extents.append((offset, data))

    def looks(self) -> tuple[object, ...]:
        """What a metadata change changes."""
        return stat.S_IMODE(self.mode), self.owner, sorted(self.xattrs.items())


class _Tree:
    """One read-only subvolume as the record and its mount show it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.inodes: dict[int, _Inode] = {}
        self.paths: dict[int, bytes] = {_TOP_DIR: b""}
        self.dirs: dict[str, bool] = {}

    def inode(self, number: int) -> _Inode | None:
        found = self.inodes.get(number)
        return found if found is not None and found.generation >= 0 else None

    def directory(self, number: int) -> bytes:
        """The path of directory ``number`` from the subvolume's top ("" for the top)."""
        known = self.paths.get(number)
        if known is not None:
            return known
        chain: list[tuple[int, bytes]] = []
        while known is None:
            found = self.inodes.get(number)
            if found is None or len(found.names) != 1 or len(chain) > 4096:
                raise RecordError(f"the change record does not place directory {number}")
            chain.append((number, found.names[0][1]))
            number = found.names[0][0]
            known = self.paths.get(number)
        for number, name in reversed(chain):
            known = self.paths[number] = _join(known, name)
        return known

    def names(self, number: int, inode: _Inode) -> set[str]:
        if number == _TOP_DIR:
            return {""}  # its one name is ".." in itself
        return {os.fsdecode(_join(self.directory(parent), name)) for parent, name in inode.names}

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists in this tree, every directory on the way a real one
        (never through a symlink)."""
        head, _, _name = rel.rpartition("/")
        if head and not self.is_dir(head):
            return False
        try:
            os.lstat(self.root / rel)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def is_dir(self, rel: str) -> bool:
        known = self.dirs.get(rel)
        if known is None:
            head = rel.rpartition("/")[0]
            try:
                known = (not head or self.is_dir(head)) and stat.S_ISDIR(
                    os.lstat(self.root / rel).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                known = False
            self.dirs[rel] = known
        return known

    def listing(self, number: int) -> dict[str, int]:
        """Directory ``number``'s entries and their inode numbers."""
        with os.scandir(self.root / os.fsdecode(self.directory(number))) as entries:
            return {e.name: e.inode() for e in entries}

    def descendants(self, rel: str, *, deleted: bool = False) -> Iterator[str]:
        """Every path below directory ``rel``. One the owner may not list is left out of
        a directory that moved (the settlement refuses it by name, and with it what it
        holds), but not of one ``deleted``: what it held went too (``PermissionError``)."""
        stack = [rel]
        while stack:
            sub = stack.pop()
            try:
                entries = os.scandir(self.root / sub)
            except PermissionError:
                if deleted:
                    raise
                continue
            with entries:
                for entry in entries:
                    child = f"{sub}/{entry.name}" if sub else entry.name
                    yield child
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(child)


def _join(directory: bytes, name: bytes) -> bytes:
    return directory + b"/" + name if directory else name


def _read(record: bytes, qt: _Tree, pt: _Tree) -> int:
    """Fill ``qt`` and ``pt`` from the record; Q's creation transaction."""
    if not record.startswith(_MAGIC) or len(record) < len(_MAGIC) + _SINCE.size:
        raise RecordError("the change record does not start as one")
    (since,) = _SINCE.unpack_from(record, len(_MAGIC))
    pos = len(_MAGIC) + _SINCE.size
    while pos < len(record):
        if pos + _ENTRY.size > len(record):
            raise RecordError("the change record is cut off")
        tree, number, kind, offset, length = _ENTRY.unpack_from(record, pos)
        pos += _ENTRY.size
        data = record[pos:pos + length]
        pos += length
        if len(data) < length or tree not in (_TREE_Q, _TREE_P):
            raise RecordError("the change record is cut off")
        target = qt if tree == _TREE_Q else pt
        try:
            target.inodes.setdefault(number, _Inode()).add(kind, offset, data)
        except struct.error:
            raise RecordError(f"the change record holds a malformed item of {number}") from None
    return int(since)


def changes_from_record(record: bytes, q: Path, p: Path, *, subpath: str = "") -> ChangeSet:
    """The change set of read-only ``q`` and ``p`` that root's ``record`` of them
    describes, limited to ``subpath`` and relative to it; ``q`` and ``p`` are read for
    the listings of changed directories and the subtrees of moved ones. Raises
    :class:`Unlistable` where the owner may not read them."""
    sub = project_scope(subpath)
    qt, pt = _Tree(q), _Tree(p)
    since = _read(record, qt, pt)
    try:
        return _changes(qt, pt, since, sub)
    except PermissionError as exc:
        raise Unlistable(f"the owner may not read {exc.filename} to find the changes",
                         hint="root hands over the send stream instead") from None


def _same_inode(qt: _Tree, pt: _Tree, number: int) -> bool:
    """Whether inode ``number`` is in the record as one inode in both trees (changed,
    made before Q): not a number a new inode took after Q's was freed."""
    before, now = qt.inode(number), pt.inode(number)
    return before is not None and now is not None and before.generation == now.generation


def _changes(qt: _Tree, pt: _Tree, since: int, sub: str) -> ChangeSet:
    changed = {n: i for n, i in pt.inodes.items() if i.generation >= 0 and i.transid > since}
    vacated: set[str] = set()
    occupied: set[str] = set()
    modified: set[str] = set()
    metadata: set[str] = set()
    touched: set[str] = set()  # every changed inode's names in P: its times changed too
    renames: list[tuple[str, str]] = []
    for number, now in changed.items():
        before = qt.inode(number)
        if before is not None and before.generation != now.generation:
            before = None  # the number was freed and given to a new inode
        new, old = pt.names(number, now), (qt.names(number, before) if before else set())
        touched |= new
        vacated |= old - new
        occupied |= new - old
        renames += ((gone, made) for gone in old - new for made in new - old)
        if stat.S_ISDIR(now.mode):
            for moved in old - new:
                vacated.update(qt.descendants(moved))
            for moved in new - old:
                occupied.update(pt.descendants(moved))
        if before is None:
            continue
        if not stat.S_ISDIR(now.mode) and (now.size, now.extents) != (before.size,
                                                                     before.extents):
            modified |= new & old
        elif now.looks() != before.looks():
            metadata |= new & old
    for number, now in changed.items():
        before = qt.inode(number) if stat.S_ISDIR(now.mode) else None
        if before is None or before.generation != now.generation:
            continue
        left = pt.listing(number)
        for name, inode in qt.listing(number).items():
            taken = pt.inode(inode)  # a new inode with Q's number: Q's entry is gone
            fresh = taken is not None and taken.generation > since
            if not fresh and (left.get(name) == inode or _same_inode(qt, pt, inode)):
                continue  # still here, or its own names say where it went
            gone = os.fsdecode(_join(qt.directory(number), os.fsencode(name)))
            vacated.add(gone)
            if stat.S_ISDIR(os.lstat(qt.root / gone).st_mode):
                vacated.update(qt.descendants(gone, deleted=True))

    def existed(path: str) -> bool:
        return path in vacated or qt.exists(path)

    metadata.discard("")  # the subvolume's top: no path of the project
    created = {path for path in occupied if not existed(path)}
    modified |= occupied - created
    deleted = vacated - occupied
    metadata -= created | modified | deleted
    return scoped_change_set(created, modified, deleted, metadata, renames, touched, sub)
