"""The three-way live apply (ARCHITECTURE §9), in batches with group durability.

Every path is classified before any is written: live == Q → write F; live == F → already
applied; otherwise a conflict, and then nothing is written at all. The writes go in
batches of :data:`BATCH` paths. For each: every temporary written next to its target
(a directory, or an empty file where live holds nothing, is made in place instead); a
barrier where the temporaries need one; then each target re-checked right before its
temporary is renamed over it. The barrier is one ``syncfs`` (a single commit, whatever
the number of files and directories), which also makes the earlier batches' renames
durable, whose receipt lines then follow in one write and one fsync. A temporary needs
it unless the live filesystem is Btrfs and the temporary holds no byte written through
the page cache (F's data shared by a reflink, a symlink, no data): Btrfs commits
metadata in whole transactions, in order, so no crash keeps a rename and loses what the
temporary was made of. Without barriers a ``syncfs`` still comes every :data:`UNSETTLED`
batches, and a last one with its receipts closes the apply. A receipt therefore proves
its path durably holds F; a crash loses at most the receipts of the batches not yet
synced, and the re-run finds those paths already equal to F. Every directory is reached
component by component without following a symlink (and opened once per walk, not once
per path), so a symlink planted in the live tree never redirects a write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from cairn.errors import StorageError
from cairn.failpoints import failpoint
from cairn.fsutil import (
    clone_file,
    copy_bytes,
    fsync_dir,
    on_btrfs,
    syncfs,
)
from cairn.pathrules import TMP_PREFIX, ancestors, check_relative, depth, parent
from cairn.settle.batch import (
    Batch,
    Entry,
    Raced,
    dir_xattrs,
    keep_xattrs,
    linked_temp,
)
from cairn.settle.walk import (
    ABSENT,
    EMPTY_SHA256,
    Blocked,
    EntryKind,
    EntryState,
    Tree,
    hash_fd,
    same_state,
    state_in,
)

log = logging.getLogger(__name__)

BATCH = 1024  # paths per batch: temporaries, one barrier when they need it, renames
UNSETTLED = 8  # batches at most between two syncfs: what a crash can leave without receipts


# Dataclasses, not pydantic, whose import was most of the apply unit's start; root checks
# what the unit writes (/usr/share/doc/cairn/docs/decisions/helpers-without-pydantic.md).

ReceiptAction = Literal["written", "deleted", "already"]


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
        f = self.f  # spelled out: dataclasses.asdict deep-copies each field, recursively
        state = {"kind": f.kind, "mode": f.mode, "sha256": f.sha256, "target": f.target}
        return json.dumps({"path": self.path, "action": self.action, "f": state, "at": self.at},
                          separators=(",", ":")) + "\n"

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
    """What an apply did; the apply unit writes it as root's ``ApplyResult``.
    ``xattrs_not_kept``: applied paths whose ``user.*`` xattrs in F the live project's
    filesystem refused; ``links_not_kept``: applied paths that are hard links of another
    applied path in F but were written as copies (their content and mode are F's)."""

    status: Literal["applied", "conflict", "noop"]
    applied: list[str] = field(default_factory=list)
    already_applied: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    xattrs_not_kept: list[str] = field(default_factory=list)
    links_not_kept: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _NotKept:
    """What of F the paths written did not keep: their xattrs, their hard links."""

    xattrs: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def result(self, status: Literal["applied", "conflict"], applied: list[str],
               already: list[str], conflicts: list[Conflict] | None = None) -> Applied:
        """The apply's result, naming what of F only the ``applied`` paths did not keep."""
        done = set(applied)
        return Applied(status=status, applied=sorted(applied), already_applied=already,
                       conflicts=conflicts or [],
                       xattrs_not_kept=sorted(set(self.xattrs) & done),
                       links_not_kept=sorted(set(self.links) & done))


@dataclass(frozen=True, slots=True)
class Checked:
    """What the live project holds at the applied paths (root's ``AppliedCheck``)."""

    as_applied: list[str]
    reverted: list[str]
    changed: list[str]
    receipt_differs: list[str]


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
    with Tree(q, True) as qt, Tree(f, True) as ft, Tree(live, True) as lt:
        return _plan(qt, ft, lt, paths)


def _plan(qt: Tree, ft: Tree, lt: Tree, paths: list[str]) -> ApplyPlan:
    planned: list[PathPlan] = []
    by_path: dict[str, PathPlan] = {}
    for path in sorted(set(paths)):  # a directory sorts before what it holds
        qs, fs, ls = qt.state(path), ft.state(path), lt.state(path)
        # Q and F are the run's own snapshots: below a non-directory nothing exists there.
        qs, fs = (ABSENT if s.kind == "blocked" else s for s in (qs, fs))
        if ls.kind == "blocked" and _unblocked_by_apply(lt, path, by_path):
            ls = ABSENT
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
        if (p.action == "write" and p.live.kind == "dir" and p.path in removed
                and _extra_entries(lt, p.path, removed)):
            planned[i] = dataclasses.replace(p, action="conflict")
    return ApplyPlan(paths=planned)


def _unblocked_by_apply(lt: Tree, path: str, by_path: dict[str, PathPlan]) -> bool:
    """Whether the live non-directory that blocks ``path`` is one this apply replaces
    with a directory (file → directory in the proposal): then ``path`` is absent."""
    for top in reversed(ancestors(path)):
        plan = by_path.get(top)
        state = plan.live if plan is not None else lt.state(top)
        if state.kind == "dir":
            continue
        return plan is not None and plan.action == "write" and plan.f.kind == "dir"
    return False


def _extra_entries(lt: Tree, path: str, removed: set[str]) -> bool:
    try:
        fd = lt.dir(path)
    except Blocked:
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


class _ReceiptLog:
    """The receipts file, opened for appending. A new one is made durable at once: that
    it exists tells a re-run that temporaries may have been left (:func:`apply`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            self.fd = os.open(path, flags | os.O_EXCL, 0o600)
        except FileExistsError:
            self.fd = os.open(path, flags, 0o600)
        else:
            os.fsync(self.fd)
            fsync_dir(path.parent)

    def add(self, entries: Iterable[Entry]) -> None:
        """Append one line per entry in a single write, then one fsync."""
        now = time.time()
        lines = [ApplyReceipt(p, a, f, now).line() for p, a, f in entries]
        if lines:
            os.write(self.fd, "".join(lines).encode())
            os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


# -- writing a batch --------------------------------------------------------------------


def _recheck(dir_fd: int, name: str, path: str, expected: EntryState) -> None:
    if not same_state(state_in(dir_fd, name), expected):
        raise Raced(path)


def _remove(batch: Batch, p: PathPlan) -> None:
    fd = batch.parent_fd(p.path)
    name = p.path.rpartition("/")[2]
    _recheck(fd, name, p.path, p.q)
    if p.q.kind == "dir":
        batch.tree.forget(p.path)
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise Raced(p.path) from exc
            raise
    else:
        os.unlink(name, dir_fd=fd)


def _make_parents(batch: Batch, ft: Tree, path: str) -> None:
    """Create missing live parent directories with F's modes (never through symlinks)."""
    try:
        if batch.tree.dir(parent(path)) is not None:
            return  # the common case: the parent is there
    except Blocked as exc:
        raise Raced(path) from exc
    for sub in reversed(ancestors(path)):
        fd = batch.parent_fd(sub)
        name = sub.rpartition("/")[2]
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            continue
        fstate = ft.state(sub)
        os.chmod(name, fstate.mode if fstate.kind == "dir" else 0o755, dir_fd=fd)
        if fstate.kind == "dir":
            dir_xattrs(batch, ft, sub, fd, name)


def _before(p: PathPlan) -> EntryState:
    return ABSENT if _needs_removal(p) else p.q


def _prepare(batch: Batch, ft: Tree, p: PathPlan) -> str | None:
    """Directories are made (or re-moded) at once; anything else gets a temporary next
    to its target, whose name is returned."""
    _make_parents(batch, ft, p.path)
    if p.f.kind == "file" and batch.linked and (linked := linked_temp(batch, ft, p.path)):
        return linked
    fd = batch.parent_fd(p.path)
    name = p.path.rpartition("/")[2]
    if p.f.kind == "dir":
        before = _before(p)
        _recheck(fd, name, p.path, before)
        if before.kind == "absent":
            os.mkdir(name, 0o700, dir_fd=fd)
            dir_xattrs(batch, ft, p.path, fd, name)
        os.chmod(name, p.f.mode, dir_fd=fd)
        return None
    if p.f.sha256 == EMPTY_SHA256 and _before(p).kind == "absent" and p.f.mode & ~0o777 == 0:
        _create_empty(batch, ft, fd, name, p)
        return None
    tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    if p.f.kind == "symlink":
        os.symlink(p.f.target, tmp, dir_fd=fd)
    elif not _write_temp_from_f(batch, ft, p.path, fd, tmp, p.f):
        batch.bytes_written = True
    return tmp


def _open_in_f(ft: Tree, path: str) -> int:
    ffd = ft.parent(path)
    if ffd is None:
        raise StorageError(f"{path} vanished from the final snapshot")
    return os.open(path.rpartition("/")[2], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=ffd)


def _write_temp_from_f(batch: Batch, ft: Tree, path: str, live_fd: int, tmp: str,
                       expected: EntryState) -> bool:
    """The temporary ``tmp`` holding F's ``path`` and its ``user.*`` xattrs, checked
    against F (its hash, or for a reflink its size); True when it holds no byte written
    through the page cache (F's data shared by a reflink, or none), False when the bytes
    were copied."""
    sfd = _open_in_f(ft, path)
    try:
        if expected.sha256 == EMPTY_SHA256:
            _write_empty_temp(batch, path, sfd, live_fd, tmp, expected)
            return True
        dfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=live_fd
        )
        try:
            st = os.fstat(sfd)
            if st.st_nlink > 1:
                batch.first_name(st.st_ino, path, tmp)
            cloned = clone_file(sfd, dfd)
            if cloned:  # F's own extents: the same bytes as long as it is as long
                same = os.fstat(dfd).st_size == os.fstat(sfd).st_size
            else:
                copy_bytes(sfd, dfd)
            os.fchmod(dfd, expected.mode)
            keep_xattrs(batch, path, sfd, dfd)
        finally:
            os.close(dfd)
        if not cloned:
            check = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=live_fd)
            try:
                same = hash_fd(check) == expected.sha256
            finally:
                os.close(check)
        if not same:
            raise StorageError(f"copy of {path} does not match the final snapshot")
    except BaseException:
        _unlink_quietly(live_fd, tmp)
        raise
    finally:
        os.close(sfd)
    return cloned


def _create_empty(batch: Batch, ft: Tree, dir_fd: int, name: str, p: PathPlan) -> None:
    """An empty file F holds where the live project holds nothing, made in place: there
    are no bytes to be half-written, ``O_EXCL`` is the re-check (whatever appeared there
    since the plan stops the batch) and, where the umask allows, it is born with F's
    mode, so even a crash right after leaves exactly F's state."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     p.f.mode, dir_fd=dir_fd)
    except FileExistsError as exc:
        raise Raced(p.path) from exc
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != p.f.mode:  # a umask or default ACL
            os.fchmod(fd, p.f.mode)
        sfd = _open_in_f(ft, p.path)
        try:
            keep_xattrs(batch, p.path, sfd, fd)
        finally:
            os.close(sfd)
    finally:
        os.close(fd)


def _write_empty_temp(batch: Batch, path: str, sfd: int, live_fd: int, tmp: str,
                      expected: EntryState) -> None:
    """The temporary of a file F holds empty: no byte of F to read (``sfd`` is F's file,
    for its xattrs), and the check that it holds F's bytes is that it holds none."""
    try:
        dfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=live_fd
        )
        try:
            os.fchmod(dfd, expected.mode)
            if os.fstat(dfd).st_size != 0:
                raise StorageError(f"copy of {path} does not match the final snapshot")
            keep_xattrs(batch, path, sfd, dfd)
        finally:
            os.close(dfd)
    except BaseException:
        _unlink_quietly(live_fd, tmp)
        raise


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _place(batch: Batch, ft: Tree, plans: list[PathPlan], synced: Callable[[bool], None],
           marker: Path) -> None:
    """Temporaries for every path of the batch, ``synced(barrier)`` (whether they must be
    durable before their renames: :meth:`Batch.needs_barrier`), then each target
    re-checked and its temporary renamed over it; a path that changed meanwhile
    stops the batch (``Raced``) with every temporary removed and what was renamed
    recorded in ``batch.done``."""
    temps: list[tuple[PathPlan, str]] = []
    try:
        for p in plans:
            tmp = _prepare(batch, ft, p)
            if tmp is None:
                batch.done.append((p.path, "written", p.f))
            else:
                temps.append((p, tmp))
        synced(batch.needs_barrier(len(temps)))
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
            except Blocked:
                continue
            if left_in is not None:
                _unlink_quietly(left_in, tmp)


def remove_stale_temps(live: Path, paths: list[str]) -> None:
    """Remove temp files an interrupted apply left next to the paths it was writing
    (only names with this module's prefix; never through a symlink)."""
    with Tree(live) as tree:
        for folder in sorted({parent(p) for p in paths}):
            try:
                fd = tree.dir(folder)
            except Blocked:
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
    if receipts.exists():  # made before the first temporary: only then can one be left
        remove_stale_temps(live, paths)
    done = read_receipts(receipts)
    started = time.monotonic()
    not_kept = _NotKept()
    with Tree(q, True) as qt, Tree(f, True) as ft:
        with Tree(live, True) as lt:  # only classified: every write re-checks its target
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
            found: list[Entry] = [(p.path, "already", p.f) for p in plan.paths
                                   if p.action == "already" and p.path not in done]
            if found:  # a crashed run's renames may not be durable yet: first make them so
                with Tree(live) as lt:
                    syncfs(lt.root_fd)
                log_.add(found)
            applied = _write(plan, ft, live, log_, progress, not_kept)
        finally:
            log_.close()
    if isinstance(applied, _Stopped):
        log.warning("apply into %s: %s changed during the apply; stopped", live, applied.path)
        return not_kept.result(
            "conflict", applied.applied, already,
            [Conflict(applied.path, "changed in the live project during the apply")],
        )
    log.info("applied %d paths into %s (%d already there)", len(applied), live, len(already))
    if not_kept.xattrs:
        log.warning("apply into %s: the live filesystem refused the xattrs of %d paths",
                    live, len(not_kept.xattrs))
    return not_kept.result("applied", applied, already)


class _Stopped(Raced):
    def __init__(self, path: str, applied: list[str]) -> None:
        super().__init__(path)
        self.applied = applied


class _Writer:
    """Batches in order, pipelined: one ``syncfs`` makes durable what every batch before
    it renamed or removed (and the temporaries of the batch that asked for it), whose
    receipts then follow, so a receipt is never written before its path is durably F.
    A batch asks for one only when its temporaries need a barrier; otherwise the next
    ``syncfs`` comes after :data:`UNSETTLED` batches, or at the end."""

    def __init__(self, live: Path, log_: _ReceiptLog, total: int,
                 progress: Callable[[int, int], None] | None, not_kept: _NotKept) -> None:
        self.live, self.log, self.total, self.progress = live, log_, total, progress
        self.unsettled: list[list[Entry]] = []  # each batch's receipts-to-be
        self.applied: list[str] = []
        self.not_kept = not_kept  # the apply's: what each batch did not keep is added
        self.linked: dict[int, tuple[str, str, int]] = {}  # see Batch
        self.batches = 0
        self.syncs, self.synced_for = 0, 0.0
        with Tree(live) as tree:
            self.ordered = on_btrfs(tree.root_fd)

    def sync(self, fd: int, force: bool = False) -> None:
        """One syncfs of the live filesystem when ``force`` or :data:`UNSETTLED` batches
        await it, then the receipts of every batch whose changes it made durable."""
        if not force and len(self.unsettled) < UNSETTLED:
            return
        started = time.monotonic()
        syncfs(fd)
        self.syncs += 1
        self.synced_for += time.monotonic() - started
        if not self.unsettled:
            return
        self.log.add(entry for done in self.unsettled for entry in done)
        failpoint("apply-after-receipts", self.log.path.parent)
        self.applied += [path for done in self.unsettled for path, _, _ in done]
        self.unsettled.clear()
        if self.progress is not None:
            self.progress(len(self.applied), self.total)

    def batch(self, plans: list[PathPlan], ft: Tree, removing: bool) -> None:
        self.batches += 1
        batch = Batch(self.live, self.ordered, self.batches, self.linked)
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
            self.unsettled.append(batch.done)  # after a race too: what it did is kept
            self.not_kept.xattrs += batch.xattrs_not_kept
            self.not_kept.links += batch.links_not_kept
            batch.close()

    def finish(self) -> None:
        if self.unsettled:
            with Tree(self.live) as tree:
                self.sync(tree.root_fd, force=True)


def _write(
    plan: ApplyPlan, ft: Tree, live: Path, log_: _ReceiptLog,
    progress: Callable[[int, int], None] | None, not_kept: _NotKept,
) -> list[str] | _Stopped:
    """Removals (deepest first), then placements (shallowest first), batch by batch;
    the paths applied, or where a person's change stopped it (what was changed before
    that is kept, durable and with receipts). What of F the written paths did not keep
    is added to ``not_kept``."""
    writes = plan.writes
    removals = sorted((p for p in writes if _needs_removal(p)),
                      key=lambda p: (-depth(p.path), p.path))
    placements = sorted((p for p in writes if p.f.kind != "absent"),
                        key=lambda p: (depth(p.path), p.path))
    started = time.monotonic()
    writer = _Writer(live, log_, len(writes), progress, not_kept)
    try:
        for plans in _batches(removals):
            writer.batch(plans, ft, removing=True)
        for plans in _batches(placements):
            writer.batch(plans, ft, removing=False)
        writer.finish()
        log.info("apply: %d paths written in %.1f s, %d syncs of the live filesystem in %.1f s",
                 len(writes), time.monotonic() - started, writer.syncs, writer.synced_for)
    except Raced as raced:
        writer.finish()
        return _Stopped(raced.path, writer.applied)
    return writer.applied


def check_applied(q: Path, f: Path, live: Path, paths: list[str], receipts: Path) -> Checked:
    """What ``live`` holds at every path of ``paths`` and of the apply's ``receipts`` file
    (``cairn doctor``): F's state, Q's (reverted) or neither (changed since); and every
    receipt whose recorded F state is not what F holds. Reads only; never follows a
    link in ``live``."""
    done = read_receipts(receipts)
    found: dict[str, list[str]] = {"as_applied": [], "reverted": [], "changed": []}
    differs: list[str] = []
    with Tree(q) as qt, Tree(f) as ft, Tree(live) as lt:
        for path in sorted(set(paths) | set(done)):
            check_relative(path)
            fs, qs, ls = ft.state(path), qt.state(path), lt.state(path)
            fs, qs = (ABSENT if s.kind == "blocked" else s for s in (fs, qs))
            ls = ABSENT if ls.kind == "blocked" and fs.kind == "absent" else ls
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
