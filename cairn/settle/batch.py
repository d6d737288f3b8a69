"""One batch of the live apply (:mod:`cairn.settle.apply`): its walk of the live tree,
and what of F the paths it writes keep besides content and mode: F's ``user.*`` xattrs
(a path whose xattrs the live filesystem refuses is noted, not failed) and F's hard links
among the paths written in the batch (a name that cannot be linked is noted and copied).
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Literal

from cairn.fsutil import copy_user_xattrs
from cairn.pathrules import TMP_PREFIX
from cairn.settle.walk import Blocked, EntryState, Tree

log = logging.getLogger(__name__)

Entry = tuple[str, Literal["written", "deleted", "already"], EntryState]  # a receipt to be


class Raced(Exception):
    """``path`` changed in the live project during the apply: the batch stops."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class Batch:
    """One batch's live directory walk and the receipts of what it changed.
    ``ordered``: the live filesystem commits metadata whole and in order (Btrfs), so a
    temporary that holds no bytes written through the page cache needs no barrier before
    its rename; ``bytes_written``: one of this batch's temporaries does. ``linked``:
    F's inode of a file with more than one name → the path, the temporary and the batch
    that wrote it first (the apply's, shared by its batches): a later name of it in the
    same batch becomes a link to that temporary, one in a later batch a copy."""

    def __init__(self, live: Path, ordered: bool, number: int = 0,
                 linked: dict[int, tuple[str, str, int]] | None = None) -> None:
        self.tree = Tree(live)
        self.done: list[Entry] = []
        self.ordered = ordered
        self.number = number
        self.bytes_written = False
        self.xattrs_not_kept: list[str] = []
        self.links_not_kept: list[str] = []
        self.linked = {} if linked is None else linked

    def first_name(self, ino: int, path: str, tmp: str) -> None:
        """The temporary ``tmp`` of ``path`` holds F's file ``ino``, which has other names;
        one of them written in an earlier batch makes ``path`` a link not kept."""
        first = self.linked.setdefault(ino, (path, tmp, self.number))
        if first[2] != self.number:
            self.links_not_kept.append(path)

    def parent_fd(self, path: str) -> int:
        try:
            fd = self.tree.parent(path)
        except Blocked as exc:
            raise Raced(path) from exc
        if fd is None:
            raise Raced(path)
        return fd

    def close(self) -> None:
        self.tree.close()

    def needs_barrier(self, temps: int) -> bool:
        """Whether ``temps`` temporaries must be made durable before their renames: a
        rename that became durable first would leave a crash a target without its data."""
        return self.bytes_written or (temps > 0 and not self.ordered)


def linked_temp(batch: Batch, ft: Tree, path: str) -> str | None:
    """A temporary for ``path`` that is another name of this batch's temporary of the
    same file of F (a hard link within the change set stays one); None when there is
    none, or the live filesystem refuses the link (a copy is made instead)."""
    ffd = ft.parent(path)
    if ffd is None:
        return None
    st = os.stat(path.rpartition("/")[2], dir_fd=ffd, follow_symlinks=False)
    first = batch.linked.get(st.st_ino) if st.st_nlink > 1 else None
    if first is None or first[2] != batch.number:
        return None  # the first name's temporary, if any, was renamed in its own batch
    src = os.dup(batch.parent_fd(first[0]))  # a walk's fd is valid until its next call
    tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    try:
        os.link(first[1], tmp, src_dir_fd=src, dst_dir_fd=batch.parent_fd(path),
                follow_symlinks=False)
    except OSError as exc:
        log.info("%s: not linked to %s (%s); copied", path, first[0], exc.strerror)
        batch.links_not_kept.append(path)
        return None
    finally:
        os.close(src)
    if first[0] in batch.xattrs_not_kept:
        batch.xattrs_not_kept.append(path)
    return tmp


def keep_xattrs(batch: Batch, path: str, src: int | str, dst: int | str) -> None:
    """F's ``user.*`` xattrs onto the new ``dst``; a path whose xattrs the live
    filesystem refuses is noted, not failed (its content and mode are F's)."""
    if copy_user_xattrs(src, dst, fresh=True):
        batch.xattrs_not_kept.append(path)


def dir_xattrs(batch: Batch, ft: Tree, path: str, live_fd: int, name: str) -> None:
    """F's ``user.*`` xattrs of the directory ``path`` onto the one just made in live."""
    try:
        src = ft.dir(path)
    except Blocked:
        return
    if src is None:
        return
    dst = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                  dir_fd=live_fd)
    try:
        keep_xattrs(batch, path, src, dst)
    finally:
        os.close(dst)
