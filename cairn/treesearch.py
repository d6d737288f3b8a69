"""What a read-only snapshot P changed since the read-only snapshot Q it descends from,
as the kernel's tree search reports it (root only: ``BTRFS_IOC_TREE_SEARCH_V2`` needs
CAP_SYS_ADMIN), for the settlement's change set (:mod:`cairn.settle.generations`).

P descends from Q by snapshots, so an inode keeps its number and every item P did not
rewrite keeps the transaction that wrote it. One search of P with ``min_transid`` past
Q's creation reads only the leaves written since: an inode item newer than Q is a changed
inode (a write, a truncate, a reflink, a hole punched, a name or a mode changed: each
updates the inode's times). The record holds, from P and from Q (there only of inodes
made before Q), every item of each changed inode that says what it is, what it holds
and where (inode item, names, xattrs, a file's extents) and the names of the directories
above them, up to the subvolume's top.

Root reads only what the kernel made: item keys, the transaction, generation and mode of
an inode item, the parent directory of a name and the length of an entry. Names, xattrs
and inline data are what the agent wrote: root copies them into the record unread, and
the owner's candidate unit parses it, as it parses a send stream. When P does not descend from Q
(:func:`descends_from`: a workspace made from another run's checkpoint, a subvolume on the
way deleted) or the record would be larger than :data:`RECORD_LIMIT`, there is no record
and the caller uses ``btrfs send``.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import btrfsutil

log = logging.getLogger(__name__)

RECORD_MAGIC = b"cairn-tree-changes\x00\x02"
RECORD_HEADER = struct.Struct("<Q")  # Q's creation transaction ("since")
ENTRY = struct.Struct("<BQBQI")  # tree, objectid, type, offset, data length
TREE_Q, TREE_P = 0, 1  # an entry's tree
RECORD_LIMIT = 64 << 20  # a larger change set is read from btrfs send

TREE_SEARCH_V2 = 0xC0709411  # _IOWR(0x94, 17, struct btrfs_ioctl_search_args_v2)
SEARCH_KEY = struct.Struct("<7Q4I4Q")  # struct btrfs_ioctl_search_key
SEARCH_HEADER = struct.Struct("<3Q2I")  # transid, objectid, offset, type, len
_ITEM_KEY = struct.Struct("<8xQ8xII")  # of a search header: objectid, type, len
U64 = (1 << 64) - 1
TOP_DIR = 256  # BTRFS_FIRST_FREE_OBJECTID: a subvolume's top directory
UUID_TREE, UUID_KEY_SUBVOL = 9, 251  # BTRFS_UUID_TREE_OBJECTID, BTRFS_UUID_KEY_SUBVOL
INODE_ITEM, INODE_REF, INODE_EXTREF, XATTR_ITEM, EXTENT_DATA = 1, 12, 13, 24, 108
_INODE_ITEM = struct.Struct("<QQ36xI")  # btrfs_inode_item: generation, transid, ..., mode
_EXTREF = struct.Struct("<QQH")  # btrfs_inode_extref: parent, index, name length
_WIDE, _NARROW = 1 << 20, 1 << 16
_MAX_DEPTH = 64  # snapshots between Q and P
_GAP = 2  # inodes between two of a run's: their items are read and skipped
_SKIPPED = 32  # items of such an inode in a row after which a new search skips them
_MAX_CHANGED = RECORD_LIMIT // (ENTRY.size + 160)  # 160: an inode item's size

Key = tuple[int, int, int]


class _TooLarge(Exception):
    pass


def _pages(fd: int, buffer: bytearray, low: Key, high: Key, last: list[int],
           min_transid: int = 0, tree: int = 0) -> Iterator[int]:
    """Search fd's subvolume tree (or tree ``tree``) from ``low`` to ``high`` (keys
    compared as tuples), only in leaves written at ``min_transid`` or later, one buffer
    at a time: yields how many items the buffer holds (each a search header and its
    data), and goes on after the key the caller leaves in ``last`` (objectid, type,
    offset: the buffer's last item's)."""
    size = len(buffer) - SEARCH_KEY.size - 8
    objectid, kind, offset = low
    while True:
        SEARCH_KEY.pack_into(buffer, 0, tree, objectid, high[0], offset, high[2], min_transid,
                             U64, kind, high[1], 4096, 0, 0, 0, 0, 0)
        struct.pack_into("<Q", buffer, SEARCH_KEY.size, size)
        fcntl.ioctl(fd, TREE_SEARCH_V2, buffer)
        count = SEARCH_KEY.unpack_from(buffer, 0)[9]
        if count == 0:
            return
        yield count
        objectid, kind, offset = last
        if offset < U64:
            offset += 1
        elif kind < 255:
            kind, offset = kind + 1, 0
        else:
            objectid, kind, offset = objectid + 1, 0, 0
        if (objectid, kind, offset) > high:
            return


_FIRST = SEARCH_KEY.size + 8  # where a buffer's first search header is


def _search(fd: int, buffer: bytearray, low: Key, high: Key,
            tree: int = 0) -> Iterator[tuple[int, int, int, int, int]]:
    """Every item from ``low`` to ``high`` (:func:`_pages`): (objectid, type, offset,
    start, length) with the item's data at ``buffer[start:start + length]``, valid until
    the next item."""
    last = [0, 0, 0]
    for count in _pages(fd, buffer, low, high, last, tree=tree):
        pos = _FIRST
        for _ in range(count):
            _transid, objectid, offset, kind, length = SEARCH_HEADER.unpack_from(buffer, pos)
            pos += SEARCH_HEADER.size
            yield objectid, kind, offset, pos, length
            pos += length
        last[:] = objectid, kind, offset


class _Since(NamedTuple):
    changed: set[int]  # inodes whose inode item a transaction after Q's creation wrote
    made: set[int]  # of them, those made after it
    directories: set[int]  # of them, the directories


def _written_since(fd: int, since: int) -> _Since:
    """What the leaves written after transaction ``since`` say: one search."""
    found = _Since(set(), set(), set())
    changed, made, directories = found
    buffer = bytearray(_FIRST + _WIDE)
    key_of, inode_item = _ITEM_KEY.unpack_from, _INODE_ITEM.unpack_from
    step = SEARCH_HEADER.size
    last = [0, 0, 0]
    for count in _pages(fd, buffer, (TOP_DIR, 0, 0), (U64, 255, U64), last, since + 1):
        at = pos = _FIRST
        for _ in range(count):  # the hot loop: every item of every leaf written since
            at = pos
            objectid, kind, length = key_of(buffer, at)
            pos = at + step + length
            if kind == INODE_ITEM:
                generation, transid, mode = inode_item(buffer, at + step)
                if transid > since:
                    changed.add(objectid)
                    if generation > since:
                        made.add(objectid)
                    if stat.S_ISDIR(mode):
                        directories.add(objectid)
        _transid, objectid, offset, kind, _length = SEARCH_HEADER.unpack_from(buffer, at)
        last[:] = objectid, kind, offset
        if len(changed) > _MAX_CHANGED:
            raise _TooLarge  # their inode items alone would not fit in the record
    return found


class _Writer:
    """The record as it grows, bounded by :data:`RECORD_LIMIT`."""

    def __init__(self, since: int) -> None:
        self.parts = [RECORD_MAGIC, RECORD_HEADER.pack(since)]
        self.size = len(RECORD_MAGIC) + RECORD_HEADER.size

    def add(self, tree: int, objectid: int, kind: int, offset: int, data: bytes) -> None:
        self.size += ENTRY.size + len(data)
        if self.size > RECORD_LIMIT:
            raise _TooLarge
        self.parts += (ENTRY.pack(tree, objectid, kind, offset, len(data)), data)


class _Tree:
    """One subvolume's tree, searched item by item for the inodes the record needs."""

    def __init__(self, path: Path, tree: int, out: _Writer) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.tree, self.out = tree, out
        self.buffer = bytearray(SEARCH_KEY.size + 8 + _NARROW)
        self.done: set[int] = {TOP_DIR}  # inodes whose items are in the record

    def close(self) -> None:
        os.close(self.fd)

    def add(self, numbers: set[int], last: int, alone: set[int]) -> set[int]:
        """Items of the inodes ``numbers`` from their inode items to type ``last`` into
        the record, one search per run of near numbers, but one for each of ``alone``
        (a changed directory: a run would read all its entries); the directories their
        names are in."""
        parents: set[int] = set()
        self.done |= numbers
        joined = numbers - alone
        order = sorted(joined)
        searches = [(run, joined, order) for run in _runs(joined)]
        searches += [((n, n), {n}, [n]) for n in sorted(numbers & alone)]
        for (low, high), wanted, ordered in searches:
            at: int | None = low
            while at is not None:
                at = self._add_from(at, high, last, wanted, ordered, parents)
        return parents

    def _add_from(self, low: int, high: int, last: int, wanted: set[int],
                  ordered: list[int], parents: set[int]) -> int | None:
        """The items of ``wanted`` inodes from ``low`` to ``high``; where an inode between
        them holds many items (a large directory or file), the number to search on from
        (the next wanted one), else None."""
        skipped = 0
        for objectid, kind, offset, start, length in _search(
            self.fd, self.buffer, (low, INODE_ITEM, 0), (high, last, U64)
        ):
            if kind > last or objectid not in wanted:
                skipped += 1  # an item of an inode between two of the run's
                if skipped > _SKIPPED:
                    after = bisect.bisect_right(ordered, objectid)
                    return ordered[after] if after < len(ordered) and ordered[after] <= high \
                        else None
                continue
            skipped = 0
            data = bytes(self.buffer[start:start + length])
            self.out.add(self.tree, objectid, kind, offset, data)
            if kind == INODE_REF:
                parents.add(offset)
            elif kind == INODE_EXTREF:
                pos = 0
                while pos + _EXTREF.size <= len(data):
                    parent, _index, name_length = _EXTREF.unpack_from(data, pos)
                    parents.add(parent)
                    pos += _EXTREF.size + name_length
        return None

    def add_with_directories(self, numbers: set[int], directories: set[int]) -> None:
        """The items of ``numbers`` (``directories`` among them: no extents) and the
        names of every directory above them."""
        pending = self.add(numbers & directories, XATTR_ITEM, directories)
        pending |= self.add(numbers - directories, EXTENT_DATA, set())
        while pending := pending - self.done:
            pending = self.add(pending, INODE_EXTREF, pending)


def _runs(numbers: set[int]) -> list[tuple[int, int]]:
    """``numbers`` as ranges, joined where at most :data:`_GAP` numbers lie between: a
    search of a range costs little more than of one inode, each search costs a call."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number - runs[-1][1] <= _GAP + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return [(low, high) for low, high in runs]


def _subvolume_with(fd: int, uuid: bytes) -> int | None:
    """The ID of the subvolume whose UUID is ``uuid``, from the filesystem's UUID tree;
    None when there is none (never was, or deleted)."""
    low, high = struct.unpack("<QQ", uuid)
    buffer = bytearray(SEARCH_KEY.size + 8 + 4096)
    key = (low, UUID_KEY_SUBVOL, high)
    for _objectid, _kind, _offset, start, length in _search(fd, buffer, key, key,
                                                            UUID_TREE):
        if length >= 8:
            return int(struct.unpack_from("<Q", buffer, start)[0])
    return None


def descends_from(p: Path, q: Path) -> bool:
    """Whether every item of ``p`` that no transaction after ``q``'s creation wrote is
    ``q``'s: ``q`` is unchanged since it was made, and ``p`` was made by a chain of
    snapshots of subvolumes that all still exist, either from ``q`` (after its last
    change) or from the subvolume ``q`` is a snapshot of, after ``q``."""
    q_info = btrfsutil.subvolume_info(os.fspath(q))
    if q_info.ctransid > q_info.otransid:
        return False  # Q's tree changed after it was made (its read-only flag was off)
    step = btrfsutil.subvolume_info(os.fspath(p))
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(_MAX_DEPTH):
            if step.parent_uuid == q_info.uuid:
                return bool(step.otransid > q_info.otransid)
            if (any(q_info.parent_uuid) and step.parent_uuid == q_info.parent_uuid
                    and step.otransid > q_info.otransid):
                return True
            if not any(step.parent_uuid):
                return False  # made as a subvolume, not a snapshot
            parent = _subvolume_with(fd, step.parent_uuid)
            if parent is None:
                return False
            step = btrfsutil.subvolume_info(fd, parent)
        return False
    finally:
        os.close(fd)


def change_record(q: Path, p: Path) -> bytes | None:
    """The record of what read-only ``p`` changed since read-only ``q`` (see the module
    doc), or None when ``p`` does not descend from ``q`` (:func:`descends_from`) or the
    record would be larger than :data:`RECORD_LIMIT`."""
    try:
        return _record(q, p)
    except (OSError, btrfsutil.BtrfsUtilError) as exc:
        log.warning("no tree search of %s since %s: %s", p, q, exc)
        return None


def _record(q: Path, p: Path) -> bytes | None:
    for path in (q, p):
        if not btrfsutil.get_subvolume_read_only(os.fspath(path)):
            log.info("%s is not read-only: no tree search", path)
            return None
    if not descends_from(p, q):
        log.info("%s does not descend from %s: no tree search", p, q)
        return None
    since = int(btrfsutil.subvolume_info(os.fspath(q)).otransid)
    out = _Writer(since)
    pt, qt = _Tree(p, TREE_P, out), _Tree(q, TREE_Q, out)
    try:
        since_q = _written_since(pt.fd, since)
        pt.add_with_directories(since_q.changed, since_q.directories)
        # an inode made since has no past in Q
        qt.add_with_directories(since_q.changed - since_q.made, since_q.directories)
    except _TooLarge:
        log.info("the change record of %s since %s is over %d bytes: no tree search",
                 p, q, RECORD_LIMIT)
        return None
    finally:
        pt.close()
        qt.close()
    return b"".join(out.parts)
