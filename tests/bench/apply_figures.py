"""The three-way apply of 1,000 changed files at two project sizes, and where its time
goes. Run as root, alone: ``.venv/bin/python tests/bench/apply_figures.py`` (a loop
Btrfs under ``--workdir``, always detached afterwards); ``--profile`` adds a cProfile
breakdown of one apply; ``--apply-from FILE`` measures the ``apply`` of another version
of the module (``git show REV:cairn/settle/apply.py > FILE``) for a before/after. ``./dev
bench`` measures the same apply inside its tree figures.

The edits are the suite's agent-like mix (70 % modified, 20 % new, 10 % deleted); the
live project is a fresh writable snapshot of Q each round, flushed before the clock
starts (untimed), so every sample pays the same durability work.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib.util
import os
import pstats
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import btrfsutil
from measure import Cell, Stopwatch, collect
from storage_figures import _drop_subvolume, _fresh_subvolume, _settle_io, loop_pool
from synth import Editor, build_project
from verdicts import PROFILED_PREFIX, PROFILED_WHOLE

from cairn import proc
from cairn.settle.apply import Applied, apply
from cairn.settle.candidate import build_candidate
from cairn.settle.changes import changes
from cairn.settle.paths import SettlementPolicy
from cairn.storage import Pool

CHANGED = 1000
SIZES = (1_000, 100_000)
# Functions whose time the profile reports (own time, summed over calls), by phase.
PROFILED = {
    "fsync": ("posix.fsync",),
    "syncfs": ("syncfs",),
    "rename": ("posix.rename",),
    "hash (plan, re-checks, copy check)": ("_hash_fd", "hash_fd",),
    "copy data (reflink)": ("copy_file_data", "clone_file", "copy_bytes"),
    "stat/open/mkdir/unlink": ("posix.stat", "posix.open", "posix.mkdir", "posix.unlink"),
    "receipt lines (json)": ("line",),
}


@dataclass
class Settled:
    q: Path
    f: Path
    accepted: list[str]
    work: Path


@contextmanager
def settled_project(pool: Pool, scratch: Path, n_files: int, k: int) -> Iterator[Settled]:
    """A project of ``n_files`` files, Q, and F = Q plus ``k`` agent-like edits."""
    run_id = f"flow_{uuid.uuid4().hex}"
    work = scratch / f"apply-n{n_files}"
    work.mkdir(parents=True)
    project_dir = _fresh_subvolume(work / "project")
    project = build_project(project_dir, n_files)
    try:
        q = Path(pool.snapshot(project_dir, pool.q_path(run_id), read_only=True).path)
        branch = work / "branch"
        btrfsutil.create_snapshot(os.fspath(q), os.fspath(branch))
        Editor(project).edit(branch, k)
        p = pool.checkpoint_path(run_id, "p")
        pool.snapshot(branch, p, read_only=True)
        c = pool.checkpoint_path(run_id, "c")
        pool.snapshot(q, c, read_only=False)
        report = build_candidate(q, p, c, changes(q, p), SettlementPolicy())
        if report.refused:
            raise AssertionError(f"candidate refused {report.refused[:3]}")
        f = pool.checkpoint_path(run_id, "f")
        pool.snapshot(c, f, read_only=True)
        yield Settled(q=q, f=f, accepted=report.accepted, work=work)
    finally:
        pool.delete_run(run_id)
        for sub in ("live", "branch", "project"):
            _drop_subvolume(work / sub)
        shutil.rmtree(work, ignore_errors=True)


ApplyFn = Callable[..., Applied]


def load_apply(module_file: Path) -> ApplyFn:
    """``apply`` from another version of the apply module, beside the installed cairn."""
    spec = importlib.util.spec_from_file_location("cairn_apply_under_test", module_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {module_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations there
    spec.loader.exec_module(module)
    fn: ApplyFn = module.apply
    return fn


def apply_once(pool: Pool, s: Settled, profile: cProfile.Profile | None = None,
               apply_fn: ApplyFn = apply) -> float:
    """One timed apply into a fresh live copy of Q (setup untimed)."""
    live, receipts = s.work / "live", s.work / "receipts.jsonl"
    _drop_subvolume(live)
    receipts.unlink(missing_ok=True)
    btrfsutil.create_snapshot(os.fspath(s.q), os.fspath(live))
    _settle_io(pool.root.parent)
    if profile is not None:
        profile.enable()
    with Stopwatch() as sw:
        result = apply_fn(s.q, s.f, live, s.accepted, receipts)
    if profile is not None:
        profile.disable()
    if result.status != "applied" or len(result.applied) != len(s.accepted):
        raise AssertionError(f"apply: {result.status}, {len(result.conflicts)} conflicts")
    return sw.elapsed


def apply_alternating(pool: Pool, s: Settled, rounds: int) -> list[float]:
    """``rounds`` timed applies into one live project with its own metadata (a copy of
    Q, its data reflinked, as the importer's Q shares a project's data on the same
    Btrfs): Q → F, then F → Q, and so on, each with the same 1,000 changes."""
    live, receipts = s.work / "live", s.work / "receipts.jsonl"
    _drop_subvolume(live)
    btrfsutil.create_subvolume(os.fspath(live))
    proc.run(["cp", "-a", "--reflink=always", f"{s.q}/.", os.fspath(live)], timeout=600)
    samples, base, target = [], s.q, s.f
    for _ in range(rounds):
        receipts.unlink(missing_ok=True)
        _settle_io(pool.root.parent)
        with Stopwatch() as sw:
            result = apply(base, target, live, s.accepted, receipts)
        if result.status != "applied" or len(result.applied) != len(s.accepted):
            raise AssertionError(f"apply: {result.status}, {len(result.conflicts)} conflicts")
        samples.append(sw.elapsed)
        base, target = target, base
    return samples


def profile_phases(profile: cProfile.Profile) -> list[tuple[str, float]]:
    """Where one profiled apply spent its time: the plan (cumulative) and each phase of
    :data:`PROFILED` (own time summed over calls, the call count in its name), slowest
    first after the plan."""
    stats = pstats.Stats(profile)
    own: dict[str, tuple[int, float]] = {}
    cumulative: dict[str, float] = {}
    for (_file, _line, func), (_cc, calls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for phase, names in PROFILED.items():
            if any(func == n or func.endswith(f" {n}>") for n in names):
                n, t = own.get(phase, (0, 0.0))
                own[phase] = (n + calls, t + tt)
        cumulative[func] = max(cumulative.get(func, 0.0), ct)
    plan = max(cumulative.get("_plan", 0.0), cumulative.get("plan_apply", 0.0))
    return [("plan, 3 states per path (cumulative)", plan)] + [
        (f"{phase} ({calls} calls)", seconds)
        for phase, (calls, seconds) in sorted(own.items(), key=lambda kv: -kv[1][1])]


def profile_lines(profile: cProfile.Profile, total: float) -> list[str]:
    return [f"  total (profiled) {total * 1000:8.1f} ms"] + [
        f"  {name:<44} {seconds * 1000:8.1f} ms" for name, seconds in profile_phases(profile)]


def profile_cells(pool: Pool, scratch: Path, n_files: int, k: int = CHANGED) -> list[Cell]:
    """One profiled apply of ``k`` edits in a project of ``n_files`` files, as rows of
    ``./dev bench``'s apply figure (one sample each): the whole apply under the profiler,
    then where its time went."""
    with settled_project(pool, scratch, n_files, k) as s:
        apply_once(pool, s)  # warm, untimed
        prof = cProfile.Profile()
        total = apply_once(pool, s, prof)
    rows = [(PROFILED_WHOLE, total), *profile_phases(prof)]
    return [Cell(figure="apply", size=n_files, variant=f"{k:,} changed",
                 method=f"{PROFILED_PREFIX}{name}", cairn=True, samples=[seconds])
            for name, seconds in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apply_figures.py", description=__doc__)
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        default=SIZES)
    parser.add_argument("--changed", type=int, default=CHANGED)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workdir", type=Path,
                        default=Path(os.environ.get("CAIRN_BENCH_DIR", "/var/tmp")))
    parser.add_argument("--pool-size", default="8G")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--apply-from", type=Path, metavar="FILE",
                        help="measure the apply function of this module file instead")
    parser.add_argument("--own-live", action="store_true",
                        help="also time applies into a live project with its own metadata")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("apply_figures.py: run as root (loop devices, Btrfs)", file=sys.stderr)
        return 2
    apply_fn = load_apply(args.apply_from) if args.apply_from else apply
    work = Path(tempfile.mkdtemp(prefix="cairn-apply-bench-", dir=args.workdir))
    try:
        with loop_pool(work, args.pool_size) as pool:
            scratch = pool.root.parent / "bench"
            scratch.mkdir()
            for n in args.sizes:
                with settled_project(pool, scratch, n, args.changed) as s:
                    samples = sorted(collect(functools.partial(apply_once, pool, s,
                                                               apply_fn=apply_fn),
                                             repeat=args.repeat, budget=120.0))
                    median = samples[len(samples) // 2]
                    print(f"apply of {len(s.accepted)} paths, project of {n:,} files: "
                          f"median {median * 1000:.1f} ms, max {samples[-1] * 1000:.1f} ms "
                          f"(n={len(samples)})")
                    if args.own_live:
                        own = sorted(apply_alternating(pool, s, args.repeat))
                        print(f"  live with its own metadata, Q → F and back: median "
                              f"{own[len(own) // 2] * 1000:.1f} ms, max {own[-1] * 1000:.1f} ms "
                              f"(n={len(own)})")
                    if args.profile:
                        prof = cProfile.Profile()
                        total = apply_once(pool, s, prof, apply_fn)
                        print("\n".join(profile_lines(prof, total)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
