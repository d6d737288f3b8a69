"""Timing, statistics and the result records the benchmark suite writes.

Every figure is a list of samples (seconds, operations per second for rates, or bytes of
memory). A cell
is sampled up to ``repeat`` times, and fewer when its wall-clock budget (setup included)
runs out after at least one sample, so a 100,000-file ``cp -a`` of 32 lanes cannot eat
the whole run; the sample count is recorded and printed with every figure.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cairn import proc

Unit = Literal["s", "per_s", "bytes"]


class Cell(BaseModel):
    """One measured figure: what was timed (``method``) for which ``figure``, at which
    project ``size`` (files) and ``variant`` (e.g. ``10 changed``)."""

    model_config = ConfigDict(extra="forbid")

    figure: str
    size: int | None
    variant: str
    method: str
    cairn: bool
    unit: Unit = "s"
    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p95(self) -> float:
        """Nearest-rank 95th percentile; for rates the 5th (95 % of samples are at least
        this fast)."""
        ordered = sorted(self.samples, reverse=self.unit == "per_s")
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def fmt_seconds(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


class MachineInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hostname_hash: str
    kernel: str
    os_release: str
    cpu: str
    cpus: int
    memory_gib: float
    python: str
    btrfs_progs: str
    git: str
    coreutils: str
    sqlite: str


class Results(BaseModel):
    """The machine-readable output (``performance.json``)."""

    model_config = ConfigDict(extra="forbid")

    command: str
    started_at: str
    duration_s: float
    quick: bool
    sizes: list[int]
    repeat: int
    cell_budget_s: float
    machine: MachineInfo
    cells: list[Cell]
    notes: list[str]


def collect(run_once: Callable[[], float], *, repeat: int, budget: float) -> list[float]:
    """Call ``run_once`` (which does its own untimed setup and returns the timed part)
    until ``repeat`` samples exist or, after the first, ``budget`` seconds have passed."""
    samples: list[float] = []
    started = time.monotonic()
    while len(samples) < repeat:
        samples.append(run_once())
        if time.monotonic() - started > budget:
            break
    return samples


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.elapsed`` (seconds, monotonic clock)."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self._start = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self._start


def _first_line(argv: list[str]) -> str:
    try:
        out = proc.run(argv, check=False, timeout=30)
    except OSError:
        return "unavailable"
    text = (out.stdout or b"").decode(errors="replace").strip()
    return text.splitlines()[0] if text else "unavailable"


def machine_info() -> MachineInfo:
    """Kernel, CPU, memory and tool versions of this host (no host name: only a hash)."""
    import hashlib
    import sqlite3
    import sys

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    os_release = "unknown"
    release = Path("/etc/os-release")
    if release.exists():
        for line in release.read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_release = line.split("=", 1)[1].strip('"')
    return MachineInfo(
        hostname_hash=hashlib.sha256(platform.node().encode()).hexdigest()[:12],
        kernel=f"{platform.system()} {platform.release()} {platform.machine()}",
        os_release=os_release,
        cpu=cpu,
        cpus=os.cpu_count() or 0,
        memory_gib=round(mem_kib / (1 << 20), 1),
        python=sys.version.split()[0],
        btrfs_progs=_first_line(["btrfs", "--version"]),
        git=_first_line(["git", "--version"]),
        coreutils=_first_line(["cp", "--version"]),
        sqlite=sqlite3.sqlite_version,
    )
