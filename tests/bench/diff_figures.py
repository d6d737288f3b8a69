"""Change detection Q→P of 1,000 edits at several project sizes, beside ``git status``,
and where its time goes. Run as root, alone: ``.venv/bin/python
tests/bench/diff_figures.py`` (a loop Btrfs under ``--workdir``, always detached
afterwards).

``tree-search diff`` is what the settlement uses: root's record of the inodes P changed
since Q (:func:`cairn.treesearch.change_record`, a Btrfs tree search by generation) read
by :func:`cairn.settle.generations.changes_from_record`; ``tree search alone`` times the
record alone. ``send-stream diff`` is the fallback when P does not descend from Q
(:func:`cairn.settle.changes.changes`: ``btrfs send --no-data -p Q P`` and its replay),
beside ``btrfs send alone`` and ``replay alone``.

``--profile`` splits one send-stream detection into the ``btrfs send`` subprocess, the
stream parse, the replay and the reads of Q and P (cProfile); ``--changes-from FILE``
measures the ``changes`` of another version of the module (``git show
REV:cairn/settle/changes.py > FILE``) for a before/after; ``--node-size`` makes the pool's
Btrfs with other node sizes. ``./dev bench`` measures the same detections inside its
tree figures.

Q is a read-only snapshot of the project, whose shadow git repository was committed just
before; P is Q plus the suite's agent-like edits in a branch, frozen. Page caches are
warm for every method: each tree was just written or read.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib.util
import os
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import btrfsutil
from measure import Stopwatch, collect
from storage_figures import ShadowGit, _drop_subvolume, _fresh_subvolume, _settle_io, loop_pool
from synth import Editor, build_project

from cairn.settle.changes import ChangeSet, changes, changes_in
from cairn.settle.generations import changes_from_record
from cairn.storage import Pool, metadata_stream
from cairn.treesearch import change_record

CHANGED = 1000
SIZES = (1_000, 10_000, 100_000)
# Functions whose cumulative time the profile reports, by phase.
PHASES = {
    "btrfs send --no-data (subprocess)": ("metadata_stream",),
    "parse + replay of the stream": ("feed",),
    "change set from the replay (reads of Q and P)": ("result",),
}
# Functions whose own time the profile reports (summed over calls).
OWN = {
    "lstat/stat": ("posix.lstat", "posix.stat"),
    "scandir": ("posix.scandir",),
    "pydantic ChangeSet": ("__init__",),
}


@dataclass
class Edited:
    q: Path
    p: Path
    branch: Path
    shadow: ShadowGit
    edits: int
    stream: bytes = b""


@contextmanager
def edited_project(pool: Pool, scratch: Path, n_files: int, k: int) -> Iterator[Edited]:
    """A project of ``n_files`` files with a shadow git repository, Q, and P = Q plus
    ``k`` agent-like edits (the branch P was frozen from stays for ``git status``)."""
    run_id = f"flow_{uuid.uuid4().hex}"
    work = scratch / f"diff-n{n_files}"
    work.mkdir(parents=True)
    project_dir = _fresh_subvolume(work / "project")
    project = build_project(project_dir, n_files)
    try:
        shadow = ShadowGit(work / "shadow.git", work)
        shadow.init(project_dir)
        q = Path(pool.snapshot(project_dir, pool.q_path(run_id), read_only=True).path)
        branch = work / "branch"
        btrfsutil.create_snapshot(os.fspath(q), os.fspath(branch))
        edit = Editor(project).edit(branch, k)
        p = pool.checkpoint_path(run_id, "p")
        pool.snapshot(branch, p, read_only=True)
        _settle_io(pool.root.parent)
        yield Edited(q=q, p=p, branch=branch, shadow=shadow, edits=edit.count,
                     stream=metadata_stream(q, p))
    finally:
        pool.delete_run(run_id)
        for sub in ("branch", "project"):
            _drop_subvolume(work / sub)
        shutil.rmtree(work, ignore_errors=True)


ChangesFn = Callable[..., ChangeSet]


def load_module(module_file: Path) -> tuple[ChangesFn, ChangesFn]:
    """``changes`` and ``changes_in`` from another version of the send-stream module,
    beside the installed cairn."""
    spec = importlib.util.spec_from_file_location("cairn_sendstream_under_test", module_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {module_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations there
    spec.loader.exec_module(module)
    return module.changes, module.changes_in


def detect_once(e: Edited, changes_fn: ChangesFn = changes,
                profile: cProfile.Profile | None = None) -> float:
    """One timed detection; fails when it misses the edits."""
    if profile is not None:
        profile.enable()
    with Stopwatch() as sw:
        result = changes_fn(e.q, e.p)
    if profile is not None:
        profile.disable()
    # Every edited path, plus at most its parent directory (new directories).
    if not e.edits <= len(result.paths()) <= 2 * e.edits:
        raise AssertionError(f"changes found {len(result.paths())} paths for {e.edits} edits")
    return sw.elapsed


def _record(e: Edited) -> bytes:
    record = change_record(e.q, e.p)
    if record is None:
        raise AssertionError(f"no tree-search record of {e.p} since {e.q}")
    return record


def search_detect_once(e: Edited) -> float:
    """One timed detection from the tree search's record, as the settlement makes it;
    fails when it misses the edits."""
    with Stopwatch() as sw:
        result = changes_from_record(_record(e), e.q, e.p)
    if not e.edits <= len(result.paths()) <= 2 * e.edits:
        raise AssertionError(f"the tree search found {len(result.paths())} paths for "
                             f"{e.edits} edits")
    return sw.elapsed


def search_once(e: Edited) -> float:
    """Root's part alone: the tree search and its record."""
    with Stopwatch() as sw:
        _record(e)
    return sw.elapsed


def replay_once(e: Edited, changes_in_fn: ChangesFn = changes_in) -> float:
    """What the candidate unit does with the stream the broker wrote: parse, replay and
    the reads of Q and P, without ``btrfs send``."""
    with Stopwatch() as sw:
        changes_in_fn(e.stream, e.q, e.p)
    return sw.elapsed


def git_status_once(e: Edited) -> float:
    with Stopwatch() as sw:
        out = e.shadow.status(e.branch)
    if len(out.splitlines()) < e.edits // 2:
        raise AssertionError("git status missed the edits")
    return sw.elapsed


def send_once(e: Edited) -> float:
    with Stopwatch() as sw:
        metadata_stream(e.q, e.p)
    return sw.elapsed


def send_cpu(e: Edited, rounds: int = 5) -> str:
    """Where ``btrfs send`` spends its time: user and kernel CPU of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = sum(send_once(e) for _ in range(rounds))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (f"  btrfs send, mean of {rounds}: {wall / rounds * 1000:.1f} ms wall, "
            f"{(after.ru_stime - before.ru_stime) / rounds * 1000:.1f} ms kernel CPU, "
            f"{(after.ru_utime - before.ru_utime) / rounds * 1000:.1f} ms user CPU")


def profile_lines(profile: cProfile.Profile, total: float, stream_bytes: int) -> list[str]:
    stats = pstats.Stats(profile)
    cumulative: dict[str, float] = {}
    own: dict[str, tuple[int, float]] = {}
    for (file, _line, func), (_cc, calls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if any(part in file for part in ("changes.py", "sendstream", "storage")):
            cumulative[func] = max(cumulative.get(func, 0.0), ct)
        for phase, names in OWN.items():
            builtin = any(func == f"<built-in method {n}>" for n in names)
            if builtin or (func in names and (phase != "pydantic ChangeSet" or "pydantic" in file)):
                n, t = own.get(phase, (0, 0.0))
                own[phase] = (n + calls, t + tt)
    lines = [f"  total (profiled) {total * 1000:8.1f} ms; stream {stream_bytes:,} bytes"]
    for phase, names in PHASES.items():
        seconds = max((cumulative.get(n, 0.0) for n in names), default=0.0)
        lines.append(f"  {phase:<46} {seconds * 1000:8.1f} ms (cumulative)")
    for phase, (calls, seconds) in sorted(own.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {phase:<46} {seconds * 1000:8.1f} ms own in {calls} calls")
    return lines


def _median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:7.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diff_figures.py", description=__doc__)
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        default=SIZES)
    parser.add_argument("--changed", type=int, default=CHANGED)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workdir", type=Path,
                        default=Path(os.environ.get("CAIRN_BENCH_DIR", "/var/tmp")))
    parser.add_argument("--pool-size", default="8G")
    parser.add_argument("--node-size", type=int,
                        help="Btrfs node size of the loop pool in bytes (mkfs's default)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--changes-from", type=Path, metavar="FILE",
                        help="also measure the changes function of this module file")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("diff_figures.py: run as root (loop devices, Btrfs)", file=sys.stderr)
        return 2
    methods: dict[str, Callable[[Edited], float]] = {
        "tree-search diff": search_detect_once,
        "tree search alone": search_once,
        "send-stream diff": detect_once,
        "btrfs send alone": send_once,
        "replay alone (changes_in)": replay_once,
        "git status --porcelain": git_status_once,
    }
    if args.changes_from:
        other, other_in = load_module(args.changes_from)
        name = args.changes_from.name
        methods[f"diff, {name}"] = lambda e: detect_once(e, other)
        methods[f"replay alone, {name}"] = lambda e: replay_once(e, other_in)
    work = Path(tempfile.mkdtemp(prefix="cairn-diff-bench-", dir=args.workdir))
    try:
        with loop_pool(work, args.pool_size, args.node_size) as pool:
            scratch = pool.root.parent / "bench"
            scratch.mkdir()
            for n in args.sizes:
                with edited_project(pool, scratch, n, args.changed) as e:
                    for fn in methods.values():
                        fn(e)  # warm, untimed
                    # Interleaved rounds, so load from other work hits every method alike.
                    samples: dict[str, list[float]] = {m: [] for m in methods}
                    for _ in range(args.repeat):
                        for method, fn in methods.items():
                            samples[method] += collect(functools.partial(fn, e), repeat=1,
                                                       budget=60.0)
                    for method, s in samples.items():
                        print(f"{n:>7,} files, {e.edits:,} changed, {method:<28} median "
                              f"{_median_ms(s)}, min {min(s) * 1000:7.1f} ms (n={len(s)})")
                    if args.profile:
                        prof = cProfile.Profile()
                        total = detect_once(e, profile=prof)
                        print("\n".join(profile_lines(prof, total, len(e.stream))))
                        print(send_cpu(e))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
