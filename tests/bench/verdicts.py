"""The Targets table of docs/performance.md: each acceptance target checked against one
:class:`measure.Results`, and for a missed one by how much and why, from the same run's
cells. A target whose cells the run does not have (``--only runs``, a quick run) is left
out. Every number comes from the results; nothing here is typed in but the targets."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from measure import Cell, Results, fmt_seconds

CHANGED = "1,000 changed"
# The rows of one profiled apply (``apply_figures.profile_cells``).
PROFILED_PREFIX = "of which, one apply under cProfile: "
PROFILED_WHOLE = "the whole apply (slower than unprofiled)"
# Cairn's change detection (``storage_figures``): the tree search's record the settlement
# reads, and ``btrfs send``'s stream, its fallback when P does not descend from Q.
TREE_SEARCH_DIFF = "tree-search diff"
SEND_DIFF = "send-stream diff"
# The kernel's part of the send-stream diff, timed by itself.
SEND_ALONE = "of which: btrfs send alone"
# Root's part of the tree-search diff (``cairn.treesearch.change_record``), timed by itself.
SEARCH_ALONE = "of which: tree search alone"


@dataclass
class Verdict:
    target: str
    measured: str
    met: bool | None
    miss: str
    why: str = ""


def find(cells: Iterable[Cell], figure: str, method_prefix: str = "", *,
         size: int | None = None, variant: str | None = None,
         cairn: bool | None = True) -> Cell | None:
    """The first cell of ``figure`` at ``size`` whose method starts with the prefix."""
    for c in cells:
        if (c.figure == figure and c.size == size and c.method.startswith(method_prefix)
                and (cairn is None or c.cairn == cairn)
                and (variant is None or c.variant == variant)):
            return c
    return None


def part(cell: Cell) -> bool:
    """A breakdown row (``of which: …``) rather than a figure of its own."""
    return cell.method.startswith("of which")


def _over(value: float, limit: float) -> str:
    return f"{fmt_seconds(value - limit)} over ({value / limit:.1f}×)"


def _named(c: Cell) -> str:
    return f"{c.method.removeprefix('of which: ')} {fmt_seconds(c.median)}"


def _largest_parts(cells: Iterable[Cell], figure: str, count: int) -> list[Cell]:
    parts = [c for c in cells if c.figure == figure and part(c) and c.unit == "s"]
    return sorted(parts, key=lambda c: -c.median)[:count]


def verdicts(results: Results) -> list[Verdict]:
    """The issues' acceptance targets, checked against this run."""
    cells = results.cells
    out = _tree_verdicts(results)
    out += _run_verdicts(results)
    unit = _agent_start(cells)
    out += [unit] if unit else []
    out += _journal_verdicts(cells)
    return out


def _tree_verdicts(results: Results) -> list[Verdict]:
    cells = results.cells
    out: list[Verdict] = []
    small, large = min(results.sizes), max(results.sizes)
    for figure, label in (("boundary", "boundary overhead"), ("checkpoint", "checkpoint"),
                          ("restore", "restore")):
        a, b = find(cells, figure, size=small), find(cells, figure, size=large)
        if a is None or b is None:
            continue
        ratio = b.median / a.median
        met = ratio <= 2.0
        by_size = [c for s in results.sizes if (c := find(cells, figure, size=s))]
        out.append(Verdict(
            f"{label} flat: median at {large:,} files ≤ 2× at {small:,}",
            f"{fmt_seconds(a.median)} → {fmt_seconds(b.median)} ({ratio:.2f}×)", met,
            "" if met else f"{ratio / 2.0:.2f}× over the limit",
            "" if met else "median by size: " + ", ".join(
                f"{fmt_seconds(c.median)} at {c.size:,}" for c in by_size)))
    spare = find(cells, "restore", size=large, variant="10 edits, hot spare")
    if spare is not None:
        met = spare.median <= 0.002
        plain = find(cells, "restore", "new W generation", size=large)
        out.append(Verdict(
            f"restore from the hot spare: median ≤ 2 ms at {large:,} files",
            fmt_seconds(spare.median), met,
            "" if met else f"{spare.median / 0.002:.1f}× over",
            "" if met or plain is None else
            f"a new W generation without the spare takes {fmt_seconds(plain.median)}"))
    for verdict in (_boundary_and_quiesce(results), _apply(results), _changes(results),
                    _fork(results)):
        out += [verdict] if verdict else []
    return out


def _boundary_and_quiesce(results: Results) -> Verdict | None:
    cells = results.cells
    boundaries = [c for s in results.sizes if (c := find(cells, "boundary", size=s))]
    quiesce = find(cells, "quiesce")
    if not boundaries or quiesce is None:
        return None
    worst = max(boundaries, key=lambda c: c.median)
    total = worst.median + quiesce.median
    met = total <= 0.015
    why = ""
    if not met:
        snapshot = find(cells, "checkpoint", "Btrfs snapshot", size=worst.size,
                        variant="10 edits")
        why = (f"boundary {fmt_seconds(worst.median)} at {worst.size:,} files (its slowest "
               f"size) + QUIESCE {fmt_seconds(quiesce.median)}")
        if snapshot is not None:
            rest = worst.median - snapshot.median
            why += (f"; the snapshot alone (checkpoint figure) takes "
                    f"{fmt_seconds(snapshot.median)} at that size, the rest of the boundary "
                    f"(journal, receipts, materialize) {fmt_seconds(rest)}")
    return Verdict(
        "boundary overhead incl. the QUIESCE proof ≤ 15 ms together (slowest size)",
        f"{fmt_seconds(worst.median)} at {worst.size:,} + {fmt_seconds(quiesce.median)} = "
        f"{fmt_seconds(total)}", met, "" if met else _over(total, 0.015), why)


def _apply(results: Results) -> Verdict | None:
    applies = sorted((c for c in results.cells if c.figure == "apply" and c.variant == CHANGED
                      and not part(c)), key=lambda c: c.size or 0)
    if not applies:
        return None
    worst = max(applies, key=lambda c: c.median)
    met = worst.median <= 0.3
    return Verdict(
        "three-way apply of 1,000 changed files ≤ 300 ms at every size",
        ", ".join(f"{fmt_seconds(c.median)} at {c.size:,}" for c in applies), met,
        "" if met else f"{worst.median / 0.3:.1f}× over at {worst.size:,} files",
        "" if met else _apply_why(results.cells, applies))


def _apply_why(cells: list[Cell], applies: list[Cell]) -> str:
    """The profiled apply's main costs at the largest size it was profiled at, else how
    the apply grows with the project for the same 1,000 changes."""
    profiled = {c.size: c for c in cells if c.figure == "apply"
                and c.method == PROFILED_PREFIX + PROFILED_WHOLE}
    if profiled:
        size = max(s or 0 for s in profiled)
        phases = [c for c in cells if c.figure == "apply" and c.size == size
                  and c.method.startswith(PROFILED_PREFIX) and c is not profiled[size]]
        top = sorted(phases, key=lambda c: -c.median)[:3]
        return (f"one apply under cProfile at {size:,} files took "
                f"{fmt_seconds(profiled[size].median)}: " + ", ".join(
                    f"{c.method.removeprefix(PROFILED_PREFIX)} {fmt_seconds(c.median)}"
                    for c in top))
    first, last = applies[0], applies[-1]
    why = (f"the same 1,000 changes cost {fmt_seconds(first.median)} at {first.size:,} files "
           f"and {fmt_seconds(last.median)} at {last.size:,} "
           f"({last.median / first.median:.1f}× with the project)")
    few = find(cells, "apply", size=last.size, variant="10 changed")
    if few is not None:
        why += f"; 10 changes take {fmt_seconds(few.median)} at {last.size:,}"
    return why


def _changes(results: Results) -> Verdict | None:
    """Judged by the tree-search diff, the settlement's source; by the send-stream diff in
    results made before the tree search was measured."""
    searched = any(c.figure == "changes" and c.cairn and c.variant == CHANGED
                   and c.method.startswith(TREE_SEARCH_DIFF) for c in results.cells)
    method = TREE_SEARCH_DIFF if searched else SEND_DIFF
    pairs = []
    for size in results.sizes:
        diff = find(results.cells, "changes", method, size=size, variant=CHANGED)
        git = find(results.cells, "changes", "git status", size=size, variant=CHANGED,
                   cairn=False)
        if diff and git:
            pairs.append((size, diff, git))
    if not pairs:
        return None
    lost = [(size, diff, git) for size, diff, git in pairs if diff.median >= git.median]
    worst = max(pairs, key=lambda p: p[1].median / p[2].median)
    return Verdict(
        "change detection Q→P of 1,000 changed files faster than git status at every size",
        ", ".join(f"{fmt_seconds(d.median)} vs {fmt_seconds(g.median)} at {s:,}"
                  for s, d, g in pairs), not lost,
        "" if not lost else f"{worst[1].median / worst[2].median:.1f}× git status's time "
        f"at {worst[0]:,} files",
        "; ".join(_changes_why(results.cells, *p) for p in lost))


def _changes_why(cells: list[Cell], size: int, diff: Cell, git: Cell) -> str:
    """How long the kernel's part of ``diff`` alone takes beside git status (the tree
    search for the tree-search diff, ``btrfs send`` for the send-stream diff); in a run
    without that row, what each further change costs."""
    search = diff.method.startswith(TREE_SEARCH_DIFF)
    alone = find(cells, "changes", SEARCH_ALONE if search else SEND_ALONE, size=size,
                 variant=CHANGED)
    if alone is not None:
        what = "the tree search" if search else "btrfs send"
        return (f"at {size:,} files {what} alone takes {fmt_seconds(alone.median)} "
                f"vs git status {fmt_seconds(git.median)}")
    few = find(cells, "changes", TREE_SEARCH_DIFF if search else SEND_DIFF, size=size,
               variant="10 changed")
    if few is None:
        return ""
    return (f"at {size:,} files 10 changes take {fmt_seconds(few.median)}, 1,000 take "
            f"{fmt_seconds(diff.median)}: {fmt_seconds((diff.median - few.median) / 990)} "
            f"per further change, git status {fmt_seconds(git.median)} for the whole tree")


def _fork(results: Results) -> Verdict | None:
    def lanes32(size: int) -> Cell | None:
        return find(results.cells, "fork", "lane W snapshots", size=size, variant="32 lanes")

    top = lanes32(100_000)
    if top is None:
        return None
    met = top.median <= 0.15
    why = ""
    if not met:
        small = min(results.sizes)
        low, one = lanes32(small), find(results.cells, "fork", "lane W snapshots",
                                        size=100_000, variant="1 lane")
        parts = []
        if low is not None and small != 100_000:
            parts.append(f"{fmt_seconds(low.median)} at {small:,} files, "
                         f"{fmt_seconds(top.median)} at 100,000 "
                         f"({top.median / low.median:.1f}× with the project)")
        if one is not None:
            parts.append(f"one lane takes {fmt_seconds(one.median)} at 100,000, "
                         f"about {fmt_seconds((top.median - one.median) / 31)} per further "
                         "lane")
        why = "; ".join(parts)
    return Verdict("fork of 32 lanes at 100,000 files ≤ 150 ms", fmt_seconds(top.median),
                   met, "" if met else _over(top.median, 0.15), why)


def _run_verdicts(results: Results) -> list[Verdict]:
    """Issue 18's targets for whole runs in the booted machine."""
    cells = results.cells
    out: list[Verdict] = []
    single = find(cells, "launch", "cairn launch → run succeeded")
    if single is not None:
        met = single.median <= 1.0
        out.append(Verdict(
            "one-agent run, cairn launch → succeeded: median ≤ 1.0 s",
            f"{fmt_seconds(single.median)} (p95 {fmt_seconds(single.p95)}, "
            f"n={len(single.samples)})", met,
            "" if met else f"{single.median - 1.0:.2f} s over ({single.median:.1f}×)",
            "" if met else _one_run_why(cells)))
    returns = find(cells, "concurrent", "cairn launch returns")
    floor = cpu_floor(results)
    if returns is not None:
        met = returns.p95 <= 2.0
        why = "; ".join([*(_named(c) for c in _largest_parts(cells, "concurrent", 2)),
                         *([floor] if floor else [])])
        out.append(Verdict(
            f"{returns.variant}: every cairn launch returns in ≤ 2 s (p95)",
            f"p95 {fmt_seconds(returns.p95)}, median {fmt_seconds(returns.median)}", met,
            "" if met else f"{returns.p95 - 2.0:.2f} s over ({returns.p95 / 2.0:.1f}×)",
            "" if met else f"slowest phases (median): {why}"))
    everything = find(cells, "concurrent", "first launch → all")
    if everything is not None:
        met = everything.median <= 20.0
        top = "; ".join(_cpu_name(c) for c in _largest_parts(cells, "cpu", 3))
        why = "; ".join(x for x in (floor, f"largest CPU per run: {top}" if top else "") if x)
        out.append(Verdict(
            f"{everything.variant}: all succeeded ≤ 20 s after the first launch",
            fmt_seconds(everything.median), met,
            "" if met else f"{everything.median - 20.0:.1f} s over "
            f"({everything.median / 20.0:.1f}×)", "" if met else why))
    return out


def _one_run_why(cells: list[Cell]) -> str:
    phases = "; ".join(_named(c) for c in _largest_parts(cells, "launch", 3))
    why = f"slowest phases (median): {phases}" if phases else ""
    starts = [c for c in cells if c.figure == "start"]
    bare = next((c for c in starts if c.method.startswith("python3 ")), None)
    processes = [c for c in starts if c is not bare]
    if processes:
        low, high = (min(processes, key=lambda c: c.median),
                     max(processes, key=lambda c: c.median))
        why += (f"; each of the {len(processes)} Python processes a run starts spends "
                f"{fmt_seconds(low.median)}–{fmt_seconds(high.median)} importing alone "
                f"(slowest: {high.method})")
        if bare is not None:
            why += f", Python itself {fmt_seconds(bare.median)}"
    return why.removeprefix("; ")


def _cpu_name(c: Cell) -> str:
    unit = re.sub(r"(, getrusage)?, [\d.]+ processes per run ended$", "",
                  c.method.removeprefix("of which: "))
    return f"{unit} {fmt_seconds(c.median)}"


def cpu_floor(results: Results) -> str:
    """The least wall time the concurrent batch needs for its CPU time on this machine."""
    per_run = find(results.cells, "cpu", "every process")
    everything = find(results.cells, "concurrent", "first launch → all")
    if per_run is None or everything is None:
        return ""
    runs = int(everything.variant.split()[0])
    cpus = results.machine.cpus
    return (f"CPU floor: {fmt_seconds(per_run.median)} of CPU per run × {runs} runs / "
            f"{cpus} CPUs = {runs * per_run.median / cpus:.1f} s (the target is 20 s; "
            f"a run may use {fmt_seconds(20 * cpus / runs)} here)")


def _agent_start(cells: list[Cell]) -> Verdict | None:
    full = find(cells, "unit", "transient agent unit over D-Bus, to hello")
    if full is None:
        return None
    met = full.median <= 0.05
    why = []
    for prefix, cairn in (("of which: start job done", True), ("same client, bare unit", True),
                          ("systemd-run --wait true", False)):
        c = find(cells, "unit", prefix, cairn=cairn)
        if c is not None:
            why.append(_named(c))
    ablations = [c for c in cells if c.figure == "unit" and c.method.startswith("same, without")]
    if ablations:
        best = min(ablations, key=lambda c: c.median)
        saving = full.median - best.median
        why.append(f"largest single saving: {best.method} ({fmt_seconds(best.median)}, "
                   + (f"{fmt_seconds(saving)} less)" if saving > 0 else "no faster)"))
    return Verdict("sandboxed agent unit, start request → worker hello: median ≤ 50 ms",
                   fmt_seconds(full.median), met, "" if met else _over(full.median, 0.05),
                   "" if met else "; ".join(why))


def _journal_verdicts(cells: list[Cell]) -> list[Verdict]:
    out: list[Verdict] = []
    cairn = next((c for c in cells if c.figure == "journal" and c.cairn), None)
    raw = next((c for c in cells if c.figure == "journal" and not c.cairn), None)
    if cairn and raw:
        share = cairn.median / raw.median
        met = share >= 0.5
        out.append(Verdict(
            "journal ≥ ½ of raw SQLite commit rate",
            f"{cairn.median:,.0f}/s vs {raw.median:,.0f}/s ({share:.2f})", met,
            "" if met else f"{0.5 / share:.2f}× short",
            "" if met else f"the journal adds {fmt_seconds(1 / cairn.median - 1 / raw.median)}"
            " per settle+commit pair to raw SQLite's"))
    totals = {_ops(c): c for c in cells if c.figure == "replay" and not part(c)}
    starts = {_ops(c): c for c in cells if c.figure == "replay" and part(c)}
    if totals:
        n_top = max(totals)
        top = totals[n_top]
        if n_top >= 10_000:
            met = top.median <= 1.0
            start = starts.get(n_top)
            out.append(Verdict(
                f"replay of {n_top:,} committed operations ≤ 1 s", fmt_seconds(top.median),
                met, "" if met else f"{top.median - 1.0:.2f} s over ({top.median:.2f}×)",
                "" if met or start is None else
                f"the worker's start to its first call {fmt_seconds(start.median)}, "
                f"the {n_top:,} operations {fmt_seconds(top.median - start.median)}"))
        per_op = {n: (totals[n].median - starts[n].median) / n for n in totals if n in starts}
        if len(per_op) >= 2:
            high_n = max(per_op)
            low_n = max(k for k in per_op if k != high_n)
            ratio = per_op[high_n] / per_op[low_n]
            met = ratio <= 2.0
            out.append(Verdict(
                f"replay linear: cost per operation (after the worker's start) at {high_n:,} "
                f"≤ 2× at {low_n:,}",
                f"{per_op[low_n] * 1e6:.0f} µs/op at {low_n:,}, "
                f"{per_op[high_n] * 1e6:.0f} µs/op at {high_n:,} ({ratio:.2f}×)", met,
                "" if met else f"{ratio / 2.0:.2f}× over the limit",
                "" if met else "per operation by run length: " + ", ".join(
                    f"{per_op[n] * 1e6:.0f} µs at {n:,}" for n in sorted(per_op))))
    return out


def _ops(cell: Cell) -> int:
    return int(cell.variant.split()[0].replace(",", ""))
