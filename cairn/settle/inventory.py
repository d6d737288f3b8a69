"""Whether two trees are the same, entry by entry: the check that an empty change set
of Q and P really is empty (:func:`inventories_equal`)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

from cairn import untrusted
from cairn.settle.candidate import open_beneath
from cairn.settle.paths import glob_regex

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


# -- inventories ------------------------------------------------------------------------


def _entries(root: Path, ignore: list[str] | None = None) -> Iterator[str]:
    """Every path below ``root`` but those ``ignore`` matches and what lies below them,
    each directory listed through an fd reached following no link (the tree may be the
    agent's)."""
    skipped = [glob_regex(g) for g in ignore or []]
    stack = [""]
    while stack:
        sub = stack.pop()
        fd = open_beneath(root, sub, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(fd) as it:
                listed = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        finally:
            os.close(fd)
        for name, is_dir in listed:
            rel = f"{sub}/{name}" if sub else name
            if skipped and any(p.match(rel) for p in skipped):
                continue
            yield rel
            if is_dir:
                stack.append(rel)


def _chunks(fd: int, limit: int) -> Iterator[bytes]:
    """The bytes of ``fd`` in chunks of ``_CHUNK`` (the last one shorter), at most
    ``limit + 1`` of them in all."""
    left = limit + 1
    while left:
        chunk = os.read(fd, min(_CHUNK, left))
        while chunk and len(chunk) < min(_CHUNK, left):  # a short read is not the end
            more = os.read(fd, min(_CHUNK, left) - len(chunk))
            if not more:
                break
            chunk += more
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def _same_bytes(q: Path, p: Path, rel: str, size: int) -> bool:
    """Whether the regular files ``rel`` of ``q`` and ``p``, both ``size`` bytes when
    listed, hold the same bytes. Either may be the agent's: each is opened through
    :mod:`cairn.untrusted` (no link followed, never blocking, still a regular file of at
    most ``size`` bytes), and no more than ``size + 1`` bytes are read from either."""
    fq = untrusted.open_file(q, rel, owner=None, limit=size, single_link=False)
    try:
        fp = untrusted.open_file(p, rel, owner=None, limit=size, single_link=False)
        try:
            total = 0
            for ca, cb in zip_longest(_chunks(fq, size), _chunks(fp, size)):
                if ca != cb:
                    return False
                total += len(ca)
            return total == size
        finally:
            os.close(fp)
    finally:
        os.close(fq)


def _xattrs(root: Path, rel: str) -> dict[str, bytes]:
    """All xattrs of ``root/rel`` (not a symbolic link), reached following no link and
    without opening the entry itself (an ``O_PATH`` fd: no side effect on a device)."""
    fd = open_beneath(root, rel, os.O_PATH)
    try:
        where = f"/proc/self/fd/{fd}"
        return {n: os.getxattr(where, n) for n in os.listxattr(where)}
    finally:
        os.close(fd)


def inventories_equal(
    q: Path, p: Path, subpath: str = "", ignore: list[str] | None = None
) -> bool:
    """Whether the trees under ``subpath`` of Q and P are identical: names, types, modes,
    owners, symlink targets, file bytes and xattrs, leaving out what the ``ignore`` globs
    match (:attr:`SettlementPolicy.ignore`). Cost grows with the tree; use it only to
    confirm that an empty change set really is empty. P (and Q) are read as
    :mod:`cairn.untrusted` reads; an entry it refuses makes the trees unequal."""
    qr, pr = (q / subpath, p / subpath) if subpath else (q, p)
    try:
        q_list = list(_entries(qr, ignore))
        if set(q_list) != set(_entries(pr, ignore)):
            return False
        for rel in q_list:
            qs, ps = untrusted.lstat(qr, rel), untrusted.lstat(pr, rel)
            if (qs.st_mode, qs.st_uid, qs.st_gid) != (ps.st_mode, ps.st_uid, ps.st_gid):
                return False
            if stat.S_ISLNK(qs.st_mode):
                if untrusted.readlink(qr, rel) != untrusted.readlink(pr, rel):
                    return False
                continue
            if stat.S_ISREG(qs.st_mode) and (
                qs.st_size != ps.st_size or not _same_bytes(qr, pr, rel, qs.st_size)
            ):
                return False
            if _xattrs(qr, rel) != _xattrs(pr, rel):
                return False
    except (untrusted.UntrustedFileError, OSError) as exc:
        log.warning("inventories of %s and %s taken as different: %s", qr, pr, exc)
        return False
    return True
