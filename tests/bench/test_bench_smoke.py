"""Smoke run of the benchmark suite (``--quick --skip-machine``): it runs end to end on a
real loop Btrfs, writes a report with every tree, journal and replay figure, and leaves
no mount or loop device behind.

Not collected by default (``testpaths`` leaves out ``tests/bench``); run it with
``.venv/bin/python -m pytest tests/bench`` as root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from measure import Results, machine_info

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
        capture_output=True, text=True, timeout=900,
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

    text = doc.read_text()
    assert "./dev bench --quick --skip-machine" in text
    for heading in ("## Machine", "## Targets", "### Checkpoint of W",
                    "### Replay to the frontier"):
        assert heading in text
    assert "slower** than Cairn" in text or "faster** than Cairn" in text

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
