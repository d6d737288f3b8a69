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
from measure import Results

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
