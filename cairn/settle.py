"""Proposal settlement (ARCHITECTURE §9): the candidate C and the three-way live apply.

``build_candidate`` copies into C (a writable snapshot of Q) only the changes of P that
host policy allows. ``apply`` writes F into the live project path by path: live == Q →
write F; live == F → already applied; anything else → conflict, and then nothing is
written at all. Every path is walked component by component without following symlinks,
so a symlink planted in the live tree can never redirect a write.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import posixpath
import re
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cairn.errors import StorageError, UsageError
from cairn.failpoints import failpoint
from cairn.sendstream import ChangeSet

log = logging.getLogger(__name__)

_FICLONE = 0x40049409
_CHUNK = 1 << 20
_TMP_PREFIX = ".cairn-apply."


class SettlementPolicy(BaseModel):
    """Host policy for what of a proposal may reach the candidate."""

    model_config = ConfigDict(extra="forbid")

    write_paths: list[str] = Field(default_factory=lambda: ["**"])
    allow_git_internals: bool = False
    max_file_bytes: int = Field(default=64 << 20, ge=0)
    max_total_bytes: int = Field(default=1 << 30, ge=0)


class RefusedPath(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    reason: str


class CandidateReport(BaseModel):
    """What went into C (``accepted``, the paths to apply) and what did not, and why."""

    model_config = ConfigDict(extra="forbid")

    accepted: list[str]
    refused: list[RefusedPath]
    bytes_accepted: int


class EntryState(BaseModel):
    """What apply compares: type, permission bits, content hash, symlink target.
    ``blocked`` means a parent directory is missing as a directory (e.g. a symlink)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["absent", "file", "dir", "symlink", "other", "blocked"]
    mode: int = 0
    sha256: str = ""
    target: str = ""


class ApplyConflict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    reason: str


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


class ApplyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["applied", "conflict", "noop"]
    applied: list[str] = []
    already_applied: list[str] = []
    conflicts: list[ApplyConflict] = []


# -- paths and policy -------------------------------------------------------------------


def check_relative(path: str) -> list[str]:
    """The components of a normalized project-relative path; ``UsageError`` otherwise."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"path {path!r} is not a normalized path inside the project")
    if "\0" in path:
        raise UsageError("path contains a NUL byte")
    return parts


def _segment_regex(segment: str) -> str:
    out = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a write-path glob: ``*`` and ``?`` stay inside one component, ``**`` spans
    any number of components (``src/**`` matches ``src`` and everything below it)."""
    parts: list[str] = []
    for part in pattern.strip("/").split("/"):
        if part == "**" and parts and parts[-1] == "**":
            continue
        if part:
            parts.append(part)
    rx = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            if not last:
                rx += "(?:[^/]+/)*"
            elif rx.endswith("/"):
                rx = rx[:-1] + "(?:/.*)?"
            else:
                rx += ".*"
        else:
            rx += _segment_regex(part) + ("" if last else "/")
    return re.compile(rf"\A{rx}\Z", re.DOTALL)


def _policy_reason(path: str, policy: SettlementPolicy, patterns: list[re.Pattern[str]]) -> str:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8"
    if not policy.allow_git_internals and ".git" in path.split("/"):
        return ".git internals are excluded"
    if not any(p.match(path) for p in patterns):
        return "outside the write paths"
    return ""


def _entry_reason(path: str, st: os.stat_result, target: str, policy: SettlementPolicy) -> str:
    mode = st.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        return "unsupported file type"
    if mode & (stat.S_ISUID | stat.S_ISGID):
        return "setuid/setgid bit"
    if stat.S_ISLNK(mode):
        if target.startswith("/"):
            return "symlink with an absolute target leaves the project"
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if resolved == ".." or resolved.startswith("../"):
            return "symlink target leaves the project"
    if stat.S_ISREG(mode) and st.st_size > policy.max_file_bytes:
        return f"file is larger than {policy.max_file_bytes} bytes"
    return ""


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _depth(path: str) -> int:
    return path.count("/")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


# -- candidate --------------------------------------------------------------------------


def build_candidate(
    q: Path, p: Path, c: Path, changes: ChangeSet, policy: SettlementPolicy
) -> CandidateReport:
    """Bring C (a fresh writable snapshot of Q) to Q plus the allowed changes of P.

    Paths are relative to the project root inside each of ``q``, ``p`` and ``c``.
    """
    patterns = [glob_regex(g) for g in policy.write_paths]
    refused: dict[str, str] = {}
    accepted: list[str] = []
    total = 0

    present = sorted(
        {*changes.created, *changes.modified, *changes.metadata}, key=lambda s: (_depth(s), s)
    )
    entries: dict[str, tuple[os.stat_result, str]] = {}
    for path in present:
        check_relative(path)
        reason = _policy_reason(path, policy, patterns)
        if not reason and _parent(path) in refused:
            reason = "parent directory was refused"
        if not reason:
            try:
                st = os.lstat(p / path)
            except FileNotFoundError:
                reason = "missing from the proposal snapshot"
            else:
                target = os.readlink(p / path) if stat.S_ISLNK(st.st_mode) else ""
                reason = _entry_reason(path, st, target, policy)
                if not reason and stat.S_ISREG(st.st_mode):
                    if total + st.st_size > policy.max_total_bytes:
                        reason = (
                            f"total size of the proposal exceeds {policy.max_total_bytes} bytes"
                        )
                    else:
                        total += st.st_size
                if not reason:
                    entries[path] = (st, target)
        if reason:
            refused[path] = reason

    replaced = {*changes.created, *changes.modified}
    refused_created = [r for r in refused if r in replaced]
    blocked_sources = [
        rn.old for rn in changes.renamed if any(_under(r, rn.new) for r in refused_created)
    ]
    deletions = sorted(changes.deleted, key=lambda s: (-_depth(s), s))
    delete_ok: list[str] = []
    for path in deletions:
        check_relative(path)
        reason = _policy_reason(path, policy, patterns)
        if not reason and any(_under(path, src) for src in blocked_sources):
            reason = "its rename destination was refused"
        if not reason and any(_under(r, path) and r != path for r in refused):
            reason = "directory still holds refused paths"
        if reason:
            refused[path] = reason
        else:
            delete_ok.append(path)

    for path in delete_ok:
        try:
            _remove_in(c, path)
        except OSError as exc:
            refused[path] = f"cannot delete in the candidate: {exc.strerror}"
            continue
        accepted.append(path)

    for path, (st, target) in entries.items():
        try:
            _install(p, c, path, st, target)
        except (OSError, StorageError) as exc:
            msg = exc.strerror if isinstance(exc, OSError) else exc.message
            refused[path] = f"cannot write in the candidate: {msg}"
            continue
        accepted.append(path)

    report = CandidateReport(
        accepted=sorted(accepted),
        refused=[RefusedPath(path=k, reason=v) for k, v in sorted(refused.items())],
        bytes_accepted=sum(
            entries[a][0].st_size
            for a in accepted
            if a in entries and stat.S_ISREG(entries[a][0].st_mode)
        ),
    )
    log.info("candidate %s: %d accepted, %d refused", c, len(report.accepted), len(report.refused))
    return report


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
    cur_src, cur_dst = src_root, dst_root
    for part in check_relative(path)[:-1]:
        cur_src, cur_dst = cur_src / part, cur_dst / part
        try:
            st = os.lstat(cur_dst)
        except FileNotFoundError:
            mode = stat.S_IMODE(os.lstat(cur_src).st_mode) & 0o1777
            os.mkdir(cur_dst, 0o700)
            os.chmod(cur_dst, mode)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{cur_dst} is not a directory")


def _copy_user_xattrs(src: Path, dst: Path) -> None:
    if dst.is_symlink():
        return  # user.* xattrs are not allowed on symlinks
    try:
        wanted = {n for n in os.listxattr(src, follow_symlinks=False) if n.startswith("user.")}
        have = {n for n in os.listxattr(dst, follow_symlinks=False) if n.startswith("user.")}
    except OSError as exc:
        if exc.errno == errno.ENOTSUP:
            return
        raise
    for name in have - wanted:
        os.removexattr(dst, name, follow_symlinks=False)
    for name in wanted:
        os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)


def _copy_file_data(src_fd: int, dst_fd: int) -> None:
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
        return
    except OSError:
        pass  # not the same filesystem, or no reflink support: copy the bytes
    while True:
        chunk = os.read(src_fd, _CHUNK)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view) :]


def _install(p: Path, c: Path, path: str, st: os.stat_result, target: str) -> None:
    """Make ``c/path`` the same entry as ``p/path`` (content, mode, user xattrs, and the
    owner when running as root)."""
    _ensure_parents(p, c, path)
    dst = _real_parent(c, path) / path.rsplit("/", 1)[-1]
    src = p / path
    mode = stat.S_IMODE(st.st_mode)
    try:
        existing: os.stat_result | None = os.lstat(dst)
    except FileNotFoundError:
        existing = None
    if stat.S_ISDIR(st.st_mode):
        if existing is not None and not stat.S_ISDIR(existing.st_mode):
            os.unlink(dst)
            existing = None
        if existing is None:
            os.mkdir(dst, 0o700)
        os.chmod(dst, mode)
    else:
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            os.rmdir(dst)
        tmp = dst.with_name(f"{_TMP_PREFIX}{secrets.token_hex(6)}")
        if stat.S_ISLNK(st.st_mode):
            os.symlink(target, tmp)
        else:
            sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    _copy_file_data(sfd, dfd)
                    os.fchmod(dfd, mode)
                finally:
                    os.close(dfd)
            finally:
                os.close(sfd)
        os.rename(tmp, dst)
    _copy_user_xattrs(src, dst)
    if os.geteuid() == 0:
        os.lchown(dst, st.st_uid, st.st_gid)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(dst, mode)  # chown clears setuid-like bits; restore the exact mode


# -- inventories ------------------------------------------------------------------------


def _entries(root: Path) -> Iterator[tuple[str, os.DirEntry[str]]]:
    stack = [""]
    while stack:
        sub = stack.pop()
        with os.scandir(root / sub if sub else root) as it:
            for entry in sorted(it, key=lambda e: e.name):
                rel = f"{sub}/{entry.name}" if sub else entry.name
                yield rel, entry
                if entry.is_dir(follow_symlinks=False):
                    stack.append(rel)


def _same_bytes(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(_CHUNK), fb.read(_CHUNK)
            if ca != cb:
                return False
            if not ca:
                return True


def inventories_equal(q: Path, p: Path, subpath: str = "") -> bool:
    """Whether the trees under ``subpath`` of Q and P are identical: names, types, modes,
    owners, symlink targets, file bytes and xattrs. Cost grows with the tree; use it only
    to confirm that an empty change set really is empty."""
    qr, pr = (q / subpath, p / subpath) if subpath else (q, p)
    q_list = list(_entries(qr))
    p_names = {rel for rel, _ in _entries(pr)}
    if {rel for rel, _ in q_list} != p_names:
        return False
    for rel, qe in q_list:
        qs, ps = qe.stat(follow_symlinks=False), os.lstat(pr / rel)
        if (qs.st_mode, qs.st_uid, qs.st_gid) != (ps.st_mode, ps.st_uid, ps.st_gid):
            return False
        if stat.S_ISLNK(qs.st_mode):
            if os.readlink(qr / rel) != os.readlink(pr / rel):
                return False
        elif stat.S_ISREG(qs.st_mode):
            if qs.st_size != ps.st_size or not _same_bytes(qr / rel, pr / rel):
                return False
        if not stat.S_ISLNK(qs.st_mode):
            qx = {n: os.getxattr(qr / rel, n) for n in os.listxattr(qr / rel)}
            px = {n: os.getxattr(pr / rel, n) for n in os.listxattr(pr / rel)}
            if qx != px:
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
    for path in sorted(set(paths)):
        qs, fs, ls = entry_state(q, path), entry_state(f, path), entry_state(live, path)
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
    removed = {p.path for p in planned if p.action == "write" and _needs_removal(p)}
    for i, p in enumerate(planned):
        if p.action == "write" and p.live.kind == "dir" and p.path in removed:
            if _extra_entries(live, p.path, removed):
                planned[i] = p.model_copy(update={"action": "conflict"})
    return ApplyPlan(paths=planned)


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
        tmp = f"{_TMP_PREFIX}{secrets.token_hex(6)}"
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
            _copy_file_data(sfd, dfd)
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
    for parent in sorted({_parent(p) for p in paths}):
        parts = [*parent.split("/"), "."] if parent else ["."]
        try:
            with _Dir.parent_of(live, parts) as fd:
                if fd is None:
                    continue
                for name in os.listdir(fd):
                    if name.startswith(_TMP_PREFIX):
                        os.unlink(name, dir_fd=fd)
                        log.info("removed leftover %s/%s", parent or ".", name)
        except _Blocked:
            continue


def apply(q: Path, f: Path, live: Path, paths: list[str], receipts: Path) -> ApplyResult:
    """Settle F into ``live`` for ``paths`` with the three-way check (see module doc).

    Every path is checked before any is written; with a conflict nothing is written.
    Each settled path appends an fsync'd receipt line, so a crashed apply can run again:
    paths already written then compare equal to F and are skipped.
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
            (p for p in writes if _needs_removal(p)), key=lambda p: (-_depth(p.path), p.path)
        )
        placements = sorted(
            (p for p in writes if p.f.kind != "absent"), key=lambda p: (_depth(p.path), p.path)
        )
        try:
            for p in removals:
                _remove_live(live, p)
                if p.f.kind == "absent":
                    log_.add(p.path, "deleted", p.f)
                    applied.append(p.path)
            for p in placements:
                before = EntryState(kind="absent") if _needs_removal(p) else p.q
                _place_live(f, live, p, before)
                log_.add(p.path, "written", p.f)
                applied.append(p.path)
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


def write_json_atomic(path: Path, data: object) -> None:
    """Write ``data`` as JSON to ``path`` via a temp file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
