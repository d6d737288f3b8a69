"""Cairn's benchmark suite: what the machinery costs beside the usual ways to checkpoint
agents. Run as root (loop devices, Btrfs, systemd-nspawn): ``./dev bench`` for the full
run that writes ``docs/performance.md`` and ``tests/bench/results/performance.json``;
``./dev bench --quick`` for a smoke run that writes under the work directory instead.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from apply_figures import profile_cells
from journal_figures import LOOP_WORKFLOW, REPLAY_SIZES, commit_rate, replay_figures
from measure import Cell, Results, machine_info
from report import render
from run_figures import SINGLE_SHOT, run_figures
from storage_figures import Bench, loop_pool, run_size
from unit_figures import unit_figures
from verdicts import PROFILED_PREFIX

log = logging.getLogger("bench")

REPO = Path(__file__).resolve().parents[2]
FULL_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 2_000)
QUICK_REPLAY = (100, 300, 1_000)
PARTS = ("trees", "journal", "replay", "units", "runs")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="small trees, few samples; writes under the work directory")
    parser.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")),
                        help="project sizes in files, comma-separated")
    parser.add_argument("--repeat", type=int, help="samples per figure (upper bound)")
    parser.add_argument("--budget", type=float,
                        help="seconds per figure after which sampling stops (>= 1 sample)")
    parser.add_argument("--workdir", type=Path,
                        default=Path(os.environ.get("CAIRN_BENCH_DIR", "/var/tmp")),
                        help="where the loop image and scratch files go ($CAIRN_BENCH_DIR)")
    parser.add_argument("--pool-size", help="size of the sparse loop image")
    parser.add_argument("--skip-machine", action="store_true",
                        help="leave out the figures that boot a test machine")
    parser.add_argument("--only", type=_parts, default=PARTS, metavar="PART[,PART]",
                        help="run only these parts: " + ", ".join(PARTS)
                        + " (units and runs boot a test machine each)")
    parser.add_argument("--doc", type=Path, help="where to write the Markdown report")
    parser.add_argument("--json", type=Path, help="where to write the JSON results")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="only write the Markdown report again from a results file")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown part {', '.join(unknown) or '(none)'}; choose from {', '.join(PARTS)}")
    return parts


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("cairn").setLevel(logging.WARNING)
    if args.render:
        results = Results.model_validate_json(args.render.read_text())
        doc = args.doc or REPO / "docs" / "performance.md"
        doc.write_text(render(results, LOOP_WORKFLOW, _shown(args.render)) + "\n")
        print(f"wrote {doc} from {args.render}")
        return 0
    if os.geteuid() != 0:
        print("./dev bench: run as root (loop devices, Btrfs, systemd-nspawn)",
              file=sys.stderr)
        return 2
    sizes: tuple[int, ...] = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    repeat: int = args.repeat or (3 if args.quick else 7)
    budget: float = args.budget or (5.0 if args.quick else 30.0)
    pool_size: str = args.pool_size or ("2G" if args.quick else "24G")
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-", dir=args.workdir))
    if args.quick:
        doc = args.doc or work.with_name(work.name + "-performance.md")
        json_path = args.json or doc.with_suffix(".json")
    else:
        doc = args.doc or REPO / "docs" / "performance.md"
        json_path = args.json or REPO / "tests" / "bench" / "results" / "performance.json"

    command = "./dev bench" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    started = time.monotonic()
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = [_load()]
    cells: list[Cell] = []
    state_root = work / "root"
    os.environ["CAIRN_ROOT"] = os.fspath(state_root)
    for sub in ("var/lib/cairn/journal", "var/lib/cairn/broker", "var/lib/cairn/runs"):
        (state_root / sub).mkdir(parents=True)
    failures: list[str] = []

    def phase(name: str, body: Callable[[], None]) -> None:
        """Run one part; a failure is reported in the document and the exit status,
        and the other parts still run."""
        try:
            body()
        except Exception as exc:
            log.exception("%s failed", name)
            failures.append(f"{name} failed: {type(exc).__name__}: "
                            + (str(exc).strip().splitlines() or [""])[-1][:300])
        loads.append(_load())

    try:
        with loop_pool(work, pool_size) as pool:
            scratch = pool.root.parent / "bench"
            scratch.mkdir()
            bench = Bench(pool=pool, scratch=scratch, repeat=repeat, budget=budget, cells=cells)
            for n in sizes if "trees" in args.only else ():
                log.info("project of %d files", n)
                phase(f"the {n:,}-file figures", functools.partial(run_size, bench, n))
            for n in sorted({min(sizes), max(sizes)}) if "trees" in args.only else ():

                def profile(n: int = n) -> None:
                    cells.extend(profile_cells(pool, scratch, n))

                phase(f"the {n:,}-file apply profile", profile)
        journal_dir = work / "journal"
        journal_dir.mkdir()
        if "journal" in args.only:
            phase("the journal commit rate", lambda: commit_rate(
                journal_dir, pairs=20 if args.quick else 200, rounds=repeat, cells=cells))
        if "replay" in args.only:
            phase("replay", lambda: replay_figures(
                journal_dir, QUICK_REPLAY if args.quick else REPLAY_SIZES, repeat=repeat,
                budget=budget, cells=cells))
        if not args.skip_machine and "units" in args.only:
            phase("the unit figures", lambda: unit_figures(
                REPO, repeat=max(repeat, 10), cells=cells))
        if not args.skip_machine and "runs" in args.only:
            phase("the whole-run figures", lambda: run_figures(
                REPO, repeat=3 if args.quick else 10, concurrent=8 if args.quick else 32,
                cells=cells))
    finally:
        os.environ.pop("CAIRN_ROOT", None)
        shutil.rmtree(work, ignore_errors=True)

    notes = failures + _notes(cells, repeat, loads, os.cpu_count() or 1, args.skip_machine)
    results = Results(
        command=command, started_at=started_at, duration_s=time.monotonic() - started,
        quick=args.quick, sizes=list(sizes), repeat=repeat, cell_budget_s=budget,
        machine=machine_info(), cells=cells, notes=notes,
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(results.model_dump_json(indent=2) + "\n")
    doc.write_text(render(results, LOOP_WORKFLOW, _shown(json_path)) + "\n")
    print(f"wrote {doc} and {json_path} ({results.duration_s / 60:.1f} min)")
    for failure in failures:
        print(f"./dev bench: {failure}", file=sys.stderr)
    return 1 if failures else 0


def _shown(path: Path) -> str:
    try:
        return os.fspath(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def _notes(cells: list[Cell], repeat: int, loads: list[float], cpus: int,
           skipped_machine: bool) -> list[str]:
    notes: list[str] = []
    busy = max(loads)
    load_text = ", ".join(f"{x:.2f}" for x in loads)
    if busy >= cpus * 0.5:
        notes.append(
            f"The 1-minute load average, sampled before the run and after each part, was "
            f"{load_text} on this {cpus}-CPU machine. It counts the bench's own work (the "
            "last sample follows the concurrent runs) as well as anything else the machine "
            "ran: where it is high, expect noise, most in the p95 column and in the "
            "fsync-bound journal figures. The ratios compare methods timed back to back "
            "on the same tree, so they are steadier than the absolute times.")
    else:
        notes.append(f"1-minute load average sampled during the run: {load_text}.")
    short = sorted({f"{c.figure}/{c.method}" for c in cells
                    if len(c.samples) < repeat and c.figure not in SINGLE_SHOT
                    and not c.method.startswith(PROFILED_PREFIX)})
    if short:
        notes.append("Sampling stopped at the per-figure time budget for: "
                     + "; ".join(short) + ".")
    if skipped_machine:
        notes.append("The figures that need a booted machine (unit start, QUIESCE, whole "
                     "runs, memory) were left out (--skip-machine).")
    return notes


if __name__ == "__main__":
    sys.exit(main())
