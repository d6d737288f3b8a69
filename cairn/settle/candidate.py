"""The candidate C (ARCHITECTURE §9): a writable snapshot of Q brought to Q plus only the
changes of P that host policy allows, each change whole with what depends on it.

Which single entry policy allows is :mod:`cairn.settle.paths`; how refusals spread is
:mod:`cairn.settle.deps`. Nested subvolumes and other entries the send stream does not
carry are looked for in the directories the stream touched and reported as refused, so
nothing of a proposal disappears without a reason.

P is the agent's: everything of it is read as :mod:`cairn.untrusted` reads (no symbolic
link followed in any component, nothing opened that could block), so a changed path
that lies below a link in P is refused, never read through the link.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from cairn import untrusted
from cairn.errors import StorageError
from cairn.fsutil import copy_file_data, copy_user_xattrs
from cairn.pathrules import TMP_PREFIX, check_relative, depth, parent, printable_name
from cairn.settle.changes import ChangeSet
from cairn.settle.deps import close_refusals
from cairn.settle.paths import (
    IGNORED,
    NESTED_SUBVOLUME,
    SettlementPolicy,
    entry_reason,
    glob_regex,
    ignored_by,
    is_nested_subvolume,
    policy_reason,
)

log = logging.getLogger(__name__)


# Dataclasses, not pydantic (the candidate unit starts from this module); root reads what
# the unit writes as a CandidateResult
# (/usr/share/doc/cairn/docs/decisions/helpers-without-pydantic.md).
@dataclass(frozen=True, slots=True)
class Refused:
    """A change left out of C, and why (a ``RefusedPath`` to root)."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    """What went into C and what did not."""

    accepted: list[str]
    refused: list[Refused]
    ignored: list[str]
    bytes_accepted: int


@dataclass(frozen=True, slots=True)
class _Decision:
    """Which changes of P go into C: ``refused`` (path → reason, IGNORED included), the
    entries of P to install, and the deletions in the order they are carried out."""

    refused: dict[str, str]
    entries: dict[str, tuple[os.stat_result, str]]
    deletions: list[str]


def _decide(q: Path, p: Path, changes: ChangeSet, policy: SettlementPolicy) -> _Decision:
    patterns = [glob_regex(g) for g in policy.write_paths]
    ignore = [glob_regex(g) for g in policy.ignore]
    # Ignored paths are refused with IGNORED while dependents are worked out (what rests on
    # one is left as in Q too), then reported apart.
    refused: dict[str, str] = {}

    def judged(path: str) -> str:
        check_relative(path)
        return IGNORED if ignored_by(path, ignore) else policy_reason(path, policy, patterns)
    total = 0

    present = sorted(
        {*changes.created, *changes.modified, *changes.metadata}, key=lambda s: (depth(s), s)
    )
    entries: dict[str, tuple[os.stat_result, str]] = {}
    not_dirs: set[str] = set()  # entries of P seen not to be directories
    with untrusted.Dirs(p) as p_dirs:
        for path in present:
            reason = judged(path)
            if not reason:
                reason = _judge(p_dirs, path, policy, entries, not_dirs, total)
                if not reason and path in entries and stat.S_ISREG(entries[path][0].st_mode):
                    total += entries[path][0].st_size
            if reason:
                refused[path] = reason

    deletions = sorted(set(changes.deleted) - set(present), key=lambda s: (-depth(s), s))
    for path in deletions:
        reason = judged(path)
        if reason:
            refused[path] = reason

    # A path new in P that is no directory there holds no nested subvolume on either side.
    for path, reason in nested_subvolumes(q, p, changes, not_dirs & set(changes.created)).items():
        refused.setdefault(path, reason)

    replaced_dirs = [
        path
        for path in changes.modified
        if _is_dir(q, path) and not (path in entries and stat.S_ISDIR(entries[path][0].st_mode))
    ]
    close_refusals(changes, refused, replaced_dirs)
    return _Decision(refused, entries, deletions)


def _report(decision: _Decision, accepted: list[str]) -> Report:
    refused, entries = decision.refused, decision.entries
    return Report(
        accepted=sorted(accepted),
        refused=[Refused(printable_name(k), v) for k, v in sorted(refused.items())
                 if v != IGNORED],
        ignored=sorted(printable_name(k) for k, v in refused.items() if v == IGNORED),
        bytes_accepted=sum(
            entries[a][0].st_size
            for a in accepted
            if a in entries and stat.S_ISREG(entries[a][0].st_mode)
        ),
    )


def check_proposal(q: Path, p: Path, changes: ChangeSet, policy: SettlementPolicy) -> Report:
    """What :func:`build_candidate` would accept and refuse of P, without building C: the
    same judgement, path by path (a trial's check before it may be accepted)."""
    decision = _decide(q, p, changes, policy)
    would = [path for path in (*decision.deletions, *decision.entries)
             if path not in decision.refused]
    return _report(decision, would)


def build_candidate(
    q: Path, p: Path, c: Path, changes: ChangeSet, policy: SettlementPolicy
) -> Report:
    """Bring C (a fresh writable snapshot of Q) to Q plus the allowed changes of P.

    Paths are relative to the project root inside each of ``q``, ``p`` and ``c``.
    Refusals are decided completely before C is touched; a write into C that then fails
    raises ``StorageError`` rather than leave C with half of a change.
    """
    decision = _decide(q, p, changes, policy)
    refused, entries, deletions = decision.refused, decision.entries, decision.deletions
    accepted: list[str] = []
    for path in deletions:
        if path not in refused:
            try:
                _remove_in(c, path)
            except (OSError, StorageError) as exc:
                raise _candidate_error(path, "delete", exc) from exc
            accepted.append(path)
    # P's inode of an accepted file with more than one name → its first path in C: the
    # names after it become links to that file, so a hard link within the change set stays
    linked: dict[int, str] = {}
    with untrusted.Dirs(p) as p_dirs, untrusted.Dirs(c) as c_dirs:
        for path, (st, target) in entries.items():
            if path not in refused:
                try:
                    if stat.S_ISREG(st.st_mode) and st.st_ino in linked:
                        _link_in_c(p, c, c_dirs, linked[st.st_ino], path)
                    elif stat.S_ISREG(st.st_mode):
                        _install_file(p_dirs, c_dirs, p, c, path, st)
                        if st.st_nlink > 1:
                            linked[st.st_ino] = path
                    else:
                        _install(p, c, path, st, target)
                        c_dirs.forget(path)  # a directory it replaced
                except (OSError, StorageError, untrusted.UntrustedFileError) as exc:
                    raise _candidate_error(path, "write", exc) from exc
                accepted.append(path)

    report = _report(decision, accepted)
    log.info("candidate %s: %d accepted, %d refused, %d ignored", c, len(report.accepted),
             len(report.refused), len(report.ignored))
    return report


def _judge(
    p_dirs: untrusted.Dirs,
    path: str,
    policy: SettlementPolicy,
    entries: dict[str, tuple[os.stat_result, str]],
    not_dirs: set[str],
    total: int,
) -> str:
    """Why the entry of P at ``path`` is refused ("" and recorded in ``entries`` if it is
    not), read as :mod:`cairn.untrusted` reads: P is the agent's, no link is followed on
    the way. ``total``: the bytes of regular files accepted so far."""
    try:
        st = untrusted.lstat(p_dirs, path)
        target = untrusted.readlink(p_dirs, path) if stat.S_ISLNK(st.st_mode) else ""
    except untrusted.UntrustedFileMissing:
        return "missing from the proposal snapshot"
    except untrusted.UntrustedFileError as exc:
        return f"in the proposal snapshot: {exc.reason}"
    if not stat.S_ISDIR(st.st_mode):
        not_dirs.add(path)
    reason = entry_reason(path, st, target, policy)
    if not reason and stat.S_ISREG(st.st_mode) and total + st.st_size > policy.max_total_bytes:
        reason = f"total size of the proposal exceeds {policy.max_total_bytes} bytes"
    if not reason:
        entries[path] = (st, target)
    return reason


def _candidate_error(
    path: str, what: str, exc: OSError | StorageError | untrusted.UntrustedFileError
) -> StorageError:
    msg = exc.strerror if isinstance(exc, OSError) else exc.message
    return StorageError(
        f"cannot {what} {path} in the candidate: {msg}",
        hint="nothing was applied; inspect the pool (free space, the C subvolume)",
    )


def _is_dir(root: Path, path: str) -> bool:
    """Whether ``root/path`` is a directory, reached following no link."""
    try:
        return stat.S_ISDIR(untrusted.lstat(root, path).st_mode)
    except untrusted.UntrustedFileError:
        return False


def open_beneath(root: Path, path: str, flags: int) -> int:
    """An fd of ``root/path`` ("" is ``root``) opened with ``flags``, following no symbolic
    link in any component (the last one included), never blocking. :mod:`cairn.untrusted`
    opens only regular files; this is its walk for directories and ``O_PATH``."""
    if not path:
        return os.open(root, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    parts = check_relative(path)
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            how = flags | os.O_NONBLOCK if last else os.O_PATH | os.O_DIRECTORY
            nxt = os.open(part, how | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _nested_names(root: Path, rel: str) -> set[str] | None:
    """Names of the nested subvolumes (or their placeholders) directly in ``root/rel``;
    None when that is not a plain directory of ``root``'s subvolume."""
    try:
        fd = open_beneath(root, rel, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # absent, not a directory, or below a symbolic link
        return None
    try:
        st = os.fstat(fd)
        if rel and is_nested_subvolume(st):
            return None
        found = set()
        with os.scandir(fd) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False) and is_nested_subvolume(
                    entry.stat(follow_symlinks=False), st.st_dev
                ):
                    found.add(entry.name)
    finally:
        os.close(fd)
    return found


def nested_subvolumes(
    q: Path, p: Path, changes: ChangeSet, not_dirs: AbstractSet[str] = frozenset()
) -> dict[str, str]:
    """Nested subvolumes that differ between Q and P, with the reason they are refused.

    ``btrfs send`` leaves them out (a snapshot holds only an empty placeholder directory
    for each, and none of its files), so they are looked for in every directory whose
    entries changed: those the stream touched and those that are new in P. ``not_dirs``:
    paths the caller saw are a directory in neither Q nor P (not looked into).
    """
    dirs = {*changes.touched, *changes.created, *changes.modified} - not_dirs
    found: dict[str, str] = {}
    for rel in sorted(dirs):
        in_p = _nested_names(p, rel)
        in_q = _nested_names(q, rel)
        for name in sorted((in_p or set()) - (in_q or set())):
            found[f"{rel}/{name}" if rel else name] = NESTED_SUBVOLUME
        for name in sorted((in_q or set()) - (in_p or set())):
            found[f"{rel}/{name}" if rel else name] = (
                "nested subvolume of the project: changing it is not part of the proposal"
            )
    return found


def _real_parent(root: Path, path: str) -> Path:
    """``root/parent(path)``, refusing when any component is not a real directory."""
    cur = root
    for part in check_relative(path)[:-1]:
        cur = cur / part
        st = os.lstat(cur)
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{cur} is not a directory")
    return cur


def _remove_in(root: Path, path: str) -> None:
    parent = _real_parent(root, path)
    target = parent / path.rsplit("/", 1)[-1]
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(target)
    else:
        os.unlink(target)


def _ensure_parents(src_root: Path, dst_root: Path, path: str) -> None:
    cur_dst = dst_root
    parts = check_relative(path)[:-1]
    for i, part in enumerate(parts):
        cur_dst = cur_dst / part
        st = _c_entry(cur_dst)
        if st is None:
            src = untrusted.lstat(src_root, "/".join(parts[: i + 1]))
            os.mkdir(cur_dst, 0o700)
            os.chmod(cur_dst, stat.S_IMODE(src.st_mode) & 0o1777)
        elif not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{cur_dst} is not a directory")


def _c_entry(dst: Path) -> os.stat_result | None:
    """The entry at ``dst`` in C (root's own snapshot; its parents checked), or None."""
    try:
        return os.lstat(dst)
    except FileNotFoundError:
        return None


def _c_entry_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The entry ``name`` in C's directory ``dir_fd`` (not followed), or None."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_same(fd: int, st: os.stat_result, path: str) -> None:
    """Refuse when the entry opened in P is not the one judged (P is read-only: never)."""
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino, now.st_mode) != (st.st_dev, st.st_ino, st.st_mode):
        raise StorageError(f"{path} changed in the proposal snapshot while it was read")


def _copy_user_xattrs(src: int | str, dst: int | str, fresh: bool = False) -> None:
    """:func:`cairn.fsutil.copy_user_xattrs` into C, which shares P's filesystem: one
    it refuses is a storage error, not a loss to report."""
    refused = copy_user_xattrs(src, dst, fresh=fresh)
    if refused:
        raise StorageError(f"the candidate could not hold the xattrs {', '.join(refused)}")


def _copy_dir_xattrs(p: Path, path: str, st: os.stat_result, dst: Path) -> None:
    """The ``user.*`` xattrs of the directory ``p/path`` onto ``dst`` in C, both reached
    as ``O_PATH`` fds (search permission is enough, as for a path)."""
    sfd = open_beneath(p, path, os.O_PATH | os.O_DIRECTORY)
    try:
        _check_same(sfd, st, path)
        dfd = os.open(dst, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            _copy_user_xattrs(f"/proc/self/fd/{sfd}", f"/proc/self/fd/{dfd}")
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _install_file(
    p_dirs: untrusted.Dirs, c_dirs: untrusted.Dirs, p: Path, c: Path, path: str,
    st: os.stat_result,
) -> None:
    """:func:`_install` for a regular file, through directory fds kept open: P's file
    opened through :mod:`cairn.untrusted` from its parent (no link followed on the way),
    the copy made next to its target in C. A name C does not hold yet is created in
    place (C is this unit's alone, and a candidate that fails is deleted whole);
    otherwise a temporary is renamed over it."""
    try:
        c_parent = c_dirs.dir(parent(path))
    except untrusted.UntrustedFileMissing:
        _ensure_parents(p, c, path)
        c_parent = c_dirs.dir(parent(path))
    except untrusted.UntrustedFileError as exc:
        raise StorageError(f"{c / parent(path)} is not a directory: {exc.reason}") from None
    name = path.rpartition("/")[2]
    mode = stat.S_IMODE(st.st_mode)
    # Hard links inside the project are legitimate; P is read-only, so the size judged
    # is the size read.
    sfd = untrusted.open_file(p_dirs, path, owner=None, limit=st.st_size, single_link=False)
    try:
        _check_same(sfd, st, path)
        made, dfd = _create_in_c(c_dirs, c_parent, path, mode)
        try:
            if st.st_size:
                copy_file_data(sfd, dfd)
            if stat.S_IMODE(os.fstat(dfd).st_mode) != mode:  # the umask took some bits
                os.fchmod(dfd, mode)
            _copy_user_xattrs(sfd, dfd, fresh=True)
            if os.geteuid() == 0:
                os.fchown(dfd, st.st_uid, st.st_gid)
                os.fchmod(dfd, mode)  # chown clears setuid-like bits; restore the exact mode
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    if made != name:
        os.rename(made, name, src_dir_fd=c_parent, dst_dir_fd=c_parent)


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_in_c(p: Path, c: Path, c_dirs: untrusted.Dirs, first: str, path: str) -> None:
    """``path`` in C as another name of the file just installed at ``first`` (in P they
    are one file): linked at its name, or over what C holds there through a temporary.
    C is this unit's alone."""
    src = os.dup(c_dirs.dir(parent(first)))  # a Dirs fd is valid until its next call
    try:
        try:
            dst = c_dirs.dir(parent(path))
        except untrusted.UntrustedFileMissing:
            _ensure_parents(p, c, path)
            dst = c_dirs.dir(parent(path))
        name = path.rpartition("/")[2]
        existing = _c_entry_at(dst, name)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            os.rmdir(name, dir_fd=dst)
            c_dirs.forget(path)
            dst = c_dirs.dir(parent(path))
            existing = None
        made = name if existing is None else f"{TMP_PREFIX}{secrets.token_hex(6)}"
        os.link(first.rpartition("/")[2], made, src_dir_fd=src, dst_dir_fd=dst,
                follow_symlinks=False)
        if made != name:
            os.rename(made, name, src_dir_fd=dst, dst_dir_fd=dst)
    finally:
        os.close(src)


def _create_in_c(c_dirs: untrusted.Dirs, c_parent: int, path: str, mode: int) -> tuple[str, int]:
    """A new file for ``path`` in C's directory ``c_parent``: at its name when C holds
    nothing there (a directory there is removed first), else a temporary to be renamed
    over it. Its name and a write fd."""
    name = path.rpartition("/")[2]
    try:
        return name, os.open(name, _CREATE, mode, dir_fd=c_parent)
    except FileExistsError:
        pass
    existing = _c_entry_at(c_parent, name)
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        os.rmdir(name, dir_fd=c_parent)
        c_dirs.forget(path)
        return name, os.open(name, _CREATE, mode, dir_fd=c_parent)
    tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    return tmp, os.open(tmp, _CREATE, mode, dir_fd=c_parent)


def _install(p: Path, c: Path, path: str, st: os.stat_result, target: str) -> None:
    """Make ``c/path`` the same entry as ``p/path`` (content, mode, user xattrs, and the
    owner when running as root). P is read through :mod:`cairn.untrusted` (or, for a
    directory's xattrs, :func:`open_beneath`): no link followed, nothing that blocks."""
    _ensure_parents(p, c, path)
    dst = _real_parent(c, path) / path.rsplit("/", 1)[-1]
    mode = stat.S_IMODE(st.st_mode)
    existing = _c_entry(dst)
    if stat.S_ISDIR(st.st_mode):
        if existing is not None and not stat.S_ISDIR(existing.st_mode):
            os.unlink(dst)
            existing = None
        if existing is None:
            os.mkdir(dst, 0o700)
        os.chmod(dst, mode)
        _copy_dir_xattrs(p, path, st, dst)
    else:
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            os.rmdir(dst)
        tmp = dst.with_name(f"{TMP_PREFIX}{secrets.token_hex(6)}")
        if stat.S_ISLNK(st.st_mode):
            os.symlink(target, tmp)  # user.* xattrs are not allowed on symlinks
        else:
            # Hard links inside the project are legitimate; P is read-only, so the size
            # judged is the size read.
            sfd = untrusted.open_file(p, path, owner=None, limit=st.st_size, single_link=False)
            try:
                _check_same(sfd, st, path)
                dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    copy_file_data(sfd, dfd)
                    os.fchmod(dfd, mode)
                    _copy_user_xattrs(sfd, dfd)
                finally:
                    os.close(dfd)
            finally:
                os.close(sfd)
        os.rename(tmp, dst)
    if os.geteuid() == 0:
        os.lchown(dst, st.st_uid, st.st_gid)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(dst, mode)  # chown clears setuid-like bits; restore the exact mode
