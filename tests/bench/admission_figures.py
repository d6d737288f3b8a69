"""Admission under load, in a booted test machine: how long ``cairn launch`` takes to
return when many launches arrive at once and most of them are queued, and how long until
every run has ended. The goal: each ``cairn launch`` returns in under a second.

    python3 tests/bench/admission_figures.py DEB [LAUNCHES] [LIMIT] [AT_ONCE]

Launches builtin:implement with a scripted agent that finishes at once, alternately as
alice and bob, ``AT_ONCE`` ``cairn launch`` processes at a time, with ``max_running_runs
= LIMIT``; prints one JSON line of figures. Before that, the same number of ``cairn
--version`` processes, as many at a time: the CLI's own start with nothing else of cairn
running, the floor under any launch's time on the machine. The system test
``tests/system/test_launch_admission.py`` asserts the limit and that every run succeeds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

GOAL_SECONDS = 1.0


def figures(deb: Path, launches: int, limit: int, at_once: int) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, os.fspath(repo / "tests" / "system"))
    from machine import Machine  # the system tier's harness
    from test_launch_admission import launch, script, wait_all_ended

    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/etc/cairn/admission.toml"],
                     input=f"max_running_runs = {limit}\n".encode())
        agents = {user: script(machine, user) for user in ("alice", "bob")}
        users = ["alice", "bob"] * (launches // 2)
        with ThreadPoolExecutor(at_once) as pool:
            started = list(pool.map(lambda u: timed_version(machine, u), users))
        began = time.monotonic()
        with ThreadPoolExecutor(at_once) as pool:
            launched = list(pool.map(lambda u: launch(machine, u, agents[u]), users))
        returned = time.monotonic() - began
        states = wait_all_ended(machine, [r for r, _t, _s in launched], timeout=3600)
        ended = time.monotonic() - began
    took = sorted(t for _r, t, _s in launched)
    floor = sorted(started)
    return {
        "launches": launches,
        "limit": limit,
        "at_once": at_once,
        "queued": sum("queued" in said for _r, _t, said in launched),
        "launch_median_s": round(took[len(took) // 2], 3),
        "launch_p90_s": round(took[int(len(took) * 0.9)], 3),
        "launch_max_s": round(took[-1], 3),
        "under_goal": sum(t < GOAL_SECONDS for t in took),
        "version_median_s": round(floor[len(floor) // 2], 3),
        "version_max_s": round(floor[-1], 3),
        "all_returned_s": round(returned, 1),
        "all_ended_s": round(ended, 1),
        "succeeded": sum(state == "succeeded" for state in states.values()),
    }


def timed_version(machine: Any, user: str) -> float:
    """Seconds ``cairn --version`` takes as ``user``."""
    began = time.monotonic()
    machine.exec(["cairn", "--version"], user=user)
    return time.monotonic() - began


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    numbers = [int(a) for a in args[1:]] + [64, 8, 16][len(args) - 1:]
    print(json.dumps(figures(Path(args[0]), *numbers[:3])))
