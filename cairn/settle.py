"""Proposal settlement (ARCHITECTURE §9): the candidate C and the three-way live apply.

``build_candidate`` (:mod:`cairn.settle_candidate`, with the path policy in
:mod:`cairn.settle_paths` and the dependency rules in :mod:`cairn.settle_deps`) copies
into C (a writable snapshot of Q) only the changes of P that host policy allows, each
whole with what depends on it. ``apply`` writes F into the live project path by path: live == Q →
write F; live == F → already applied; anything else → conflict, and then nothing is
written at all. Every path is walked component by component without following symlinks,
so a symlink planted in the live tree can never redirect a write.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import zip_longest
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cairn import untrusted
from cairn.errors import StorageError
from cairn.failpoints import failpoint
from cairn.protocol.broker import (
    AppliedCheck,
    ApplyConflict,
    ApplyResult,
    CandidateReport,
    RefusedPath,
)
from cairn.settle_candidate import (
    TMP_PREFIX,
    build_candidate,
    copy_file_data,
    open_beneath,
)
from cairn.settle_paths import (
    SettlementPolicy,
    ancestors,
    check_relative,
    depth,
    glob_regex,
    parent,
)

__all__ = [
    "ApplyConflict",
    "ApplyPlan",
    "ApplyReceipt",
    "ApplyResult",
    "CandidateReport",
    "EntryState",
    "PathPlan",
    "RefusedPath",
    "SettlementPolicy",
    "apply",
    "build_candidate",
    "check_relative",
    "entry_state",
    "glob_regex",
    "inventories_equal",
    "plan_apply",
]

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


class EntryState(BaseModel):
    """What apply compares: type, permission bits, content hash, symlink target.
    ``blocked`` means a parent directory is missing as a directory (e.g. a symlink)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["absent", "file", "dir", "symlink", "other", "blocked"]
    mode: int = 0
    sha256: str = ""
    target: str = ""


class PathPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    action: Literal["write", "already", "unchanged", "conflict"]
    q: EntryState
    f: EntryState
    live: EntryState


class ApplyPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paths: list[PathPlan]

    @property
    def conflicts(self) -> list[ApplyConflict]:
        return [
            ApplyConflict(path=p.path, reason=_conflict_reason(p))
            for p in self.paths
            if p.action == "conflict"
        ]

    @property
    def writes(self) -> list[PathPlan]:
        return [p for p in self.paths if p.action == "write"]


class ApplyReceipt(BaseModel):
    """One JSONL line in the receipts file, written (and fsync'd) per settled path."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    action: Literal["written", "deleted", "already"]
    f: EntryState
    at: float


# -- inventories ------------------------------------------------------------------------


def _entries(root: Path) -> Iterator[str]:
    """Every path below ``root``, each directory listed through an fd reached following
    no link (the tree may be the agent's)."""
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


def inventories_equal(q: Path, p: Path, subpath: str = "") -> bool:
    """Whether the trees under ``subpath`` of Q and P are identical: names, types, modes,
    owners, symlink targets, file bytes and xattrs. Cost grows with the tree; use it only
    to confirm that an empty change set really is empty. P (and Q) are read as
    :mod:`cairn.untrusted` reads; an entry it refuses makes the trees unequal."""
    qr, pr = (q / subpath, p / subpath) if subpath else (q, p)
    try:
        q_list = list(_entries(qr))
        if set(q_list) != set(_entries(pr)):
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


# -- three-way apply --------------------------------------------------------------------


class _Dir:
    """An open directory fd reached from a root without following any symlink."""

    @staticmethod
    @contextmanager
    def parent_of(root: Path, parts: list[str]) -> Iterator[int | None]:
        """Yields the fd of the directory holding ``parts[-1]``; None when a component is
        missing; raises ``_Blocked`` when a component exists but is not a directory."""
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                try:
                    nfd = os.open(
                        part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                    )
                except FileNotFoundError:
                    os.close(fd)
                    fd = -1
                    yield None
                    return
                except OSError as exc:
                    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                        raise _Blocked(part) from exc
                    raise
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            if fd >= 0:
                os.close(fd)


class _Blocked(Exception):
    pass


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def _state_in(dir_fd: int, name: str) -> EntryState:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return EntryState(kind="absent")
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            return EntryState(kind="file", mode=mode, sha256=_hash_fd(fd))
        finally:
            os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        return EntryState(kind="dir", mode=mode)
    if stat.S_ISLNK(st.st_mode):
        return EntryState(kind="symlink", target=os.readlink(name, dir_fd=dir_fd))
    return EntryState(kind="other", mode=mode)


def entry_state(root: Path, path: str) -> EntryState:
    """The state of ``root/path`` without following symlinks anywhere on the way."""
    parts = check_relative(path)
    try:
        with _Dir.parent_of(root, parts) as fd:
            if fd is None:
                return EntryState(kind="absent")
            return _state_in(fd, parts[-1])
    except _Blocked:
        return EntryState(kind="blocked")


def _conflict_reason(p: PathPlan) -> str:
    if p.live.kind == "blocked":
        return "a parent directory in the live project is not a real directory"
    if p.q == p.live:
        return "directory holds entries that are not part of the proposal"
    return f"live {p.live.kind} matches neither the run's start nor the proposal"


def plan_apply(q: Path, f: Path, live: Path, paths: list[str]) -> ApplyPlan:
    """Classify every path: Q == F → ``unchanged``; live == F → ``already``; live == Q →
    ``write``; otherwise ``conflict``. Reads only."""
    planned: list[PathPlan] = []
    by_path: dict[str, PathPlan] = {}
    for path in sorted(set(paths)):  # a directory sorts before what it holds
        qs, fs, ls = entry_state(q, path), entry_state(f, path), entry_state(live, path)
        # Q and F are the run's own snapshots: below a non-directory nothing exists there.
        qs, fs = (_ABSENT if s.kind == "blocked" else s for s in (qs, fs))
        if ls.kind == "blocked" and _unblocked_by_apply(live, path, by_path):
            ls = _ABSENT
        action: Literal["write", "already", "unchanged", "conflict"]
        if qs == fs:
            action = "unchanged"  # nothing to settle here, whatever the live state
        elif ls == fs:
            action = "already"
        elif ls == qs and ls.kind != "blocked" and fs.kind != "blocked":
            action = "write"
        else:
            action = "conflict"
        planned.append(PathPlan(path=path, action=action, q=qs, f=fs, live=ls))
        by_path[path] = planned[-1]
    removed = {p.path for p in planned if p.action == "write" and _needs_removal(p)}
    for i, p in enumerate(planned):
        if p.action == "write" and p.live.kind == "dir" and p.path in removed:
            if _extra_entries(live, p.path, removed):
                planned[i] = p.model_copy(update={"action": "conflict"})
    return ApplyPlan(paths=planned)


_ABSENT = EntryState(kind="absent")


def _unblocked_by_apply(live: Path, path: str, by_path: dict[str, PathPlan]) -> bool:
    """Whether the live non-directory that blocks ``path`` is one this apply replaces
    with a directory (file → directory in the proposal): then ``path`` is absent."""
    for top in reversed(ancestors(path)):
        plan = by_path.get(top)
        state = plan.live if plan is not None else entry_state(live, top)
        if state.kind == "dir":
            continue
        return plan is not None and plan.action == "write" and plan.f.kind == "dir"
    return False


def _extra_entries(live: Path, path: str, removed: set[str]) -> bool:
    parts = path.split("/")
    try:
        with _Dir.parent_of(live, parts) as fd:
            if fd is None:
                return False
            dfd = os.open(
                parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
    except _Blocked:
        return True
    try:
        names = os.listdir(dfd)
    finally:
        os.close(dfd)
    return any(f"{path}/{n}" not in removed for n in names)


def _needs_removal(p: PathPlan) -> bool:
    if p.q.kind == "absent":
        return False
    return p.f.kind == "absent" or (p.q.kind == "dir") != (p.f.kind == "dir")


def _read_receipts(receipts: Path) -> dict[str, ApplyReceipt]:
    done: dict[str, ApplyReceipt] = {}
    try:
        text = receipts.read_text()
    except FileNotFoundError:
        return done
    for line in text.splitlines():
        if line.strip():
            try:
                rec = ApplyReceipt.model_validate_json(line)
            except ValueError:
                continue  # a torn last line from a crash; the path is re-checked anyway
            done[rec.path] = rec
    return done


class _ReceiptLog:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def add(
        self, path: str, action: Literal["written", "deleted", "already"], f: EntryState
    ) -> None:
        line = ApplyReceipt(path=path, action=action, f=f, at=time.time()).model_dump_json()
        os.write(self.fd, (line + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class _Raced(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _fsync_dir(fd: int) -> None:
    os.fsync(fd)


def _recheck(dir_fd: int, name: str, path: str, expected: EntryState) -> None:
    if _state_in(dir_fd, name) != expected:
        raise _Raced(path)


def _make_parents(live: Path, f: Path, parts: list[str]) -> None:
    """Create missing live parent directories with F's modes (never through symlinks)."""
    for i in range(1, len(parts)):
        sub = parts[:i]
        with _Dir.parent_of(live, sub) as fd:
            if fd is None:
                continue
            try:
                os.mkdir(sub[-1], 0o700, dir_fd=fd)
            except FileExistsError:
                continue
            fstate = entry_state(f, "/".join(sub))
            os.chmod(sub[-1], fstate.mode if fstate.kind == "dir" else 0o755, dir_fd=fd)
            _fsync_dir(fd)


def _remove_live(live: Path, p: PathPlan) -> None:
    parts = p.path.split("/")
    with _Dir.parent_of(live, parts) as fd:
        if fd is None:
            raise _Raced(p.path)
        _recheck(fd, parts[-1], p.path, p.q)
        if p.q.kind == "dir":
            try:
                os.rmdir(parts[-1], dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise _Raced(p.path) from exc
                raise
        else:
            os.unlink(parts[-1], dir_fd=fd)
        _fsync_dir(fd)


def _place_live(f: Path, live: Path, p: PathPlan, before: EntryState) -> None:
    parts = p.path.split("/")
    _make_parents(live, f, parts)
    name = parts[-1]
    with _Dir.parent_of(live, parts) as fd:
        if fd is None:
            raise _Raced(p.path)
        if p.f.kind == "dir":
            _recheck(fd, name, p.path, before)
            if before.kind == "absent":
                os.mkdir(name, 0o700, dir_fd=fd)
            os.chmod(name, p.f.mode, dir_fd=fd)
            _fsync_dir(fd)
            return
        tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
        if p.f.kind == "symlink":
            os.symlink(p.f.target, tmp, dir_fd=fd)
        else:
            _write_temp_from_f(f, parts, fd, tmp, p.f)
        try:
            _recheck(fd, name, p.path, before)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except FileNotFoundError:
                pass
            raise
        _fsync_dir(fd)


def _write_temp_from_f(
    f: Path, parts: list[str], live_fd: int, tmp: str, expected: EntryState
) -> None:
    with _Dir.parent_of(f, parts) as ffd:
        if ffd is None:
            raise StorageError(f"{'/'.join(parts)} vanished from the final snapshot")
        sfd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ffd)
    try:
        dfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=live_fd
        )
        try:
            copy_file_data(sfd, dfd)
            os.fchmod(dfd, expected.mode)
            os.fsync(dfd)
            os.lseek(dfd, 0, os.SEEK_SET)
        finally:
            os.close(dfd)
        check = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=live_fd)
        try:
            if _hash_fd(check) != expected.sha256:
                raise StorageError(f"copy of {'/'.join(parts)} does not match the final snapshot")
        finally:
            os.close(check)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=live_fd)
        except FileNotFoundError:
            pass
        raise
    finally:
        os.close(sfd)


def _remove_stale_temps(live: Path, paths: list[str]) -> None:
    """Remove temp files an interrupted apply left next to the paths it was writing
    (only names with this module's prefix; never through a symlink)."""
    for folder in sorted({parent(p) for p in paths}):
        parts = [*folder.split("/"), "."] if folder else ["."]
        try:
            with _Dir.parent_of(live, parts) as fd:
                if fd is None:
                    continue
                for name in os.listdir(fd):
                    if name.startswith(TMP_PREFIX):
                        os.unlink(name, dir_fd=fd)
                        log.info("removed leftover %s/%s", folder or ".", name)
        except _Blocked:
            continue


def apply(
    q: Path,
    f: Path,
    live: Path,
    paths: list[str],
    receipts: Path,
    progress: Callable[[int, int], None] | None = None,
) -> ApplyResult:
    """Settle F into ``live`` for ``paths`` with the three-way check (see module doc).

    Every path is checked before any is written; with a conflict nothing is written.
    Each settled path appends an fsync'd receipt line, so a crashed apply can run again:
    paths already written then compare equal to F and are skipped. ``progress(done,
    total)`` is called after each written or deleted path (the caller throttles).
    """
    for path in paths:
        check_relative(path)
    _remove_stale_temps(live, paths)
    done = _read_receipts(receipts)
    plan = plan_apply(q, f, live, paths)
    changed = [p for p in plan.paths if p.action != "unchanged"]
    already = [p.path for p in plan.paths if p.action == "already"]
    if plan.conflicts:
        log.warning("apply into %s: %d conflicts, nothing written", live, len(plan.conflicts))
        return ApplyResult(status="conflict", already_applied=already, conflicts=plan.conflicts)
    if not changed:
        return ApplyResult(status="noop")

    applied: list[str] = []
    log_ = _ReceiptLog(receipts)
    try:
        for p in plan.paths:
            if p.action == "already" and p.path not in done:
                log_.add(p.path, "already", p.f)
        writes = plan.writes
        removals = sorted(
            (p for p in writes if _needs_removal(p)), key=lambda p: (-depth(p.path), p.path)
        )
        placements = sorted(
            (p for p in writes if p.f.kind != "absent"), key=lambda p: (depth(p.path), p.path)
        )
        try:
            for p in removals:
                _remove_live(live, p)
                if p.f.kind == "absent":
                    log_.add(p.path, "deleted", p.f)
                    applied.append(p.path)
                    if progress is not None:
                        progress(len(applied), len(writes))
            for p in placements:
                before = EntryState(kind="absent") if _needs_removal(p) else p.q
                _place_live(f, live, p, before)
                log_.add(p.path, "written", p.f)
                applied.append(p.path)
                if progress is not None:
                    progress(len(applied), len(writes))
                failpoint("mid-apply", receipts.parent)
        except _Raced as raced:
            log.warning("apply into %s: %s changed during the apply; stopped", live, raced.path)
            return ApplyResult(
                status="conflict",
                applied=sorted(applied),
                already_applied=already,
                conflicts=[
                    ApplyConflict(
                        path=raced.path, reason="changed in the live project during the apply"
                    )
                ],
            )
    finally:
        log_.close()
    log.info("applied %d paths into %s (%d already there)", len(applied), live, len(already))
    return ApplyResult(status="applied", applied=sorted(applied), already_applied=already)


def check_applied(q: Path, f: Path, live: Path, paths: list[str], receipts: Path) -> AppliedCheck:
    """What ``live`` holds at every path of ``paths`` and of the apply's ``receipts`` file
    (``cairn doctor``): F's state, Q's (reverted) or neither (changed since); and every
    receipt whose recorded F state is not what F holds. Reads only; never follows a
    link in ``live``."""
    done = _read_receipts(receipts)
    found: dict[str, list[str]] = {"as_applied": [], "reverted": [], "changed": []}
    differs: list[str] = []
    for path in sorted(set(paths) | set(done)):
        check_relative(path)
        fs, qs, ls = entry_state(f, path), entry_state(q, path), entry_state(live, path)
        fs, qs = (_ABSENT if s.kind == "blocked" else s for s in (fs, qs))
        ls = _ABSENT if ls.kind == "blocked" and fs.kind == "absent" else ls
        if path in done and done[path].f != fs:
            differs.append(path)
        if ls == fs:
            found["as_applied"].append(path)
        elif ls == qs:
            found["reverted"].append(path)
        else:
            found["changed"].append(path)
    return AppliedCheck(
        as_applied=found["as_applied"],
        reverted=found["reverted"],
        changed=found["changed"],
        receipt_differs=differs,
    )
