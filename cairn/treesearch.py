"""What a read-only snapshot P changed since the read-only snapshot Q it descends from,
as the kernel's tree search reports it (root only: ``BTRFS_IOC_TREE_SEARCH_V2`` needs
CAP_SYS_ADMIN), for the settlement's change set (:mod:`cairn.settle.generations`).

P descends from Q by snapshots, so an inode keeps its number and every item P did not
rewrite keeps the transaction that wrote it. One search of P with ``min_transid`` past
Q's creation reads only the leaves written since: an inode item newer than Q is a changed
inode, a file extent newer than Q changed content. The record holds, from P and from Q,
every item of each changed inode that says what it is and where (inode item, names,
xattrs) and the names of the directories above them, up to the subvolume's top.

Root reads only what the kernel made: item keys, the transaction of an inode item or an
extent, the parent directory of a name and the length of an entry. Names and xattrs are
what the agent wrote: root copies them into the record unread, and the owner's candidate
unit parses it, as it parses a send stream. When P does not descend from Q
(:func:`descends_from`: a workspace made from another run's checkpoint, a subvolume on the
way deleted) or the record would be larger than :data:`RECORD_LIMIT`, there is no record
and the caller uses ``btrfs send``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import btrfsutil

log = logging.getLogger(__name__)

RECORD_MAGIC = b"cairn-tree-changes\x00\x01"
RECORD_HEADER = struct.Struct("<Q")  # Q's creation transaction ("since")
ENTRY = struct.Struct("<BQBQI")  # tree, objectid, type, offset, data length
TREE_Q, TREE_P, WRITTEN = 0, 1, 2  # an entry's tree; WRITTEN: an extent newer than Q
RECORD_LIMIT = 64 << 20  # a larger change set is read from btrfs send

TREE_SEARCH_V2 = 0xC0709411  # _IOWR(0x94, 17, struct btrfs_ioctl_search_args_v2)
SEARCH_KEY = struct.Struct("<7Q4I4Q")  # struct btrfs_ioctl_search_key
SEARCH_HEADER = struct.Struct("<3Q2I")  # transid, objectid, offset, type, len
U64 = (1 << 64) - 1
TOP_DIR = 256  # BTRFS_FIRST_FREE_OBJECTID: a subvolume's top directory
UUID_TREE, UUID_KEY_SUBVOL = 9, 251  # BTRFS_UUID_TREE_OBJECTID, BTRFS_UUID_KEY_SUBVOL
INODE_ITEM, INODE_REF, INODE_EXTREF, XATTR_ITEM, EXTENT_DATA = 1, 12, 13, 24, 108
_INODE_TRANSID = struct.Struct("<8xQ")  # btrfs_inode_item: generation, transid, ...
_EXTENT_GENERATION = struct.Struct("<Q")  # btrfs_file_extent_item: generation, ...
_EXTREF = struct.Struct("<QQH")  # btrfs_inode_extref: parent, index, name length
_WIDE, _NARROW = 1 << 20, 1 << 16
_MAX_DEPTH = 64  # snapshots between Q and P

Key = tuple[int, int, int]


class _TooLarge(Exception):
    pass


def _search(fd: int, buffer: bytearray, low: Key, high: Key, min_transid: int = 0,
            tree: int = 0) -> Iterator[tuple[int, int, int, int, int]]:
    """Every item of fd's subvolume tree (or of tree ``tree``) from ``low`` to ``high``
    (keys compared as tuples), only from leaves written at ``min_transid`` or later:
    (objectid, type, offset, start, length) with the item's data at
    ``buffer[start:start + length]``, valid until the next item."""
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
        pos = SEARCH_KEY.size + 8
        for _ in range(count):
            _transid, objectid, offset, kind, length = SEARCH_HEADER.unpack_from(buffer, pos)
            pos += SEARCH_HEADER.size
            yield objectid, kind, offset, pos, length
            pos += length
        if offset < U64:
            offset += 1
        elif kind < 255:
            kind, offset = kind + 1, 0
        else:
            objectid, kind, offset = objectid + 1, 0, 0
        if (objectid, kind, offset) > high:
            return


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

    def add(self, number: int, last: int) -> set[int]:
        """Items of inode ``number`` from its inode item to type ``last`` into the record;
        the directories its names are in."""
        parents: set[int] = set()
        self.done.add(number)
        for objectid, kind, offset, start, length in _search(
            self.fd, self.buffer, (number, INODE_ITEM, 0), (number, last, U64)
        ):
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
        return parents

    def add_with_directories(self, numbers: set[int]) -> None:
        """The items of ``numbers`` and the names of every directory above them."""
        pending: set[int] = set()
        for number in sorted(numbers):
            pending |= self.add(number, XATTR_ITEM)
        while pending := pending - self.done:
            above: set[int] = set()
            for number in sorted(pending):
                above |= self.add(number, INODE_EXTREF)
            pending = above


def _subvolume_with(fd: int, uuid: bytes) -> int | None:
    """The ID of the subvolume whose UUID is ``uuid``, from the filesystem's UUID tree;
    None when there is none (never was, or deleted)."""
    low, high = struct.unpack("<QQ", uuid)
    buffer = bytearray(SEARCH_KEY.size + 8 + 4096)
    key = (low, UUID_KEY_SUBVOL, high)
    for _objectid, _kind, _offset, start, length in _search(fd, buffer, key, key,
                                                            tree=UUID_TREE):
        if length >= 8:
            return int(struct.unpack_from("<Q", buffer, start)[0])
    return None


def descends_from(p: Path, q: Path) -> bool:
    """Whether every item of ``p`` that no transaction after ``q``'s creation wrote is
    ``q``'s: ``p`` was made by a chain of snapshots of subvolumes that all still exist,
    either from ``q`` or from the subvolume ``q`` is a snapshot of, after ``q``."""
    q_info = btrfsutil.subvolume_info(os.fspath(q))
    step = btrfsutil.subvolume_info(os.fspath(p))
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(_MAX_DEPTH):
            if step.parent_uuid == q_info.uuid:
                return True
            if step.parent_uuid == q_info.parent_uuid and step.otransid > q_info.otransid:
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
    changed: set[int] = set()
    pt, qt = _Tree(p, TREE_P, out), _Tree(q, TREE_Q, out)
    try:
        wide = bytearray(SEARCH_KEY.size + 8 + _WIDE)
        written: set[int] = set()
        for number, kind, _offset, start, _length in _search(
            pt.fd, wide, (TOP_DIR, 0, 0), (U64, 255, U64), min_transid=since + 1
        ):
            if kind == INODE_ITEM and _INODE_TRANSID.unpack_from(wide, start)[0] > since:
                changed.add(number)
            elif (kind == EXTENT_DATA and number not in written
                  and _EXTENT_GENERATION.unpack_from(wide, start)[0] > since):
                written.add(number)
        for number in sorted(written):
            out.add(WRITTEN, number, 0, 0, b"")
        pt.add_with_directories(changed)
        qt.add_with_directories(changed)
    except _TooLarge:
        log.info("the change record of %s since %s is over %d bytes: no tree search",
                 p, q, RECORD_LIMIT)
        return None
    finally:
        pt.close()
        qt.close()
    return b"".join(out.parts)
