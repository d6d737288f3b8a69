"""The tree-size figures on a loop Btrfs pool: boundary overhead, checkpoint, restore,
change detection, three-way apply and fork, each beside its comparison on the same tree.

Cairn's side is always the library code the broker and coordinator run
(:class:`cairn.storage.Pool`, :func:`cairn.treesearch.change_record` read by
:func:`cairn.settle.generations.changes_from_record`, and its fallback
:func:`cairn.settle.changes.changes`,
:func:`cairn.settle.build_candidate` / :func:`cairn.settle.apply`,
:class:`cairn.journal.readwrite.Journal`, the broker's
:class:`cairn.broker.receipts.ReceiptStore`). Page caches are warm for every method alike:
each tree was just written or read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import btrfsutil
from measure import Cell, Stopwatch, collect
from synth import Editor, build_project
from verdicts import SEARCH_ALONE, SEND_ALONE, SEND_DIFF, TREE_SEARCH_DIFF

from cairn import paths, proc, treesearch
from cairn.broker import spare
from cairn.broker.receipts import ReceiptStore
from cairn.canonical import canonical_json, sha256_hex
from cairn.journal.readwrite import Journal
from cairn.protocol.agent import Boundary
from cairn.protocol.broker import AgentStarted, Checkpointed, Intent, SubvolumeReceipt
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.settle.apply import apply
from cairn.settle.candidate import build_candidate
from cairn.settle.changes import changes
from cairn.settle.generations import changes_from_record
from cairn.settle.paths import SettlementPolicy
from cairn.storage import Pool
from cairn.storage_init import init_loop_pool, remove_loop_pool
from cairn.worker.profiles import flush_workspace

log = logging.getLogger(__name__)

OWNER = (1001, 1001)
AGENT_EDITS = 10
CHANGE_COUNTS = (10, 1000)
LANE_COUNTS = (1, 8, 32)


@dataclass
class Bench:
    """Where one run of the tree figures works, and how hard it samples."""

    pool: Pool
    scratch: Path
    repeat: int
    budget: float
    cells: list[Cell]

    def add(self, figure: str, size: int, variant: str, method: str, cairn: bool,
            samples: list[float]) -> None:
        self.cells.append(Cell(figure=figure, size=size, variant=variant, method=method,
                               cairn=cairn, samples=samples))
        log.info("%-18s %7d %-12s %-22s median %.4fs (n=%d)", figure, size, variant, method,
                 self.cells[-1].median, len(samples))


@contextmanager
def loop_pool(workdir: Path, size: str, node_size: int | None = None) -> Iterator[Pool]:
    """A fresh Btrfs on a sparse loop image under ``workdir`` (made with the code that
    backs ``cairn storage init --loop``); always unmounted and detached afterwards."""
    image = workdir / "pool.img"
    mountpoint = workdir / "mnt"
    loop = init_loop_pool(image, size, mountpoint, node_size=node_size)
    try:
        root = mountpoint / "pool"
        root.mkdir()
        yield Pool.open(root)
    finally:
        _delete_subvolumes_under(mountpoint)
        remove_loop_pool(loop)
        shutil.rmtree(mountpoint, ignore_errors=True)


def _delete_subvolumes_under(root: Path) -> None:
    for dirpath, dirnames, _files in os.walk(root):
        for name in list(dirnames):
            path = Path(dirpath, name)
            if btrfsutil.is_subvolume(os.fspath(path)) if not path.is_symlink() else False:
                btrfsutil.delete_subvolume(os.fspath(path), recursive=True)
                dirnames.remove(name)


def _settle_io(mount: Path) -> None:
    """Untimed: flush dirty data and wait for deleted subvolumes to be cleaned, so one
    measurement does not pay for the previous setup."""
    os.sync()
    # A filesystem sync commits and wakes the cleaner, so waiting for deleted subvolumes
    # does not sit out the 30 s commit interval.
    proc.run(["btrfs", "filesystem", "sync", mount], check=False, timeout=600)
    proc.run(["btrfs", "subvolume", "sync", mount], check=False, timeout=600)


def _fresh_subvolume(path: Path) -> Path:
    if path.exists():
        btrfsutil.delete_subvolume(os.fspath(path), recursive=True)
    btrfsutil.create_subvolume(os.fspath(path))
    return path


def _drop_subvolume(path: Path) -> None:
    if path.exists():
        btrfsutil.delete_subvolume(os.fspath(path), recursive=True)


class ShadowGit:
    """A shadow-git checkpointer: a separate git directory whose work tree is W, the way
    agent tools keep checkpoints without touching the project's own ``.git``."""

    def __init__(self, git_dir: Path, home: Path) -> None:
        self.git_dir = git_dir
        self.env = {
            "GIT_DIR": os.fspath(git_dir), "HOME": os.fspath(home),
            "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
            "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
        }

    def git(self, work_tree: Path, *args: str) -> bytes:
        env = {**self.env, "GIT_WORK_TREE": os.fspath(work_tree)}
        return proc.run(["git", *args], env=env, cwd=work_tree, timeout=1800).stdout

    def init(self, work_tree: Path) -> None:
        proc.run(["git", "init", "-q", "--bare", self.git_dir], env=self.env)
        self.git(work_tree, "config", "core.bare", "false")
        self.checkpoint(work_tree, "initial")

    def checkpoint(self, work_tree: Path, message: str) -> str:
        """``git add -A && git commit``; returns the new commit."""
        self.git(work_tree, "add", "-A")
        self.git(work_tree, "commit", "-q", "--allow-empty", "-m", message)
        return self.git(work_tree, "rev-parse", "HEAD").decode().strip()

    def restore(self, work_tree: Path, commit: str) -> None:
        """``git checkout`` of the commit plus ``git clean`` of untracked files."""
        self.git(work_tree, "checkout", "-f", "-q", commit)
        self.git(work_tree, "clean", "-f", "-d", "-q")

    def status(self, work_tree: Path) -> bytes:
        return self.git(work_tree, "status", "--porcelain")


def hash_walk(root: Path) -> str:
    """The full-tree hash walk: SHA-256 over every path, type and content (symlinks by
    target), in sorted order."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest.update(os.path.relpath(path, root).encode(errors="surrogateescape"))
            if stat.S_ISLNK(st.st_mode):
                digest.update(b"L" + os.readlink(path).encode(errors="surrogateescape"))
            elif stat.S_ISREG(st.st_mode):
                file_digest = hashlib.sha256()
                with open(path, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        file_digest.update(chunk)
                digest.update(b"F" + file_digest.digest())
    return digest.hexdigest()


def cp_a(src: Path, dst: Path) -> None:
    proc.run(["cp", "-a", src, dst], timeout=3600)


def _durable_write(path: Path, text: str) -> None:
    """The coordinator's MATERIALIZE write: temp file, fsync, chmod, rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def bench_description(run_id: str, project: Path) -> LaunchDescription:
    return LaunchDescription(
        run_id=run_id, owner_uid=OWNER[0], owner_gid=OWNER[1], owner_name="bench",
        definition="bench:boundary", source="x = 1\n", source_filename="bench.py",
        review_hash="sha256:" + "0" * 64, review={}, args={},
        project=ProjectSpec(root=os.fspath(project), owner_uid=OWNER[0], on_pool_fs=True),
        profiles={}, cairn_version="bench", created_at=time.time(),
    )


class BoundaryPath:
    """QUIESCE → SNAPSHOT → MATERIALIZE → COMMIT after an agent finished, as the library
    calls of the coordinator and the broker make it (see docs/performance.md for what is
    in and out)."""

    def __init__(self, pool: Pool, run_id: str, project: Path) -> None:
        self.pool = pool
        self.run_id = run_id
        self.journal = Journal(paths.journal_path(), create=True)
        self.journal.create_run(bench_description(run_id, project), intents=[])
        self.token = self.journal.acquire_lease(run_id, "bench", ttl=3600)
        self.store = ReceiptStore()
        self.ops = 0

    def close(self) -> None:
        self.store.close()
        self.journal.close()

    def start_op(self) -> str:
        """Untimed: the operation as it stands when the agent's unit has just stopped."""
        self.ops += 1
        op_id = f"root-{self.ops}"
        call = CallRequest(scope="root", seq=self.ops, kind="agent",
                           request={"descriptor": "edit", "prompt": f"step {self.ops}",
                                    "title": "edit"},
                           location="bench.py:10:5")
        self.journal.record_requested(call, run_id=self.run_id, op_id=op_id,
                                      predecessor=None, token=self.token)
        start = Intent(intent_id=f"start-agent.{op_id}.1", run_id=self.run_id,
                       kind="start-agent", op_id=op_id)
        self.journal.update_op(self.run_id, op_id, token=self.token, state="started",
                               intents=[start])
        self.store.put(start, AgentStarted(unit=f"cairn-agent-{op_id}.service", op_id=op_id,
                                           invocation_id="0" * 32, control_group="", attempt=1))
        return op_id

    def run(self, op_id: str, w: Path) -> Path:
        """The timed boundary; returns the checkpoint S."""
        output: dict[str, Any] = {"summary": f"done {op_id}"}
        finish: dict[str, Any] = {"output": output, "handoff": "next: review"}
        # FINISH recorded, then the checkpoint intent queued (coordinator).
        self.journal.update_op(self.run_id, op_id, token=self.token, finish=finish,
                               event="op-finished")
        intent = Intent(intent_id=f"checkpoint.{op_id}", run_id=self.run_id,
                        kind="checkpoint", op_id=op_id)
        self.journal.add_intents(self.run_id, [intent], token=self.token)
        # SNAPSHOT (broker): pending intents, receipts lookup, the read-only snapshot.
        pending = self.journal.intents(self.run_id, "storage-v1")
        todo = [i for i in pending if self.store.get(self.run_id, i.intent_id) is None]
        self.journal.get_op_by_id(self.run_id, op_id)
        started = [r for r in self.store.for_run(self.run_id)
                   if r.kind == "start-agent" and r.data.get("op_id") == op_id]
        assert started and todo
        s = self.pool.checkpoint_path(self.run_id, op_id)
        s.parent.mkdir(parents=True, exist_ok=True)
        receipt = self.pool.snapshot(w, s, read_only=True)
        done = self.store.put(intent, Checkpointed(s=receipt, op_id=op_id))
        self.journal.record_receipts(self.run_id, [done.model_dump(mode="json")])
        # MATERIALIZE (coordinator): boundary.json, handoff.md, result.json, durably.
        boundary = Boundary(
            run_id=self.run_id, op_id=op_id, scope="root", attempt=1, descriptor="edit",
            instruction=f"step {self.ops}", invocation={}, output=output,
            output_sha256=sha256_hex(canonical_json(output)),
            finish_sha256=sha256_hex(canonical_json(finish)), handoff=str(finish["handoff"]),
            notes=[], unit=started[-1].data["unit"], invocation_id="0" * 32,
            checkpoint=done.data, predecessor=None,
        )
        out = paths.run_state_dir(self.run_id) / "boundaries" / op_id
        out.mkdir(parents=True, exist_ok=True)
        _durable_write(out / "boundary.json", boundary.model_dump_json(indent=2))
        _durable_write(out / "handoff.md", boundary.handoff + "\n")
        _durable_write(out / "result.json", json.dumps(boundary.output, indent=2))
        # COMMIT: settled with the result and checkpoint, then committed.
        result = {"output": output, "handoff": finish["handoff"], "op_id": op_id}
        self.journal.update_op(self.run_id, op_id, token=self.token, state="settled",
                               result=result, checkpoint=done.data)
        self.journal.update_op(self.run_id, op_id, token=self.token, state="committed")
        return s


def run_size(bench: Bench, n_files: int) -> None:
    """Every tree figure for a project of ``n_files`` files."""
    pool, mount = bench.pool, bench.pool.root.parent
    run_id = f"flow_{uuid.uuid4().hex}"
    work = bench.scratch / f"n{n_files}"
    work.mkdir(parents=True)
    project_dir = _fresh_subvolume(work / "project")
    copies = work / "copies"
    t = time.monotonic()
    project = build_project(project_dir, n_files)
    os.chown(project_dir, *OWNER)
    log.info("built %d entries (%d MiB) in %.1fs", project.entry_count,
             project.total_bytes >> 20, time.monotonic() - t)
    q = pool.snapshot(project_dir, pool.q_path(run_id), read_only=True)
    gen = 1
    w_path = pool.w_path(run_id, "root", gen)
    pool.snapshot(Path(q.path), w_path, read_only=False)
    os.chown(w_path, *OWNER)
    shadow = ShadowGit(work / "shadow.git", work)
    t = time.monotonic()
    shadow.init(w_path)
    log.info("shadow git initial commit took %.1fs (not part of any figure)",
             time.monotonic() - t)
    editor = Editor(project)
    boundary = BoundaryPath(pool, run_id, project_dir)
    try:
        _checkpoint_and_restore(bench, n_files, run_id, w_path, shadow, editor, copies)
        _flushed_checkpoint(bench, n_files, run_id, w_path, editor)
        _boundary(bench, n_files, boundary, w_path, editor)
        _changes_and_apply(bench, n_files, run_id, w_path, shadow, editor, work)
        _fork(bench, n_files, run_id, copies)
    finally:
        boundary.close()
        pool.delete_run(run_id)
        _delete_subvolumes_under(work)
        shutil.rmtree(work, ignore_errors=True)
        _settle_io(mount)


def _checkpoint_and_restore(bench: Bench, n: int, run_id: str, w: Path, shadow: ShadowGit,
                            editor: Editor, copies: Path) -> None:
    """Per round: the agent edits W; checkpoint it three ways; the agent edits again; then
    restore W to that checkpoint three ways. Every method sees the same trees."""
    pool, mount = bench.pool, bench.pool.root.parent
    samples: dict[str, list[float]] = {k: [] for k in (
        "ck-cairn", "ck-git", "ck-cp", "rs-cairn", "rs-spare", "rs-git", "rs-cp")}
    started = time.monotonic()
    rounds = 0
    while rounds < bench.repeat:
        rounds += 1
        _settle_io(mount)
        editor.edit(w, AGENT_EDITS)
        flush_workspace(str(w))  # the agent's own last step before finish_work
        s = pool.checkpoint_path(run_id, f"ck{rounds}")
        s.parent.mkdir(parents=True, exist_ok=True)
        with Stopwatch() as sw:
            pool.snapshot(w, s, read_only=True)
        samples["ck-cairn"].append(sw.elapsed)
        with Stopwatch() as sw:
            commit = shadow.checkpoint(w, f"checkpoint {rounds}")
        samples["ck-git"].append(sw.elapsed)
        _fresh_subvolume(copies)
        copy = copies / "ck"
        _settle_io(mount)
        with Stopwatch() as sw:
            cp_a(w, copy)
        samples["ck-cp"].append(sw.elapsed)

        saved = (list(editor.files), list(editor.directories))
        editor.edit(w, AGENT_EDITS)
        victim = copies / "victim"
        btrfsutil.create_snapshot(os.fspath(w), os.fspath(victim))
        new_w = pool.w_path(run_id, "root", 1000 + rounds)
        _settle_io(mount)
        with Stopwatch() as sw:
            pool.snapshot(s, new_w, read_only=False)
            os.chown(new_w, *OWNER)
        samples["rs-cairn"].append(sw.elapsed)
        samples["rs-spare"].append(_spare_swap(bench, s, w.with_name(f"spare.ck{rounds}"),
                                               pool.w_path(run_id, "root", 2000 + rounds)))
        with Stopwatch() as sw:
            shadow.restore(w, commit)
        samples["rs-git"].append(sw.elapsed)
        _settle_io(mount)
        with Stopwatch() as sw:
            proc.run(["rm", "-rf", *(victim / e for e in os.listdir(victim))], timeout=3600)
            proc.run(["cp", "-a", f"{copy}/.", victim], timeout=3600)
        samples["rs-cp"].append(sw.elapsed)
        editor.files, editor.directories = saved
        if _tracked_differs(shadow, w):
            raise AssertionError("git restore did not bring W back to its checkpoint")
        _drop_subvolume(new_w)
        _drop_subvolume(pool.w_path(run_id, "root", 2000 + rounds))
        _drop_subvolume(copies)
        if rounds >= 3 and time.monotonic() - started > 3 * bench.budget:
            break
    for key, figure, method, cairn in (
        ("ck-cairn", "checkpoint", "Btrfs snapshot + receipt", True),
        ("ck-git", "checkpoint", "shadow git add -A && commit", False),
        ("ck-cp", "checkpoint", "cp -a", False),
        ("rs-cairn", "restore", "new W generation", True),
        ("rs-spare", "restore", "hot spare swapped in by rename", True),
        ("rs-git", "restore", "git checkout + git clean", False),
        ("rs-cp", "restore", "rm -rf + cp -a back", False),
    ):
        variant = f"{AGENT_EDITS} edits" + (", hot spare" if key == "rs-spare" else "")
        bench.add(figure, n, variant, method, cairn, samples[key])


def _spare_swap(bench: Bench, s: Path, spare_path: Path, new_w: Path) -> float:
    """The restore a reject after an accept makes (``broker/spare.py``): the spare of S,
    made at the accept (untimed, as make-spare does it: writable snapshot, chown, commit),
    checked untouched and renamed to the next W generation with its receipt (timed)."""
    pool = bench.pool
    pool.snapshot(s, spare_path, read_only=False)
    os.chown(spare_path, *OWNER)
    btrfsutil.sync(os.fspath(spare_path))
    made, checkpoint = pool.receipt(spare_path), pool.receipt(s)
    _settle_io(pool.root.parent)
    with Stopwatch() as sw:
        swapped = spare.swap(spare_path, made, checkpoint, new_w, bench.scratch)
    if swapped is None or swapped.uuid != made.uuid:
        raise AssertionError(f"the spare {spare_path} was not taken")
    return sw.elapsed


def _flushed_checkpoint(bench: Bench, n: int, run_id: str, w: Path, editor: Editor) -> None:
    """The same snapshot when the agent's edits were already on disk (synced, untimed):
    separates the snapshot itself from flushing the edits in its transaction commit."""
    pool, mount = bench.pool, bench.pool.root.parent
    rounds = 0

    def once() -> float:
        nonlocal rounds
        rounds += 1
        _settle_io(mount)
        editor.edit(w, AGENT_EDITS)
        os.sync()
        s = pool.checkpoint_path(run_id, f"flushed{rounds}")
        with Stopwatch() as sw:
            pool.snapshot(w, s, read_only=True)
        return sw.elapsed

    bench.add("checkpoint", n, f"{AGENT_EDITS} edits, flushed", "Btrfs snapshot + receipt",
              True, collect(once, repeat=bench.repeat, budget=bench.budget))


def _tracked_differs(shadow: ShadowGit, w: Path) -> bool:
    return bool(shadow.status(w).strip())


def _boundary(bench: Bench, n: int, boundary: BoundaryPath, w: Path, editor: Editor) -> None:
    mount = bench.pool.root.parent

    def once() -> float:
        _settle_io(mount)
        op_id = boundary.start_op()
        editor.edit(w, AGENT_EDITS)
        flush_workspace(str(w))  # the agent's own last step before finish_work
        with Stopwatch() as sw:
            boundary.run(op_id, w)
        return sw.elapsed

    bench.add("boundary", n, f"{AGENT_EDITS} edits", "snapshot+materialize+commit", True,
              collect(once, repeat=bench.repeat, budget=bench.budget))


def _changes_and_apply(bench: Bench, n: int, run_id: str, w: Path, shadow: ShadowGit,
                       editor: Editor, work: Path) -> None:
    """Q = W frozen now (the shadow repo's HEAD and index match it); P = Q plus k edits."""
    shadow.checkpoint(w, "base for change detection")
    q = bench.pool.checkpoint_path(run_id, "cdq")
    bench.pool.snapshot(w, q, read_only=True)
    for k in CHANGE_COUNTS:
        _changes_and_apply_k(bench, n, run_id, w, shadow, editor, work, q, k)


def _changes_and_apply_k(bench: Bench, n: int, run_id: str, w: Path, shadow: ShadowGit,
                         editor: Editor, work: Path, q: Path, k: int) -> None:
    pool, mount = bench.pool, bench.pool.root.parent
    branch = work / f"branch{k}"
    btrfsutil.create_snapshot(os.fspath(w), os.fspath(branch))
    saved = (list(editor.files), list(editor.directories))
    edit = editor.edit(branch, k)
    editor.files, editor.directories = saved
    p = pool.checkpoint_path(run_id, f"cdp{k}")
    pool.snapshot(branch, p, read_only=True)
    _settle_io(mount)
    variant = f"{k:,} changed"
    searched: list[int] = []

    def search_detect() -> float:
        with Stopwatch() as sw:
            record = treesearch.change_record(q, p)
            if record is None:
                raise AssertionError(f"no tree-search record of {p} since {q}")
            result = changes_from_record(record, q, p)
        searched.append(len(result.paths()))
        return sw.elapsed

    bench.add("changes", n, variant, TREE_SEARCH_DIFF, True,
              collect(search_detect, repeat=bench.repeat, budget=bench.budget))
    # Every edited path, plus at most its parent directory (new directories, metadata).
    if not edit.count <= searched[-1] <= 2 * edit.count:
        raise AssertionError(f"the tree search found {searched[-1]} paths for {edit.count} "
                             "edits")

    def search_alone() -> float:
        with Stopwatch() as sw:
            record = treesearch.change_record(q, p)
        if record is None:
            raise AssertionError(f"no tree-search record of {p} since {q}")
        return sw.elapsed

    bench.add("changes", n, variant, f"{SEARCH_ALONE} (change_record)", True,
              collect(search_alone, repeat=bench.repeat, budget=bench.budget))
    found: list[int] = []

    def detect() -> float:
        with Stopwatch() as sw:
            result = changes(q, p)
        found.append(len(result.paths()))
        return sw.elapsed

    bench.add("changes", n, variant, SEND_DIFF, True,
              collect(detect, repeat=bench.repeat, budget=bench.budget))
    if not edit.count <= found[-1] <= 2 * edit.count:
        raise AssertionError(f"changes found {found[-1]} paths for {edit.count} edits")

    def send_alone() -> float:
        with Stopwatch() as sw:
            proc.run(["btrfs", "-q", "send", "--no-data", "-f", os.devnull, "-p", q, p])
        return sw.elapsed

    bench.add("changes", n, variant, f"{SEND_ALONE} (--no-data -p Q P to /dev/null)", True,
              collect(send_alone, repeat=bench.repeat, budget=bench.budget))

    def git_status() -> float:
        with Stopwatch() as sw:
            out = shadow.status(branch)
        if len(out.splitlines()) < k // 2:
            raise AssertionError("git status missed the edits")
        return sw.elapsed

    bench.add("changes", n, variant, "git status --porcelain", False,
              collect(git_status, repeat=bench.repeat, budget=bench.budget))

    def walk() -> float:
        with Stopwatch() as sw:
            hash_walk(p)
        return sw.elapsed

    bench.add("changes", n, variant, "full-tree hash walk", False,
              collect(walk, repeat=bench.repeat, budget=bench.budget))

    change_set = changes(q, p)
    c = pool.checkpoint_path(run_id, f"c{k}")
    pool.snapshot(q, c, read_only=False)
    report = build_candidate(q, p, c, change_set, SettlementPolicy())
    if report.refused:
        raise AssertionError(f"candidate refused {report.refused[:3]}")
    f = pool.checkpoint_path(run_id, f"f{k}")
    pool.snapshot(c, f, read_only=True)
    live = work / f"live{k}"
    receipts = work / f"receipts{k}.jsonl"

    def apply_once() -> float:
        _drop_subvolume(live)
        receipts.unlink(missing_ok=True)
        btrfsutil.create_snapshot(os.fspath(q), os.fspath(live))
        _settle_io(mount)
        with Stopwatch() as sw:
            result = apply(q, f, live, report.accepted, receipts)
        if result.status != "applied" or len(result.applied) != len(report.accepted):
            raise AssertionError(f"apply: {result.status}, {len(result.conflicts)} conflicts")
        return sw.elapsed

    bench.add("apply", n, variant, "three-way apply", True,
              collect(apply_once, repeat=bench.repeat, budget=bench.budget))
    _drop_subvolume(live)
    _drop_subvolume(branch)


def _lanes(count: int) -> str:
    return f"{count} lane" if count == 1 else f"{count} lanes"


def _fork(bench: Bench, n: int, run_id: str, copies: Path) -> None:
    for lanes in LANE_COUNTS:
        _fork_lanes(bench, n, run_id, copies, lanes)


def _fork_lanes(bench: Bench, n: int, run_id: str, copies: Path, lanes: int) -> None:
    pool, mount = bench.pool, bench.pool.root.parent
    s = pool.checkpoint_path(run_id, "cdq")
    receipt: SubvolumeReceipt = pool.receipt(s)
    made: list[Path] = []

    def cairn_fork() -> float:
        for lane in made:
            _drop_subvolume(lane)
        made.clear()
        _settle_io(mount)
        with Stopwatch() as sw:
            pool.verify(s, receipt)
            for j in range(lanes):
                lane = pool.w_path(run_id, f"lane{j}", 1)
                lane.parent.mkdir(parents=True, exist_ok=True)
                pool.snapshot(s, lane, read_only=False)
                os.chown(lane, *OWNER)
                made.append(lane)
        return sw.elapsed

    bench.add("fork", n, _lanes(lanes), "lane W snapshots", True,
              collect(cairn_fork, repeat=bench.repeat, budget=bench.budget))
    for lane in made:
        _drop_subvolume(lane)

    def copy_fork() -> float:
        _fresh_subvolume(copies)
        _settle_io(mount)
        with Stopwatch() as sw:
            for j in range(lanes):
                cp_a(s, copies / f"lane{j}")
        return sw.elapsed

    bench.add("fork", n, _lanes(lanes), "cp -a per lane", False,
              collect(copy_fork, repeat=bench.repeat, budget=bench.budget))
    _drop_subvolume(copies)
