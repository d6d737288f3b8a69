"""The three-way live apply (ARCHITECTURE §9), in batches with group durability.

Every path is classified before any is written: live == Q → write F; live == F → already
applied; otherwise a conflict, and then nothing is written at all. The writes go in
batches of :data:`BATCH` paths. For each: every temporary written next to its target
(a directory, or an empty file where live holds nothing, is made in place instead);
one ``syncfs`` (a single commit, whatever the number of files and directories), which
also makes the previous batch's renames durable, whose receipt lines then follow in one
write and one fsync; then each target re-checked right before its temporary is renamed
over it. A last ``syncfs`` and receipt write close the apply. A receipt therefore proves
its path durably holds F; a crash loses at most the receipts of the batches not yet
synced, and the re-run finds those paths already equal to F. Every directory is reached
component by component without following a symlink (and opened once per walk, not once
per path), so a symlink planted in the live tree never redirects a write.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from cairn.errors import StorageError
from cairn.failpoints import failpoint
from cairn.fsutil import copy_file_data, syncfs
from cairn.pathrules import TMP_PREFIX, ancestors, check_relative, depth, parent

log = logging.getLogger(__name__)

BATCH = 1024  # paths per syncfs and receipt write: what a crash can leave without a receipt
_CHUNK = 1 << 20
_OPEN_DIRS = 128  # directory fds one walk keeps open (well below the default 1,024)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# Dataclasses, not pydantic, whose import was most of the apply unit's start; root checks
# what the unit writes (/usr/share/doc/cairn/docs/decisions/helpers-without-pydantic.md).

EntryKind = Literal["absent", "file", "dir", "symlink", "other", "blocked"]
ReceiptAction = Literal["written", "deleted", "already"]


@dataclass(frozen=True, slots=True)
class EntryState:
    """What apply compares: type, permission bits, content hash, symlink target.
    ``blocked`` means a parent directory is missing as a directory (e.g. a symlink)."""

    kind: EntryKind
    mode: int = 0
    sha256: str = ""
    target: str = ""


_ABSENT = EntryState(kind="absent")


@dataclass(frozen=True, slots=True)
class PathPlan:
    path: str
    action: Literal["write", "already", "unchanged", "conflict"]
    q: EntryState
    f: EntryState
    live: EntryState


@dataclass(frozen=True, slots=True)
class Conflict:
    """A path the apply may not write (root reads it as an ``ApplyConflict``)."""

    path: str
    reason: str


@dataclass(slots=True)
class ApplyPlan:
    paths: list[PathPlan]

    @property
    def conflicts(self) -> list[Conflict]:
        return [Conflict(p.path, _conflict_reason(p)) for p in self.paths
                if p.action == "conflict"]

    @property
    def writes(self) -> list[PathPlan]:
        return [p for p in self.paths if p.action == "write"]


@dataclass(frozen=True, slots=True)
class ApplyReceipt:
    """One JSONL line in the receipts file; a batch's lines are written and fsync'd
    together, after the batch's paths are durably in place."""

    path: str
    action: ReceiptAction
    f: EntryState
    at: float

    def line(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ApplyReceipt:
        """The receipt a line holds; ``ValueError`` for one that holds none (a torn
        last line)."""
        try:
            data = json.loads(line)
            f = EntryState(**data["f"])
            receipt = cls(**{**data, "f": f})
        except (TypeError, KeyError) as exc:  # a key missing or unknown, a list, ...
            raise ValueError("not a receipt") from exc
        if not (isinstance(receipt.path, str) and receipt.action in get_args(ReceiptAction)
                and type(receipt.at) in (int, float) and f.kind in get_args(EntryKind)
                and type(f.mode) is int and isinstance(f.sha256, str)
                and isinstance(f.target, str)):
            raise ValueError("not a receipt")
        return receipt


@dataclass(frozen=True, slots=True)
class Applied:
    """What an apply did; the apply unit writes it as root's ``ApplyResult``."""

    status: Literal["applied", "conflict", "noop"]
    applied: list[str] = field(default_factory=list)
    already_applied: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Checked:
    """What the live project holds at the applied paths (root's ``AppliedCheck``)."""

    as_applied: list[str]
    reverted: list[str]
    changed: list[str]
    receipt_differs: list[str]


class _Blocked(Exception):
    pass


class _Raced(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


# -- walking a tree without following links ---------------------------------------------


class _Tree:
    """The directories of one root, each opened from its parent without following a
    symlink and kept open for the walk (the most recently used :data:`_OPEN_DIRS`).
    ``settled``: the tree does not change during the walk (a read-only snapshot, or the
    live tree while only being classified: every write re-checks its target), so a
    directory found missing is remembered as missing."""

    def __init__(self, root: Path, settled: bool = False) -> None:
        self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.missing: set[str] | None = set() if settled else None

    def __enter__(self) -> _Tree:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        os.close(self.root_fd)

    def dir(self, rel: str) -> int | None:
        """The fd of directory ``rel`` ("" is the root); None when a component is missing;
        raises ``_Blocked`` when a component exists but is not a directory. Valid until
        the next call."""
        if not rel:
            return self.root_fd
        fd = self.fds.get(rel)
        if fd is not None:
            self.fds.move_to_end(rel)
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
                raise _Blocked(rel) from exc
            raise
        self.fds[rel] = fd
        while len(self.fds) > _OPEN_DIRS:
            os.close(self.fds.popitem(last=False)[1])
        return fd

    def parent(self, path: str) -> int | None:
        return self.dir(parent(path))

    def forget(self, rel: str) -> None:
        """Close what is open at or below ``rel`` (a directory just removed)."""
        for key in [k for k in self.fds if k == rel or k.startswith(rel + "/")]:
            os.close(self.fds.pop(key))

    def state(self, path: str) -> EntryState:
        """The state of ``path`` in this tree."""
        try:
            fd = self.parent(path)
        except _Blocked:
            return EntryState(kind="blocked")
        if fd is None:
            return _ABSENT
        return _state_in(fd, path.rpartition("/")[2])


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
        return _ABSENT
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        if st.st_size == 0:  # what an empty file hashes to; it is also empty when read
            return _known("file", mode, EMPTY_SHA256)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            return _known("file", mode, _hash_fd(fd))
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
    with _Tree(root) as tree:
        return tree.state(path)


# -- the plan ---------------------------------------------------------------------------


def _conflict_reason(p: PathPlan) -> str:
    if p.live.kind == "blocked":
        return "a parent directory in the live project is not a real directory"
    if p.q == p.live:
        return "directory holds entries that are not part of the proposal"
    return f"live {p.live.kind} matches neither the run's start nor the proposal"


def plan_apply(q: Path, f: Path, live: Path, paths: list[str]) -> ApplyPlan:
    """Classify every path: Q == F → ``unchanged``; live == F → ``already``; live == Q →
    ``write``; otherwise ``conflict``. Reads only."""
    with _Tree(q, True) as qt, _Tree(f, True) as ft, _Tree(live, True) as lt:
        return _plan(qt, ft, lt, paths)


def _plan(qt: _Tree, ft: _Tree, lt: _Tree, paths: list[str]) -> ApplyPlan:
    planned: list[PathPlan] = []
    by_path: dict[str, PathPlan] = {}
    for path in sorted(set(paths)):  # a directory sorts before what it holds
        qs, fs, ls = qt.state(path), ft.state(path), lt.state(path)
        # Q and F are the run's own snapshots: below a non-directory nothing exists there.
        qs, fs = (_ABSENT if s.kind == "blocked" else s for s in (qs, fs))
        if ls.kind == "blocked" and _unblocked_by_apply(lt, path, by_path):
            ls = _ABSENT
        action: Literal["write", "already", "unchanged", "conflict"]
        if same_state(qs, fs):
            action = "unchanged"  # nothing to settle here, whatever the live state
        elif same_state(ls, fs):
            action = "already"
        elif same_state(ls, qs) and ls.kind != "blocked" and fs.kind != "blocked":
            action = "write"
        else:
            action = "conflict"
        planned.append(PathPlan(path, action, qs, fs, ls))
        by_path[path] = planned[-1]
    removed = {p.path for p in planned if p.action == "write" and _needs_removal(p)}
    for i, p in enumerate(planned):
        if p.action == "write" and p.live.kind == "dir" and p.path in removed:
            if _extra_entries(lt, p.path, removed):
                planned[i] = dataclasses.replace(p, action="conflict")
    return ApplyPlan(paths=planned)


def _unblocked_by_apply(lt: _Tree, path: str, by_path: dict[str, PathPlan]) -> bool:
    """Whether the live non-directory that blocks ``path`` is one this apply replaces
    with a directory (file → directory in the proposal): then ``path`` is absent."""
    for top in reversed(ancestors(path)):
        plan = by_path.get(top)
        state = plan.live if plan is not None else lt.state(top)
        if state.kind == "dir":
            continue
        return plan is not None and plan.action == "write" and plan.f.kind == "dir"
    return False


def _extra_entries(lt: _Tree, path: str, removed: set[str]) -> bool:
    try:
        fd = lt.dir(path)
    except _Blocked:
        return True
    if fd is None:
        return False
    return any(f"{path}/{n}" not in removed for n in os.listdir(fd))


def _needs_removal(p: PathPlan) -> bool:
    if p.q.kind == "absent":
        return False
    return p.f.kind == "absent" or (p.q.kind == "dir") != (p.f.kind == "dir")


# -- receipts ---------------------------------------------------------------------------


def read_receipts(receipts: Path) -> dict[str, ApplyReceipt]:
    """The receipts an apply wrote so far, by path (a torn last line is left out)."""
    done: dict[str, ApplyReceipt] = {}
    try:
        text = receipts.read_text()
    except FileNotFoundError:
        return done
    for line in text.splitlines():
        if line.strip():
            try:
                rec = ApplyReceipt.from_line(line)
            except ValueError:
                continue  # a torn last line from a crash; the path is re-checked anyway
            done[rec.path] = rec
    return done


_Entry = tuple[str, Literal["written", "deleted", "already"], EntryState]  # a receipt to be


class _ReceiptLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def add(self, entries: Iterable[_Entry]) -> None:
        """Append one line per entry in a single write, then one fsync."""
        now = time.time()
        lines = [ApplyReceipt(p, a, f, now).line() for p, a, f in entries]
        if lines:
            os.write(self.fd, "".join(lines).encode())
            os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


# -- writing a batch --------------------------------------------------------------------


class _Batch:
    """One batch's live directory walk and the receipts of what it changed."""

    def __init__(self, live: Path) -> None:
        self.tree = _Tree(live)
        self.done: list[_Entry] = []

    def parent_fd(self, path: str) -> int:
        try:
            fd = self.tree.parent(path)
        except _Blocked as exc:
            raise _Raced(path) from exc
        if fd is None:
            raise _Raced(path)
        return fd

    def close(self) -> None:
        self.tree.close()


def _recheck(dir_fd: int, name: str, path: str, expected: EntryState) -> None:
    if not same_state(_state_in(dir_fd, name), expected):
        raise _Raced(path)


def _remove(batch: _Batch, p: PathPlan) -> None:
    fd = batch.parent_fd(p.path)
    name = p.path.rpartition("/")[2]
    _recheck(fd, name, p.path, p.q)
    if p.q.kind == "dir":
        batch.tree.forget(p.path)
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise _Raced(p.path) from exc
            raise
    else:
        os.unlink(name, dir_fd=fd)


def _make_parents(batch: _Batch, ft: _Tree, path: str) -> None:
    """Create missing live parent directories with F's modes (never through symlinks)."""
    try:
        if batch.tree.dir(parent(path)) is not None:
            return  # the common case: the parent is there
    except _Blocked as exc:
        raise _Raced(path) from exc
    for sub in reversed(ancestors(path)):
        fd = batch.parent_fd(sub)
        name = sub.rpartition("/")[2]
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            continue
        fstate = ft.state(sub)
        os.chmod(name, fstate.mode if fstate.kind == "dir" else 0o755, dir_fd=fd)


def _before(p: PathPlan) -> EntryState:
    return _ABSENT if _needs_removal(p) else p.q


def _prepare(batch: _Batch, ft: _Tree, p: PathPlan) -> str | None:
    """Directories are made (or re-moded) at once; anything else gets a temporary next
    to its target, whose name is returned."""
    _make_parents(batch, ft, p.path)
    fd = batch.parent_fd(p.path)
    name = p.path.rpartition("/")[2]
    if p.f.kind == "dir":
        before = _before(p)
        _recheck(fd, name, p.path, before)
        if before.kind == "absent":
            os.mkdir(name, 0o700, dir_fd=fd)
        os.chmod(name, p.f.mode, dir_fd=fd)
        return None
    if p.f.sha256 == EMPTY_SHA256 and _before(p).kind == "absent" and p.f.mode & ~0o777 == 0:
        _create_empty(fd, name, p)
        return None
    tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    if p.f.kind == "symlink":
        os.symlink(p.f.target, tmp, dir_fd=fd)
    else:
        _write_temp_from_f(ft, p.path, fd, tmp, p.f)
    return tmp


def _write_temp_from_f(ft: _Tree, path: str, live_fd: int, tmp: str, expected: EntryState) -> None:
    if expected.sha256 == EMPTY_SHA256:
        _write_empty_temp(path, live_fd, tmp, expected)
        return
    ffd = ft.parent(path)
    if ffd is None:
        raise StorageError(f"{path} vanished from the final snapshot")
    sfd = os.open(path.rpartition("/")[2], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                  dir_fd=ffd)
    try:
        dfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=live_fd
        )
        try:
            copy_file_data(sfd, dfd)
            os.fchmod(dfd, expected.mode)
        finally:
            os.close(dfd)
        check = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=live_fd)
        try:
            if _hash_fd(check) != expected.sha256:
                raise StorageError(f"copy of {path} does not match the final snapshot")
        finally:
            os.close(check)
    except BaseException:
        _unlink_quietly(live_fd, tmp)
        raise
    finally:
        os.close(sfd)


def _create_empty(dir_fd: int, name: str, p: PathPlan) -> None:
    """An empty file F holds where the live project holds nothing, made in place: there
    are no bytes to be half-written, ``O_EXCL`` is the re-check (whatever appeared there
    since the plan stops the batch) and, where the umask allows, it is born with F's
    mode, so even a crash right after leaves exactly F's state."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     p.f.mode, dir_fd=dir_fd)
    except FileExistsError as exc:
        raise _Raced(p.path) from exc
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != p.f.mode:  # a umask or default ACL
            os.fchmod(fd, p.f.mode)
    finally:
        os.close(fd)


def _write_empty_temp(path: str, live_fd: int, tmp: str, expected: EntryState) -> None:
    """The temporary of a file F holds empty: nothing of F to read, and the check that it
    holds F's bytes is that it holds none."""
    try:
        dfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=live_fd
        )
        try:
            os.fchmod(dfd, expected.mode)
            if os.fstat(dfd).st_size != 0:
                raise StorageError(f"copy of {path} does not match the final snapshot")
        finally:
            os.close(dfd)
    except BaseException:
        _unlink_quietly(live_fd, tmp)
        raise


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _place(batch: _Batch, ft: _Tree, plans: list[PathPlan], synced: Callable[[bool], None],
           marker: Path) -> None:
    """Temporaries for every path of the batch, ``synced(any_temps)``, then each
    target re-checked and its temporary renamed over it; a path that changed meanwhile
    stops the batch (``_Raced``) with every temporary removed and what was renamed
    recorded in ``batch.done``."""
    temps: list[tuple[PathPlan, str]] = []
    try:
        for p in plans:
            tmp = _prepare(batch, ft, p)
            if tmp is None:
                batch.done.append((p.path, "written", p.f))
            else:
                temps.append((p, tmp))
        synced(bool(temps))
        failpoint("apply-after-temps", marker)
        while temps:
            p, tmp = temps[0]
            fd = batch.parent_fd(p.path)
            _recheck(fd, p.path.rpartition("/")[2], p.path, _before(p))
            os.rename(tmp, p.path.rpartition("/")[2], src_dir_fd=fd, dst_dir_fd=fd)
            temps.pop(0)
            batch.done.append((p.path, "written", p.f))
            failpoint("mid-apply", marker)
    finally:
        for p, tmp in temps:
            try:
                left_in = batch.tree.parent(p.path)
            except _Blocked:
                continue
            if left_in is not None:
                _unlink_quietly(left_in, tmp)


def remove_stale_temps(live: Path, paths: list[str]) -> None:
    """Remove temp files an interrupted apply left next to the paths it was writing
    (only names with this module's prefix; never through a symlink)."""
    with _Tree(live) as tree:
        for folder in sorted({parent(p) for p in paths}):
            try:
                fd = tree.dir(folder)
            except _Blocked:
                continue
            if fd is None:
                continue
            for name in os.listdir(fd):
                if name.startswith(TMP_PREFIX):
                    os.unlink(name, dir_fd=fd)
                    log.info("removed leftover %s/%s", folder or ".", name)


def _batches(plans: list[PathPlan]) -> list[list[PathPlan]]:
    return [plans[i : i + BATCH] for i in range(0, len(plans), BATCH)]


def apply(
    q: Path,
    f: Path,
    live: Path,
    paths: list[str],
    receipts: Path,
    progress: Callable[[int, int], None] | None = None,
) -> Applied:
    """Settle F into ``live`` for ``paths`` with the three-way check (see module doc).

    Every path is checked before any is written; with a conflict nothing is written.
    Each batch appends its receipt lines once its paths are durable, so a crashed apply
    can run again: paths already written then compare equal to F and are skipped.
    ``progress(done, total)`` is called after each batch.
    """
    for path in paths:
        check_relative(path)
    remove_stale_temps(live, paths)
    done = read_receipts(receipts)
    started = time.monotonic()
    with _Tree(q, True) as qt, _Tree(f, True) as ft:
        with _Tree(live, True) as lt:  # only classified: every write re-checks its target
            plan = _plan(qt, ft, lt, paths)
        log.info("apply: %d paths classified in %.1f s", len(plan.paths),
                 time.monotonic() - started)
        already = [p.path for p in plan.paths if p.action == "already"]
        if plan.conflicts:
            log.warning("apply into %s: %d conflicts, nothing written", live, len(plan.conflicts))
            return Applied(status="conflict", already_applied=already,
                           conflicts=plan.conflicts)
        if not any(p.action != "unchanged" for p in plan.paths):
            return Applied(status="noop")
        log_ = _ReceiptLog(receipts)
        try:
            found: list[_Entry] = [(p.path, "already", p.f) for p in plan.paths
                                   if p.action == "already" and p.path not in done]
            if found:  # a crashed run's renames may not be durable yet: first make them so
                with _Tree(live) as lt:
                    syncfs(lt.root_fd)
                log_.add(found)
            applied = _write(plan, ft, live, log_, progress)
        finally:
            log_.close()
    if isinstance(applied, _Stopped):
        log.warning("apply into %s: %s changed during the apply; stopped", live, applied.path)
        return Applied(
            status="conflict",
            applied=sorted(applied.applied),
            already_applied=already,
            conflicts=[Conflict(applied.path, "changed in the live project during the apply")],
        )
    log.info("applied %d paths into %s (%d already there)", len(applied), live, len(already))
    return Applied(status="applied", applied=sorted(applied), already_applied=already)


class _Stopped(_Raced):
    def __init__(self, path: str, applied: list[str]) -> None:
        super().__init__(path)
        self.applied = applied


class _Writer:
    """Batches in order, pipelined: one ``syncfs`` makes a batch's temporaries durable
    and with them what the batches before it renamed or removed, whose receipts then
    follow (so a receipt is never written before its path is durably F)."""

    def __init__(self, live: Path, log_: _ReceiptLog, total: int,
                 progress: Callable[[int, int], None] | None) -> None:
        self.live, self.log, self.total, self.progress = live, log_, total, progress
        self.unsettled: list[_Batch] = []
        self.applied: list[str] = []
        self.syncs, self.synced_for = 0, 0.0

    def sync(self, fd: int, force: bool = False) -> None:
        """One syncfs of the live filesystem (when ``force`` or a batch awaits it), then
        the receipts of every batch whose changes it made durable."""
        if not (force or self.unsettled):
            return
        started = time.monotonic()
        syncfs(fd)
        self.syncs += 1
        self.synced_for += time.monotonic() - started
        if not self.unsettled:
            return
        self.log.add(entry for batch in self.unsettled for entry in batch.done)
        failpoint("apply-after-receipts", self.log.path.parent)
        while self.unsettled:
            batch = self.unsettled.pop(0)
            self.applied += [path for path, _, _ in batch.done]
            batch.close()
        if self.progress is not None:
            self.progress(len(self.applied), self.total)

    def batch(self, plans: list[PathPlan], ft: _Tree, removing: bool) -> None:
        batch = _Batch(self.live)
        try:
            if removing:
                self.sync(batch.tree.root_fd)
                for p in plans:
                    _remove(batch, p)
                    if p.f.kind == "absent":
                        batch.done.append((p.path, "deleted", p.f))
            else:
                _place(batch, ft, plans, lambda force: self.sync(batch.tree.root_fd, force),
                       self.log.path.parent)
            failpoint("apply-after-renames", self.log.path.parent)
        finally:
            self.unsettled.append(batch)  # after a race too: what it did is kept

    def finish(self) -> None:
        with _Tree(self.live) as tree:
            self.sync(tree.root_fd)


def _write(
    plan: ApplyPlan, ft: _Tree, live: Path, log_: _ReceiptLog,
    progress: Callable[[int, int], None] | None,
) -> list[str] | _Stopped:
    """Removals (deepest first), then placements (shallowest first), batch by batch;
    the paths applied, or where a person's change stopped it (what was changed before
    that is kept, durable and with receipts)."""
    writes = plan.writes
    removals = sorted((p for p in writes if _needs_removal(p)),
                      key=lambda p: (-depth(p.path), p.path))
    placements = sorted((p for p in writes if p.f.kind != "absent"),
                        key=lambda p: (depth(p.path), p.path))
    started = time.monotonic()
    writer = _Writer(live, log_, len(writes), progress)
    try:
        for plans in _batches(removals):
            writer.batch(plans, ft, removing=True)
        for plans in _batches(placements):
            writer.batch(plans, ft, removing=False)
        writer.finish()
        log.info("apply: %d paths written in %.1f s, %d syncs of the live filesystem in %.1f s",
                 len(writes), time.monotonic() - started, writer.syncs, writer.synced_for)
    except _Raced as raced:
        writer.finish()
        return _Stopped(raced.path, writer.applied)
    finally:
        for batch in writer.unsettled:
            batch.close()
    return writer.applied


def check_applied(q: Path, f: Path, live: Path, paths: list[str], receipts: Path) -> Checked:
    """What ``live`` holds at every path of ``paths`` and of the apply's ``receipts`` file
    (``cairn doctor``): F's state, Q's (reverted) or neither (changed since); and every
    receipt whose recorded F state is not what F holds. Reads only; never follows a
    link in ``live``."""
    done = read_receipts(receipts)
    found: dict[str, list[str]] = {"as_applied": [], "reverted": [], "changed": []}
    differs: list[str] = []
    with _Tree(q) as qt, _Tree(f) as ft, _Tree(live) as lt:
        for path in sorted(set(paths) | set(done)):
            check_relative(path)
            fs, qs, ls = ft.state(path), qt.state(path), lt.state(path)
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
    return Checked(
        as_applied=found["as_applied"],
        reverted=found["reverted"],
        changed=found["changed"],
        receipt_differs=differs,
    )
