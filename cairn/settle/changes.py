"""What changed between two read-only snapshots, from a ``btrfs send --no-data -p Q P``
stream.

The stream replays P on top of Q: commands name paths in the tree as it is at that point
of the replay (new inodes first appear as ``o<ino>-<gen>-<seq>`` and are renamed into
place; existing ones may be parked under such names). :class:`ChangeTracker` replays the
commands on a sparse overlay of Q that only holds the entries the stream touches, so the
cost grows with the change, not with the tree. Only renamed or deleted directories are
walked (their whole subtree moves), and hard links of changed files are found by inode.
"""

from __future__ import annotations

import enum
import logging
import os
import stat
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

from cairn.errors import StorageError

log = logging.getLogger(__name__)

MAGIC = b"btrfs-stream\x00"
_HEADER = struct.Struct("<IHI")  # payload length, command, crc32c
_TLV = struct.Struct("<HH")

COMMANDS = {
    1: "SUBVOL",
    2: "SNAPSHOT",
    3: "MKFILE",
    4: "MKDIR",
    5: "MKNOD",
    6: "MKFIFO",
    7: "MKSOCK",
    8: "SYMLINK",
    9: "RENAME",
    10: "LINK",
    11: "UNLINK",
    12: "RMDIR",
    13: "SET_XATTR",
    14: "REMOVE_XATTR",
    15: "WRITE",
    16: "CLONE",
    17: "TRUNCATE",
    18: "CHMOD",
    19: "CHOWN",
    20: "UTIMES",
    21: "END",
    22: "UPDATE_EXTENT",
    23: "FALLOCATE",
    24: "FILEATTR",
    25: "ENCODED_WRITE",
    26: "ENABLE_VERITY",
}
# Attribute numbers whose value is a little-endian integer, and their byte widths.
_INT_ATTRS = {
    2: "ctransid",
    3: "ino",
    4: "size",
    5: "mode",
    6: "uid",
    7: "gid",
    8: "rdev",
    18: "file_offset",
    21: "clone_ctransid",
    23: "clone_offset",
    24: "clone_len",
    25: "fallocate_mode",
    26: "fileattr",
    27: "unencoded_file_len",
    28: "unencoded_len",
    29: "unencoded_offset",
    30: "compression",
    31: "encryption",
    32: "verity_algorithm",
    33: "verity_block_size",
}
_BYTES_ATTRS = {
    1: "uuid",
    9: "ctime",
    10: "mtime",
    11: "atime",
    12: "otime",
    13: "xattr_name",
    14: "xattr_data",
    15: "path",
    16: "path_to",
    17: "path_link",
    19: "data",
    20: "clone_uuid",
    22: "clone_path",
    34: "verity_salt_data",
    35: "verity_sig_data",
}
_DATA_ATTR = 19
# What the change tracker reads: path, path_to, path_link.
PATH_ATTRS = frozenset({15, 16, 17})

_CREATE = {"MKFILE", "MKDIR", "MKNOD", "MKFIFO", "MKSOCK", "SYMLINK"}
_CONTENT = {"WRITE", "UPDATE_EXTENT", "CLONE", "TRUNCATE", "FALLOCATE", "ENCODED_WRITE"}
_META = {"CHMOD", "CHOWN", "SET_XATTR", "REMOVE_XATTR", "FILEATTR", "ENABLE_VERITY"}
_NUMBERS = {name: number for number, name in COMMANDS.items()}
_SUBVOL, _LINK, _END = _NUMBERS["SUBVOL"], _NUMBERS["LINK"], _NUMBERS["END"]
_PASSED = frozenset({_NUMBERS["SNAPSHOT"]})


class _Role(enum.Enum):
    CREATE = 1
    RENAME = 2
    REMOVE = 3
    CONTENT = 4
    META = 5
    TIMES = 6


_ROLES = {
    **{_NUMBERS[n]: _Role.CREATE for n in (*_CREATE, "LINK")},
    _NUMBERS["RENAME"]: _Role.RENAME,
    _NUMBERS["UNLINK"]: _Role.REMOVE,
    _NUMBERS["RMDIR"]: _Role.REMOVE,
    **{_NUMBERS[n]: _Role.CONTENT for n in _CONTENT},
    **{_NUMBERS[n]: _Role.META for n in _META},
    _NUMBERS["UTIMES"]: _Role.TIMES,
}


class StreamError(StorageError):
    """The send stream is malformed or does not replay onto Q."""


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC32C as the send stream uses it: seed 0, no final inversion."""
    table = _CRC_TABLE
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


class Command(NamedTuple):
    """One decoded command; integer attributes in ``ints``, everything else raw."""

    name: str
    ints: dict[str, int]
    raw: dict[str, bytes]

    def path(self, key: str = "path") -> str:
        """A path attribute as a str (file system encoding, surrogate escapes)."""
        try:
            return os.fsdecode(self.raw[key])
        except KeyError:
            raise StreamError(f"send stream {self.name} command lacks {key}") from None


_ATTR_NAMES = {**_BYTES_ATTRS, **_INT_ATTRS}
_HEADER_SIZE = _HEADER.size
_unpack_header = _HEADER.unpack_from
_unpack_tlv = _TLV.unpack_from


def _frames(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """Each command frame of a (possibly concatenated) send stream of protocol version 1,
    2 or 3: ``(command, crc, payload start, payload end, version)``, the framing checked."""
    size = len(data)
    pos = 0
    version = 0
    while pos < size:
        if data.startswith(MAGIC, pos):
            if pos + len(MAGIC) + 4 > size:
                raise StreamError("send stream header is truncated")
            (version,) = struct.unpack_from("<I", data, pos + len(MAGIC))
            if version not in (1, 2, 3):
                raise StreamError(f"send stream version {version} is not supported")
            pos += len(MAGIC) + 4
            continue
        if version == 0:
            raise StreamError("data is not a btrfs send stream")
        if pos + _HEADER_SIZE > size:
            raise StreamError("send stream command header is truncated")
        length, cmd, crc = _unpack_header(data, pos)
        start = pos + _HEADER_SIZE
        pos = start + length
        if pos > size:
            raise StreamError("send stream command payload is truncated")
        yield cmd, crc, start, pos, version


def parse(
    data: bytes, *, verify_crc: bool = True, attrs: frozenset[int] | None = None
) -> Iterator[Command]:
    """Decode a (possibly concatenated) send stream of protocol version 1, 2 or 3; with
    ``attrs``, only those attribute numbers (the framing of every one is still checked)."""
    # Slicing bytes is cheaper than slicing a memoryview and copying: the stream is
    # metadata only, and most attributes are a few bytes long.
    data = bytes(data)
    for cmd, crc, start, end, version in _frames(data):
        if verify_crc:
            pos = start - _HEADER_SIZE
            header = data[pos : pos + 6] + b"\0\0\0\0"
            if crc32c(data[start:end], crc32c(header)) != crc:
                raise StreamError(f"send stream CRC mismatch at offset {pos}")
        yield _decode_command(cmd, data, start, end, version, attrs)


def _decode_command(
    cmd: int, data: bytes, pos: int, end: int, version: int, wanted: frozenset[int] | None
) -> Command:
    """The attributes of the command payload ``data[pos:end]`` (those ``wanted``)."""
    ints: dict[str, int] = {}
    raw: dict[str, bytes] = {}
    data_to_end = version >= 2
    while pos < end:
        if pos + _TLV.size <= end:
            atype, alen = _unpack_tlv(data, pos)
        elif pos + 2 <= end:
            atype, alen = data[pos] | data[pos + 1] << 8, -1
        else:
            raise StreamError("send stream attribute header is truncated")
        if data_to_end and atype == _DATA_ATTR:
            start, pos = pos + 2, end
        else:
            if alen < 0:
                raise StreamError("send stream attribute header is truncated")
            start = pos + _TLV.size
            pos = start + alen
            if pos > end:
                raise StreamError("send stream attribute is truncated")
        if wanted is not None and atype not in wanted:
            continue
        if atype in _INT_ATTRS:
            ints[_INT_ATTRS[atype]] = int.from_bytes(data[start:pos], "little")
        else:
            raw[_ATTR_NAMES.get(atype) or f"attr{atype}"] = data[start:pos]
    return Command(COMMANDS.get(cmd) or f"cmd{cmd}", ints, raw)


_PATH, _PATH_TO, _PATH_LINK = 15, 16, 17


def parse_paths(data: bytes) -> Iterator[tuple[int, str | None, str | None, str | None]]:
    """:func:`parse` with ``attrs=PATH_ATTRS`` and no CRC check, lean: each command as
    ``(number, path, path_to, path_link)`` (None where absent), the same framing checks."""
    data = bytes(data)
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    unpack_tlv, tlv_size = _unpack_tlv, _TLV.size
    for cmd, _crc, at, end, version in _frames(data):
        path = path_to = path_link = None
        data_to_end = version >= 2
        while at < end:
            if at + tlv_size <= end:
                atype, alen = unpack_tlv(data, at)
            elif at + 2 <= end:
                atype, alen = data[at] | data[at + 1] << 8, -1
            else:
                raise StreamError("send stream attribute header is truncated")
            if data_to_end and atype == _DATA_ATTR:
                break
            if alen < 0:
                raise StreamError("send stream attribute header is truncated")
            start = at + tlv_size
            at = start + alen  # noqa: PLW2901  (the frame's cursor)
            if at > end:
                raise StreamError("send stream attribute is truncated")
            if atype == _PATH:
                path = data[start:at].decode(encoding, errors)
            elif atype == _PATH_TO:
                path_to = data[start:at].decode(encoding, errors)
            elif atype == _PATH_LINK:
                path_link = data[start:at].decode(encoding, errors)
        yield cmd, path, path_to, path_link


@dataclass(frozen=True, slots=True)
class Rename:
    old: str
    new: str


@dataclass(slots=True)
class ChangeSet:
    """Per-path differences of P against Q, relative to the project root.

    ``created``: in P, not in Q. ``deleted``: in Q, not in P. ``modified``: in both, but
    the content or the object differs. ``metadata``: the same object with only mode,
    ownership or xattrs changed. A rename shows as a deletion of the old path and a
    creation of the new one (and, for people, in ``renamed``). ``touched``: paths in P
    whose times the stream set ("" is the project root); every directory whose entries
    changed is among them, including those that gained or lost a nested subvolume, which
    the stream itself leaves out.
    """

    created: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    metadata: list[str] = field(default_factory=list)
    renamed: list[Rename] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)

    def paths(self) -> list[str]:
        """Every path whose final state differs, sorted."""
        return sorted({*self.created, *self.modified, *self.deleted, *self.metadata})

    def is_empty(self) -> bool:
        return not (self.created or self.modified or self.deleted or self.metadata)


class TreeReader(Protocol):
    """Read access to Q and P for the parts the stream cannot answer alone. Paths are
    relative to the subvolume roots."""

    def descendants_q(self, rel: str) -> Iterable[str]: ...

    def descendants_p(self, rel: str) -> Iterable[str]: ...

    def exists_q(self, rel: str) -> bool: ...

    def other_links_p(self, rel: str) -> Iterable[str]: ...


class _Node:
    __slots__ = (
        "name",
        "parent",
        "origin",
        "children",
        "content",
        "meta",
        "written",
        "detached",
        "link_source",
        "touched",
    )

    def __init__(self, name: str, parent: _Node | None, origin: str | None) -> None:
        self.name = name
        self.parent = parent
        self.origin = origin  # the path this dentry had in Q, None if new
        self.children: dict[str, _Node | None] = {}  # None: absent now (masks Q's entry)
        self.content = False  # made here, or its data changed
        self.meta = False
        self.written = False  # its data changed (not only made here)
        self.detached = False
        self.link_source: _Node | None = None  # for LINK: the dentry it was linked from
        self.touched = False  # UTIMES named it


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


class ChangeTracker:
    """Replays send-stream commands on a sparse overlay of Q."""

    def __init__(self) -> None:
        self.root = _Node("", None, "")
        self.nodes: list[_Node] = []
        self.touched: list[_Node] = []
        self.commands = 0
        # Path -> node while no entry moves: most commands name the path the previous
        # one did (a new file's RENAME, CHOWN, CHMOD, UTIMES; its parent's UTIMES).
        self._resolved: dict[str, _Node] = {}

    def feed(self, commands: Iterable[Command]) -> None:
        for cmd in commands:
            self.commands += 1
            raw = cmd.raw
            self._step(
                _NUMBERS.get(cmd.name, 0),
                cmd.path() if "path" in raw else None,
                cmd.path("path_to") if "path_to" in raw else None,
                cmd.path("path_link") if "path_link" in raw else None,
                cmd.name,
            )
            if cmd.name == "END":
                break

    def feed_stream(self, data: bytes) -> None:
        """:meth:`feed` straight from a stream's bytes (:func:`parse_paths`)."""
        step = self._step
        for number, path, path_to, path_link in parse_paths(data):
            self.commands += 1
            step(number, path, path_to, path_link)
            if number == _END:
                break

    def _lookup(self, parts: list[str]) -> _Node:
        node = self.root
        for part in parts:
            child = node.children.get(part, _MISSING)
            if child is None:
                raise StreamError(f"send stream names {'/'.join(parts)}, which is gone")
            if child is _MISSING:
                if node.origin is None:
                    raise StreamError(f"send stream names {'/'.join(parts)}, which never existed")
                child = _Node(part, node, _join(node.origin, part))
                node.children[part] = child
                self.nodes.append(child)
            assert isinstance(child, _Node)
            node = child
        return node

    def _resolve(self, path: str) -> _Node:
        node = self._resolved.get(path)
        if node is None:
            node = self._resolved[path] = self._lookup(_split(path))
        return node

    def _parent_and_name(self, path: str) -> tuple[_Node, str]:
        parts = _split(path)
        if not parts:
            raise StreamError("send stream tries to replace the subvolume root")
        return self._lookup(parts[:-1]), parts[-1]

    def _detach(self, node: _Node) -> None:
        self._resolved.clear()
        parent = node.parent
        if parent is None:
            raise StreamError("send stream tries to move the subvolume root")
        if parent.origin is not None:
            parent.children[node.name] = None
        else:
            parent.children.pop(node.name, None)
        node.parent = None
        node.detached = True

    def _attach(self, node: _Node, path: str) -> None:
        self._resolved.clear()
        parent, name = self._parent_and_name(path)
        occupant = parent.children.get(name)
        if isinstance(occupant, _Node):
            occupant.parent = None
            occupant.detached = True
        parent.children[name] = node
        node.name = name
        node.parent = parent
        node.detached = False

    def _step(
        self, n: int, path: str | None, path_to: str | None, path_link: str | None,
        name: str = "",
    ) -> None:
        """Replay command number ``n`` with its path attributes."""
        if n in _PASSED:
            return
        if n == _SUBVOL:
            self._resolved.clear()
            self.root.origin = None  # a full stream: nothing of "Q" exists
            return
        if path is None:
            if n in _ROLES:
                raise StreamError(f"send stream {_name(n, name)} command lacks path")
            return
        role = _ROLES.get(n)
        if role is _Role.CREATE:
            parent, leaf = self._parent_and_name(path)
            if isinstance(parent.children.get(leaf), _Node):
                raise StreamError(f"send stream creates {path}, which exists")
            node = _Node(leaf, parent, None)
            node.content = True
            if n == _LINK:
                # The kernel sends a file moved to another directory as LINK + UNLINK.
                if path_link is None:
                    raise StreamError(f"send stream {_name(n, name)} command lacks path_link")
                node.link_source = self._resolve(path_link)
            parent.children[leaf] = node
            self.nodes.append(node)
        elif role is _Role.RENAME:
            if path_to is None:
                raise StreamError(f"send stream {_name(n, name)} command lacks path_to")
            node = self._resolve(path)
            self._detach(node)
            self._attach(node, path_to)
            self._resolved[path_to] = node  # what the next commands name (a new file's)
        elif role is _Role.REMOVE:
            self._detach(self._resolve(path))
        elif role is _Role.CONTENT:
            node = self._resolve(path)
            node.content = node.written = True
        elif role is _Role.META:
            self._resolve(path).meta = True
        elif role is _Role.TIMES:
            node = self._resolve(path)
            if not node.touched:
                node.touched = True
                self.touched.append(node)
        # END carries nothing settlement compares.

    def _final_paths(self) -> Callable[[_Node], str | None]:
        """Where a node ends up in P (None: gone), remembering every ancestor's answer;
        only valid until the next command is fed."""
        memo: dict[int, str | None] = {id(self.root): ""}

        def final(node: _Node) -> str | None:
            chain: list[_Node] = []
            cur: _Node | None = node
            # Iterative: an agent can nest directories thousands of levels deep.
            while cur is not None and id(cur) not in memo and not cur.detached:
                chain.append(cur)
                cur = cur.parent
            if cur is not None and cur.detached:
                memo[id(cur)] = None
            base = memo[id(cur)] if cur is not None else None
            for link in reversed(chain):
                base = None if base is None else _join(base, link.name)
                memo[id(link)] = base
            return memo[id(node)]

        return final

    def _carried(self, node: _Node) -> bool:
        """In Q this entry sat in the same place under the same parent (so the parent's
        subtree walk already covers it)."""
        parent = node.parent
        return (
            parent is not None
            and parent.origin is not None
            and node.origin is not None
            and node.origin == _join(parent.origin, node.name)
        )

    def result(self, reader: TreeReader | None = None, subpath: str = "") -> ChangeSet:
        """The per-path change set, limited to ``subpath`` and relative to it. Without a
        ``reader`` the subtrees of moved directories and other hard links of changed
        files are not listed."""
        vacated: set[str] = set()  # Q paths whose original entry left
        occupied: set[str] = set()  # P paths whose entry is not Q's entry at that path
        modified: set[str] = set()
        metadata: set[str] = set()
        # a file changed at a new name (moved, or linked there: send renames a file with
        # more than one name by LINK and UNLINK): its other names changed with it; those
        # that are new themselves are occupied anyway. A new link alone changes nothing.
        moved_and_changed: dict[str, bool] = {}  # its final path -> content changed
        renames: list[tuple[str, str]] = []
        final_path = self._final_paths()
        for node in self.nodes:
            final = final_path(node)
            if node.origin is not None and final != node.origin:
                vacated.add(node.origin)
                walk = reader is not None and not self._carried(node)
                if walk and reader is not None:
                    vacated.update(_join(node.origin, r) for r in reader.descendants_q(node.origin))
                    if final is not None:
                        occupied.update(_join(final, r) for r in reader.descendants_p(final))
                if final is not None and not self._carried(node):
                    renames.append((node.origin, final))
            if final is not None and node.origin != final:
                occupied.add(final)
            source = node.link_source
            if (
                final is not None
                and source is not None
                and source.origin is not None
                and final_path(source) is None
            ):
                renames.append((source.origin, final))
            if final is not None and final == node.origin:
                if node.content:
                    modified.add(final)
                elif node.meta:
                    metadata.add(final)
            elif final is not None and (node.written or node.meta):
                moved_and_changed[final] = node.written
        if reader is not None:
            changed_here = {path: path in modified for path in modified | metadata}
            for path, content in sorted({**changed_here, **moved_and_changed}.items()):
                for other in reader.other_links_p(path):
                    if other not in occupied:
                        (modified if content else metadata).add(other)

        def existed(path: str) -> bool:
            if path in vacated:
                return True
            return reader.exists_q(path) if reader is not None else False

        created = {p for p in occupied if not existed(p)}
        modified |= occupied - created
        deleted = vacated - occupied
        metadata -= created | modified | deleted
        touched = {t for t in map(final_path, self.touched) if t is not None}
        return scoped_change_set(created, modified, deleted, metadata, renames, touched,
                                 subpath)


def scoped_change_set(created: set[str], modified: set[str], deleted: set[str],
                      metadata: set[str], renames: Iterable[tuple[str, str]],
                      touched: set[str], subpath: str) -> ChangeSet:
    """The change set of paths relative to the subvolume, limited to ``subpath`` and
    relative to it (a rename only with both sides inside; "" for ``subpath`` itself)."""
    return ChangeSet(
        created=_scoped(created, subpath),
        modified=_scoped(modified, subpath),
        deleted=_scoped(deleted, subpath),
        metadata=_scoped(metadata, subpath),
        renamed=[
            Rename(old=o, new=n)
            for o, n in sorted(
                (_strip(old, subpath), _strip(new, subpath))
                for old, new in renames
                if _inside(old, subpath) and _inside(new, subpath)
            )
        ],
        touched=sorted(
            {"" if t == subpath else _strip(t, subpath) for t in touched if _within(t, subpath)}
        ),
    )


_MISSING: _Node | None = _Node("<missing>", None, None)


def _name(number: int, name: str = "") -> str:
    return name or COMMANDS.get(number) or f"cmd{number}"


def project_scope(subpath: str) -> str:
    """``subpath`` as the change set compares paths with it: no empty or "." parts."""
    return "/".join(_split(subpath))


def _split(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StreamError(f"send stream path {path!r} contains '..'")
    return parts


def _inside(path: str, subpath: str) -> bool:
    return not subpath or path.startswith(subpath + "/")


def _within(path: str, subpath: str) -> bool:
    return not subpath or path == subpath or path.startswith(subpath + "/")


def _strip(path: str, subpath: str) -> str:
    return path[len(subpath) + 1 :] if subpath else path


def _scoped(paths: set[str], subpath: str) -> list[str]:
    return sorted(_strip(p, subpath) for p in paths if _inside(p, subpath))


class FilesystemReader:
    """:class:`TreeReader` over mounted Q and P subvolumes (never follows symlinks).

    Needs no privilege: it runs in the owner's candidate unit. Other hard links of a file
    are found by one walk of P below ``scope`` (the project's subpath; links outside it
    are no part of the change set), made the first time a multiply linked file asks."""

    def __init__(self, q: Path, p: Path, scope: str = "") -> None:
        self.q = q
        self.p = p
        self.scope = scope
        self._links: dict[int, list[str]] | None = None
        self._q_dirs: dict[str, bool] = {}

    @staticmethod
    def _descendants(root: Path, rel: str) -> Iterator[str]:
        top = root / rel if rel else root
        try:
            if not stat.S_ISDIR(os.lstat(top).st_mode):
                return
        except (FileNotFoundError, NotADirectoryError):
            return
        stack = [""]
        while stack:
            sub = stack.pop()
            try:
                it = os.scandir(top / sub if sub else top)
            except PermissionError:
                # The owner's unit cannot list it: the settlement refuses that directory
                # by name (paths.entry_reason), and with it what it holds.
                continue
            with it:
                for entry in it:
                    child = _join(sub, entry.name)
                    yield child
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(child)

    def descendants_q(self, rel: str) -> Iterator[str]:
        return self._descendants(self.q, rel)

    def descendants_p(self, rel: str) -> Iterator[str]:
        return self._descendants(self.p, rel)

    def exists_q(self, rel: str) -> bool:
        head = rel.rpartition("/")[0]
        if head and not self._dir_in_q(head):
            return False  # where it would be is no directory: nothing is there
        try:
            os.lstat(os.path.join(self.q, rel))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def _dir_in_q(self, rel: str) -> bool:
        """Whether ``rel`` is a directory of Q, every one on the way a real one (never
        through a symlink), looked up once (Q is read-only)."""
        known = self._q_dirs.get(rel)
        if known is None:
            head = rel.rpartition("/")[0]
            try:
                known = (not head or self._dir_in_q(head)) and stat.S_ISDIR(
                    os.lstat(os.path.join(self.q, rel)).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                known = False
            self._q_dirs[rel] = known
        return known

    def other_links_p(self, rel: str) -> list[str]:
        try:
            st = os.lstat(os.path.join(self.p, rel))
        except (FileNotFoundError, NotADirectoryError):
            return []
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            return []
        if self._links is None:
            self._links = self._multiply_linked()
        return [other for other in self._links.get(st.st_ino, []) if other != rel]

    def _multiply_linked(self) -> dict[int, list[str]]:
        links: dict[int, list[str]] = {}
        top = self.p / self.scope if self.scope else self.p
        for sub in self._descendants(self.p, self.scope):
            st = os.lstat(top / sub)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                links.setdefault(st.st_ino, []).append(_join(self.scope, sub))
        return links


def changes(q: Path, p: Path, *, subpath: str = "") -> ChangeSet:
    """Changes from read-only subvolume ``q`` to read-only subvolume ``p`` (root only: it
    runs ``btrfs send``), limited to the project at ``subpath`` and relative to it."""
    # Imported here: the candidate unit parses a stream it is handed (changes_in) and
    # never loads storage, btrfsutil or the process helper.
    from cairn.storage import metadata_stream

    return changes_in(metadata_stream(q, p), q, p, subpath=subpath)


def changes_in(stream: bytes, q: Path, p: Path, *, subpath: str = "") -> ChangeSet:
    """The change set a :func:`cairn.storage.metadata_stream` of ``q`` and ``p``
    describes, limited to ``subpath`` and relative to it; ``q`` and ``p`` are read for
    what the stream does not say (the subtrees of moved directories, other hard links)."""
    sub = project_scope(subpath)
    tracker = ChangeTracker()
    # The kernel made the stream and root handed it over unchanged; the CRC check would
    # only cost time here (it is exercised in the tests). Parsing refuses malformed input.
    tracker.feed_stream(stream)
    result = tracker.result(FilesystemReader(q, p, sub), sub)
    log.info("changes %s -> %s: %d commands, %d paths", q, p, tracker.commands, len(result.paths()))
    return result
