"""Smoke run of the benchmark suite (``--quick --skip-machine``): it runs end to end on a
real loop Btrfs, writes a report with every tree, journal and replay figure, and leaves
no mount or loop device behind.

Not collected by default (``testpaths`` leaves out ``tests/bench``); run it with
``.venv/bin/python -m pytest tests/bench`` as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from measure import Cell, Results, machine_info
from verdicts import (
    PROFILED_PREFIX,
    PROFILED_WHOLE,
    SEARCH_ALONE,
    SEND_ALONE,
    TREE_SEARCH_DIFF,
    Verdict,
    verdicts,
)

HERE = Path(__file__).resolve().parent


def _attached_images() -> list[str]:
    found = []
    for entry in Path("/sys/block").glob("loop*"):
        backing = entry / "loop" / "backing_file"
        if backing.exists():
            found.append(backing.read_text().strip())
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for loop devices and Btrfs")
def test_quick_run_writes_every_figure_and_cleans_up(tmp_path: Path) -> None:
    doc, results_json = tmp_path / "performance.md", tmp_path / "performance.json"
    proc = subprocess.run(
        [sys.executable, HERE / "run.py", "--quick", "--skip-machine", "--sizes", "1000",
         "--repeat", "2", "--workdir", tmp_path, "--doc", doc, "--json", results_json],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    results = Results.model_validate_json(results_json.read_text())
    figures = {c.figure for c in results.cells}
    assert figures == {"boundary", "checkpoint", "restore", "changes", "apply", "fork",
                       "replay", "journal"}
    assert all(c.samples and all(s > 0 for s in c.samples) for c in results.cells)
    methods = {c.method for c in results.cells if not c.cairn}
    assert {"shadow git add -A && commit", "cp -a", "git checkout + git clean",
            "git status --porcelain", "full-tree hash walk", "cp -a per lane",
            "raw SQLite 2x(insert+commit)"} <= methods
    assert results.machine.kernel.startswith("Linux ")
    # The kernel's send alone beside each diff, and the profiled apply's phases.
    assert {c.variant for c in results.cells if c.method.startswith(SEND_ALONE)} == {
        "10 changed", "1,000 changed"}
    # The settlement's tree-search diff and the tree search alone, at both change counts.
    for prefix in (TREE_SEARCH_DIFF, SEARCH_ALONE):
        assert {c.variant for c in results.cells if c.method.startswith(prefix)} == {
            "10 changed", "1,000 changed"}
    assert PROFILED_PREFIX + PROFILED_WHOLE in {c.method for c in results.cells}

    text = doc.read_text()
    assert "./dev bench --quick --skip-machine" in text
    for heading in ("## Machine", "## Targets", "### Checkpoint of W",
                    "### Replay to the frontier"):
        assert heading in text
    assert "slower** than Cairn" in text or "faster** than Cairn" in text
    assert "| change detection Q→P of 1,000 changed files faster than git status" in text

    leftovers = [img for img in _attached_images() if img.startswith(os.fspath(tmp_path))]
    assert leftovers == []
    with open("/proc/self/mountinfo") as fh:
        assert os.fspath(tmp_path) not in fh.read()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("cairn-bench-")] == []


def _run_marks(total: float) -> dict[str, float]:
    """One run's milestones, evenly spread over ``total`` seconds from invocation."""
    names = ("invoked", "recorded", "lease", "imported", "agent_started", "agent_finished",
             "committed", "candidate", "applied", "succeeded")
    marks = {name: 1000.0 + total * i / (len(names) - 1) for i, name in enumerate(names)}
    return {**marks, "returned": total / 4}


def test_whole_run_figures_render_with_their_targets() -> None:
    """The booted-machine figures' rows and verdicts, from made-up measurements."""
    from report import render
    from run_figures import concurrent_cells, cpu_cells, launch_cells, memory_cells, start_cells

    sequential = [_run_marks(t) for t in (0.8, 0.9, 1.2)]
    together = {"runs": [_run_marks(t) for t in (10.0, 25.0)], "first_invoked": 1000.0,
                "memory_before": [100 << 20, 50 << 20, 0],
                "memory_peak": [900 << 20, 400 << 20, 700 << 20]}
    memory = {"cairnd": [50 << 20, 50 << 20], "cairnd_busy": [51 << 20, 51 << 20],
              "coordinator": [46 << 20, 82 << 20], "agent": [38 << 20, 38 << 20]}
    cpu = {"coordinator unit": [3.0, 4], "apply unit": [1.0, 2],
           "cairn launch (CLI), getrusage": [2.0, 2],
           "cairn launch (CLI), process accounting": [1.8, 2],
           "the bench script itself": [0.5, 0]}
    cells = [*launch_cells(sequential), *concurrent_cells(together, 2),
             *memory_cells(memory, together, 2), *cpu_cells(cpu, 2),
             *start_cells({"python3 -I, nothing imported": [0.02, 0.03],
                           "coordinator (cairn.coordinator.__main__)": [0.3, 0.4]})]
    results = Results(command="./dev bench --only runs", started_at="now", duration_s=60,
                      quick=False, sizes=[1000], repeat=7, cell_budget_s=30,
                      machine=machine_info(), cells=cells, notes=[])

    text = render(results, "", "performance.json")

    assert "| one-agent run, cairn launch → succeeded: median ≤ 1.0 s | 900.0 ms" in text
    assert "| 2 runs, 2 users: every cairn launch returns in ≤ 2 s (p95) | p95 6.25 s" in text
    assert "| 2 runs, 2 users: all succeeded ≤ 20 s after the first launch | 25.00 s " \
           "| **no** | 5.0 s over (1.2×) |" in text
    for heading in ("### One-agent run: cairn launch → succeeded",
                    "### One-agent runs launched at once by two users",
                    "### CPU time per run, runs launched at once", "### Resident memory",
                    "### Python start of each process a run starts (import only)"):
        assert heading in text
    assert "| Cairn: coordinator unit, all its processes (VmRSS summed) | 82.0 MiB |" in text
    # Per run: coordinator 1.5 s + apply 0.5 s + the launch processes 1.0 s, exactly.
    assert "| Cairn: every process in the machine, per run | 3.00 s |" in text
    assert "| Cairn: of which: coordinator unit, 2.0 processes per run ended | 1.50 s |" in text
    assert "not counted: the bench script itself | 250.0 ms" in text
    assert "| Cairn: coordinator (cairn.coordinator.__main__) | 350.0 ms | 400.0 ms | 2 | " \
           "14.00× of it |" in text
    cpus = results.machine.cpus
    assert (f"At 3.00 s of CPU per run, 2 runs keep this machine's {cpus} CPUs busy for at "
            f"least {2 * 3.0 / cpus:.1f} s; all were done after 25.00 s") in text


def _cell(figure: str, method: str, median: float, *, size: int | None = None,
          variant: str = "", cairn: bool = True) -> Cell:
    return Cell(figure=figure, size=size, variant=variant, method=method, cairn=cairn,
                samples=[median * 0.9, median, median * 1.1])


# The tree-search diff beside git status (12 ms at 1,000 files, 400 ms at 100,000):
# losing at 1,000 only, or winning at both sizes.
SEARCH_LOSES = (0.030, 0.200)
SEARCH_WINS = (0.010, 0.200)


def _tree_cells(fork_32: float, send_alone: float | None, *,
                search: tuple[float, float] | None = None,
                search_alone: float | None = None) -> list[Cell]:
    """Tree figures at 1,000 and 100,000 files: the boundary and QUIESCE at 6 + 8 ms,
    the send-stream diff losing to git status at 1,000 only, an apply profiled; with
    ``search``, tree-search diffs of 1,000 changes at the two sizes (and 4 ms for 10),
    first like the bench adds them."""
    out = [_cell("quiesce", "QUIESCE proof (unit state + cgroup empty)", 0.008)]
    for size, boundary, diff, git in ((1000, 0.005, 0.120, 0.012),
                                      (100_000, 0.006, 0.300, 0.400)):
        changed = "1,000 changed"
        if search is not None:
            out += [
                _cell("changes", TREE_SEARCH_DIFF, search[0 if size == 1000 else 1],
                      size=size, variant=changed),
                _cell("changes", TREE_SEARCH_DIFF, 0.004, size=size, variant="10 changed"),
            ]
        if search_alone is not None:
            out.append(_cell("changes", f"{SEARCH_ALONE} (change_record)",
                             search_alone * (1 if size == 1000 else 2), size=size,
                             variant=changed))
        out += [
            _cell("boundary", "snapshot+materialize+commit", boundary, size=size,
                  variant="10 edits"),
            _cell("checkpoint", "Btrfs snapshot + receipt", 0.004, size=size,
                  variant="10 edits"),
            _cell("changes", "send-stream diff", diff, size=size, variant=changed),
            _cell("changes", "git status --porcelain", git, size=size, variant=changed,
                  cairn=False),
            _cell("changes", "send-stream diff", 0.008, size=size, variant="10 changed"),
            _cell("apply", "three-way apply", 0.4 if size == 1000 else 1.6, size=size,
                  variant=changed),
            _cell("fork", "lane W snapshots", fork_32 if size == 100_000 else 0.1,
                  size=size, variant="32 lanes"),
            _cell("fork", "lane W snapshots", 0.02, size=size, variant="1 lane"),
        ]
        if send_alone is not None:
            out.append(_cell("changes", f"{SEND_ALONE} (--no-data -p Q P to /dev/null)",
                             send_alone * (1 if size == 1000 else 2), size=size,
                             variant=changed))
    for name, seconds in ((PROFILED_WHOLE, 1.7), ("plan, 3 states per path (cumulative)", 0.3),
                          ("syncfs (2 calls)", 0.4), ("rename (900 calls)", 0.2),
                          ("fsync (2 calls)", 0.01)):
        out.append(Cell(figure="apply", size=100_000, variant="1,000 changed",
                        method=PROFILED_PREFIX + name, cairn=True, samples=[seconds]))
    return out


def _unit_cells(full: float) -> list[Cell]:
    return [
        _cell("unit", "transient agent unit over D-Bus, to hello", full),
        _cell("unit", "of which: start job done (exec)", full - 0.004),
        _cell("unit", "same client, bare unit running true, to exit", 0.03),
        _cell("unit", "systemd-run --wait true", 0.032, cairn=False),
        _cell("unit", "same, without private network namespace", full - 0.02),
        _cell("unit", "same, without system call filter", full - 0.001),
    ]


def _results(cells: list[Cell]) -> Results:
    return Results(command="./dev bench", started_at="now", duration_s=60, quick=False,
                   sizes=[1000, 100_000], repeat=7, cell_budget_s=30, machine=machine_info(),
                   cells=cells, notes=[])


def _by_target(results: Results) -> dict[str, Verdict]:
    return {v.target.split(":")[0].split(" ≤")[0]: v for v in verdicts(results)}


CHANGES = "change detection Q→P of 1,000 changed files faster than git status at every size"


def test_issue_18_targets_missed_say_by_how_much_and_why() -> None:
    """Every issue-18 target has a row; a missed one names the cells that explain it."""
    from report import render

    results = _results([*_tree_cells(fork_32=0.3, send_alone=0.05, search=SEARCH_LOSES,
                                     search_alone=0.02), *_unit_cells(0.096)])
    found = _by_target(results)

    both = found["boundary overhead incl. the QUIESCE proof"]
    assert (both.met, both.measured) == (True, "6.0 ms at 100,000 + 8.0 ms = 14.0 ms")
    # Judged by the tree-search diff, the settlement's source, not the send-stream diff.
    changes = found[CHANGES]
    assert changes.met is False
    assert changes.measured == "30.0 ms vs 12.0 ms at 1,000, 200.0 ms vs 400.0 ms at 100,000"
    assert changes.miss == "2.5× git status's time at 1,000 files"
    # Only the size it lost at is explained, with root's tree search alone beside git.
    assert changes.why == ("at 1,000 files the tree search alone takes 20.0 ms vs git "
                           "status 12.0 ms")
    fork = found["fork of 32 lanes at 100,000 files"]
    assert (fork.met, fork.miss) == (False, "150.0 ms over (2.0×)")
    assert fork.why.startswith("100.0 ms at 1,000 files, 300.0 ms at 100,000 (3.0× with")
    apply = found["three-way apply of 1,000 changed files"]
    assert apply.why == ("one apply under cProfile at 100,000 files took 1.70 s: syncfs "
                         "(2 calls) 400.0 ms, plan, 3 states per path (cumulative) 300.0 ms, "
                         "rename (900 calls) 200.0 ms")
    unit = found["sandboxed agent unit, start request → worker hello"]
    assert (unit.met, unit.measured, unit.miss) == (False, "96.0 ms", "46.0 ms over (1.9×)")
    assert unit.why == ("start job done (exec) 92.0 ms; same client, bare unit running true, "
                        "to exit 30.0 ms; systemd-run --wait true 32.0 ms; largest single "
                        "saving: same, without private network namespace (76.0 ms, 20.0 ms "
                        "less)")

    text = render(results, "", "performance.json")
    assert "| target | measured | met | missed by | why (measured) |" in text
    assert "| fork of 32 lanes at 100,000 files ≤ 150 ms | 300.0 ms | **no** | 150.0 ms " \
           "over (2.0×) | 100.0 ms at 1,000 files" in text
    assert f"| {CHANGES} | 30.0 ms vs 12.0 ms at 1,000, 200.0 ms vs 400.0 ms at 100,000 " \
           "| **no** | 2.5× git status's time at 1,000 files | at 1,000 files the tree " \
           "search alone takes 20.0 ms vs git status 12.0 ms |" in text
    # The tree-search diff is the table's Cairn row; git status is set beside both diffs.
    assert "| 1,000 | 1,000 changed | Cairn: send-stream diff | 120.0 ms | 132.0 ms | 3 " \
           "| 4.00× of it |" in text
    assert "| 1,000 | 1,000 changed | git status --porcelain | 12.0 ms | 13.2 ms | 3 | " \
           "**2.5× faster** than Cairn (tree-search diff); **10.0× faster** than Cairn " \
           "(send-stream diff) |" in text
    assert "the `of which, one apply under cProfile` rows" in text
    assert "The `of which: tree search alone` rows time" in text
    assert "The `of which: btrfs send alone` rows time" in text


def test_change_detection_falls_back_to_the_send_stream_in_older_results() -> None:
    """Results without a tree-search cell are judged by the send-stream diff, explained
    by btrfs send alone; a target the tree search meets is met though the send loses."""
    from report import render

    results = _results(_tree_cells(fork_32=0.3, send_alone=0.05))
    changes = _by_target(results)[CHANGES]
    assert changes.met is False
    assert changes.measured == "120.0 ms vs 12.0 ms at 1,000, 300.0 ms vs 400.0 ms at 100,000"
    assert changes.miss == "10.0× git status's time at 1,000 files"
    # Only the size it lost at is explained, with the kernel's send alone beside git.
    assert changes.why == "at 1,000 files btrfs send alone takes 50.0 ms vs git status 12.0 ms"
    text = render(results, "", "performance.json")
    assert "The `of which: btrfs send alone` rows time" in text
    assert "The `of which: tree search alone` rows" not in text

    met = _by_target(_results(_tree_cells(fork_32=0.3, send_alone=0.05, search=SEARCH_WINS,
                                          search_alone=0.005)))[CHANGES]
    assert (met.met, met.miss, met.why) == (True, "", "")
    assert met.measured == "10.0 ms vs 12.0 ms at 1,000, 200.0 ms vs 400.0 ms at 100,000"


def test_issue_18_targets_met_and_older_results_explained_from_what_they_have() -> None:
    """Met targets carry no why; without the send-alone or profile rows the why falls back
    to the cells the run has; a target without its cells has no row."""
    from report import render

    cells = [c for c in _tree_cells(fork_32=0.12, send_alone=None)
             if not c.method.startswith(PROFILED_PREFIX)]
    found = _by_target(_results([*cells, *_unit_cells(0.045)]))

    assert found["fork of 32 lanes at 100,000 files"].met is True
    assert found["fork of 32 lanes at 100,000 files"].why == ""
    assert found["sandboxed agent unit, start request → worker hello"].met is True
    changes = found[CHANGES]
    assert changes.why == ("at 1,000 files 10 changes take 8.0 ms, 1,000 take 120.0 ms: "
                           "113 µs per further change, git status 12.0 ms for the whole tree")
    # The tree-search diff without its search-alone row: its own cost per further change.
    searched = [c for c in _tree_cells(fork_32=0.12, send_alone=0.05, search=SEARCH_LOSES)
                if not c.method.startswith(PROFILED_PREFIX)]
    assert _by_target(_results(searched))[CHANGES].why == (
        "at 1,000 files 10 changes take 4.0 ms, 1,000 take 30.0 ms: 26 µs per further "
        "change, git status 12.0 ms for the whole tree")
    assert found["three-way apply of 1,000 changed files"].why == (
        "the same 1,000 changes cost 400.0 ms at 1,000 files and 1.60 s at 100,000 (4.0× "
        "with the project)")

    no_quiesce = [c for c in cells if c.figure != "quiesce"]
    assert "boundary overhead incl. the QUIESCE proof" not in _by_target(_results(no_quiesce))
    text = render(_results(cells), "", "performance.json")
    assert "the profiled applies in the Notes below" in text
    assert "btrfs send alone" not in text
    assert "The `of which: tree search alone` rows" not in text


def test_cli_figures_run_every_command_against_the_stand_in_cairnd() -> None:
    """tests/bench/cli_figures.py: every command exits 0 (a launch attests the stand-in's
    description) and each gets a CPU figure."""
    proc = subprocess.run([sys.executable, HERE / "cli_figures.py", "1"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout)
    assert set(figures["cpu_median_s"]) == {
        "cairn --version", "cairn --help", "cairn list", "cairn show RUN", "cairn launch (queued)"
    }
    assert all(cpu > 0 for cpu in figures["cpu_min_s"].values())
