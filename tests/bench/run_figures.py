"""Whole runs inside a booted test machine (systemd 257, the package installed, a loop
Btrfs pool): what a person waits for and what a host holds.

Everything is timed by one script inside the machine (``INSIDE``), on the machine's
clock, so the journal's timestamps and the launch times compare directly:

- ``launch``: one scripted agent appending one line to a tiny project owned by alice,
  launched with ``cairn launch`` as alice, one run after another (one untimed warm-up
  first). Per run: the time ``cairn launch`` takes to return, and from invoking it until
  the journal records ``run-succeeded``, broken into phases by the journal's own
  timestamps (events and broker receipts).
- ``concurrent``: 32 such runs, 16 by alice and 16 by bob, each on its own project,
  launched at once (32 ``cairn launch`` processes started together).
- ``memory``: resident memory (``VmRSS``) of cairnd at rest, and of the coordinator's and
  the agent's unit while a scripted agent sleeps; the summed resident memory of every
  process in the machine and the host's used memory at the peak of the 32 runs.

The script reads the journal database read-only as root to learn when a run has ended
(a poll every 10 ms, no ``cairn`` process per poll) and to read its timestamps.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from measure import Cell
from unit_figures import package

log = logging.getLogger(__name__)

INSIDE = r'''
import grp, json, os, pwd, sqlite3, subprocess, sys, threading, time

repeat, concurrent = int(sys.argv[1]), int(sys.argv[2])
DB = "file:/var/lib/cairn/journal/journal.db?mode=ro"
TERMINAL = ("succeeded", "failed", "cancelled")
FAST = {"steps": [{"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"}],
        "output": {"summary": "appended"}, "handoff": "Appended one line."}
SLOW = {**FAST, "steps": [{"action": "sleep", "seconds": 5}, *FAST["steps"]]}


def as_user(user, path, text):
    pw = pwd.getpwnam(user)
    with open(path, "w") as fh:
        fh.write(text)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def project(user, name):
    pw = pwd.getpwnam(user)
    root = f"{pw.pw_dir}/{name}"
    os.makedirs(root, exist_ok=True)
    os.chown(root, pw.pw_uid, pw.pw_gid)
    as_user(user, f"{root}/CHANGELOG.md", "# Changelog\n")
    return root


for user in ("alice", "bob"):
    home = pwd.getpwnam(user).pw_dir
    as_user(user, f"{home}/fast.json", json.dumps(FAST))
    as_user(user, f"{home}/slow.json", json.dumps(SLOW))


def launch(user, root, script):
    """Run ``cairn launch`` as ``user``; (run id, wall time invoked, seconds to return)."""
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
           "PATH": "/usr/local/bin:/usr/bin:/bin"}
    argv = ["cairn", "launch", "builtin:implement", "--project", root,
            "--args", json.dumps({"objective": "one line"}),
            "--scripted", f"builtin:implementer={pw.pw_dir}/{script}.json"]
    invoked, t0 = time.time(), time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=pw.pw_dir, user=pw.pw_uid, group=pw.pw_gid,
                          extra_groups=os.getgrouplist(user, pw.pw_gid),
                          capture_output=True, timeout=300)
    returned = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"cairn launch as {user} failed: {done.stderr.decode()[-2000:]}")
    return done.stdout.decode().split()[-1], invoked, returned


def wait_ended(runs, timeout):
    db = sqlite3.connect(DB, uri=True)
    deadline = time.monotonic() + timeout
    while True:
        marks = ",".join("?" * len(runs))
        states = dict(db.execute(
            f"SELECT run_id, state FROM runs WHERE run_id IN ({marks})", runs).fetchall())
        if all(states.get(r) in TERMINAL for r in runs):
            db.close()
            bad = {r: s for r, s in states.items() if s != "succeeded"}
            if bad:
                raise SystemExit(f"runs did not succeed: {bad}")
            return
        if time.monotonic() > deadline:
            left = {r: states.get(r) for r in runs if states.get(r) not in TERMINAL}
            raise SystemExit(f"runs still not done after {timeout} s: {left}")
        time.sleep(0.01)


def marks(run_id):
    """The run's milestones on the machine's wall clock, from the journal."""
    db = sqlite3.connect(DB, uri=True)
    events, receipts = {}, {}
    for name, at in db.execute(
            "SELECT event, at FROM events WHERE run_id=? ORDER BY cursor", (run_id,)):
        events.setdefault(name, at)
    for intent, at in db.execute("SELECT intent_id, at FROM receipts WHERE run_id=?",
                                 (run_id,)):
        receipts[intent] = at
    db.close()
    return {
        "recorded": events["run-created"],
        "lease": events["lease-acquired"],
        "imported": receipts["create-w.root.1"],
        "agent_started": receipts["start-agent.root-1.1"],
        "agent_finished": events["op-finished"],
        "committed": events["op-committed"],
        "candidate": receipts["settle-candidate"],
        "applied": receipts["start-apply.1"],
        "succeeded": events["run-succeeded"],
    }


def sequential():
    root = project("alice", "tiny")
    wait_ended([launch("alice", root, "fast")[0]], 120)  # warm-up, untimed
    out = []
    for _ in range(repeat):
        run_id, invoked, returned = launch("alice", root, "fast")
        wait_ended([run_id], 120)
        out.append({"invoked": invoked, "returned": returned, **marks(run_id)})
    return out


def systemd_prop(unit, prop):
    return subprocess.run(["systemctl", "show", "-p", prop, "--value", unit],
                          capture_output=True, text=True, check=True).stdout.strip()


def status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def unit_rss(unit):
    """(main process VmRSS, VmRSS summed over the unit's processes), in bytes."""
    main = int(systemd_prop(unit, "MainPID") or 0)
    cgroup = systemd_prop(unit, "ControlGroup")
    pids = [main]
    try:
        with open(f"/sys/fs/cgroup/systemd{cgroup}/cgroup.procs") as fh:
            pids = [int(p) for p in fh.read().split()]
    except OSError:
        pass
    return status_kib(main, "VmRSS") * 1024, sum(status_kib(p, "VmRSS") for p in pids) * 1024


def at_rest_and_waiting():
    rest = unit_rss("cairn.service")
    root = project("alice", "sleeper")
    run_id, _, _ = launch("alice", root, "slow")
    agent = f"cairn-agent-{run_id}-root-1-1.service"
    deadline = time.monotonic() + 60
    while systemd_prop(agent, "ActiveState") != "active":
        if time.monotonic() > deadline:
            raise SystemExit(f"{agent} never became active")
        time.sleep(0.05)
    time.sleep(2)  # the worker has its instruction and the scripted agent sleeps
    coordinator = unit_rss(f"cairn-coordinator@{run_id}.service")
    worker = unit_rss(agent)
    busy_cairnd = unit_rss("cairn.service")
    wait_ended([run_id], 120)
    return {"cairnd": rest, "coordinator": coordinator, "agent": worker,
            "cairnd_busy": busy_cairnd}


def memory_now():
    rss = anon = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            rss += status_kib(entry, "VmRSS")
            anon += status_kib(entry, "RssAnon")
    info = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return rss * 1024, anon * 1024, (info["MemTotal"] - info["MemAvailable"]) * 1024


def together():
    jobs = [(user, project(user, f"p{i}")) for i in range(concurrent // 2)
            for user in ("alice", "bob")]
    results = [None] * len(jobs)
    start = threading.Barrier(len(jobs) + 1)

    def one(i, user, root):
        start.wait()
        results[i] = launch(user, root, "fast")

    threads = [threading.Thread(target=one, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    before = memory_now()
    peak = list(before)
    stop = threading.Event()

    def sample():
        while not stop.wait(0.25):
            now = memory_now()
            for k in range(3):
                peak[k] = max(peak[k], now[k])

    sampler = threading.Thread(target=sample)
    sampler.start()
    start.wait()
    try:
        for t in threads:
            t.join(300)
        if any(r is None for r in results):
            raise SystemExit("a concurrent cairn launch did not return")
        wait_ended([r[0] for r in results], 300)
    finally:
        stop.set()
        sampler.join()
    first = min(r[1] for r in results)
    runs = []
    for run_id, invoked, returned in results:
        runs.append({"invoked": invoked, "returned": returned, **marks(run_id)})
    return {"runs": runs, "first_invoked": first, "memory_before": before, "memory_peak": peak}


out = {"sequential": sequential(), "memory": at_rest_and_waiting()}
out["concurrent"] = together()
print(json.dumps(out))
'''

# Figures of one sample by design (one batch of concurrent runs, one reading of memory).
SINGLE_SHOT = ("concurrent", "memory")

# (label, start mark, end mark) for each phase of a run, in the order they happen.
PHASES = (
    ("cairn launch until the run is recorded (CLI start, cairnd's review)", "invoked",
     "recorded"),
    ("until the coordinator holds the lease (broker, coordinator unit start)", "recorded",
     "lease"),
    ("until Q and W exist (prepare-q with the import unit, create-w)", "lease", "imported"),
    ("until the agent unit has started (control worker, start-agent)", "imported",
     "agent_started"),
    ("until the agent finished (worker start, the scripted agent)", "agent_started",
     "agent_finished"),
    ("until the boundary is committed (QUIESCE, checkpoint, commit)", "agent_finished",
     "committed"),
    ("until the candidate is built (freeze-proposal, candidate unit)", "committed",
     "candidate"),
    ("until the apply is done (apply unit)", "candidate", "applied"),
    ("until the run is succeeded", "applied", "succeeded"),
)


def _each(runs: list[dict[str, float]], start: str, end: str) -> list[float]:
    return [r[end] - r[start] for r in runs]


def launch_cells(runs: list[dict[str, float]]) -> list[Cell]:
    """The sequential runs: launch → succeeded, launch's own return, and each phase."""
    cells = [
        Cell(figure="launch", size=None, variant="one scripted agent, one line",
             method="cairn launch → run succeeded", cairn=True,
             samples=_each(runs, "invoked", "succeeded")),
        Cell(figure="launch", size=None, variant="one scripted agent, one line",
             method="cairn launch returns", cairn=True,
             samples=[r["returned"] for r in runs]),
    ]
    for label, start, end in PHASES:
        cells.append(Cell(figure="launch", size=None, variant="one scripted agent, one line",
                          method=f"of which: {label}", cairn=True,
                          samples=_each(runs, start, end)))
    return cells


def concurrent_cells(data: dict[str, Any], concurrent: int) -> list[Cell]:
    runs: list[dict[str, float]] = data["runs"]
    first: float = data["first_invoked"]
    variant = f"{concurrent} runs, 2 users"
    return [
        Cell(figure="concurrent", size=None, variant=variant,
             method="cairn launch → run succeeded, each run", cairn=True,
             samples=_each(runs, "invoked", "succeeded")),
        Cell(figure="concurrent", size=None, variant=variant,
             method="cairn launch returns, each launch", cairn=True,
             samples=[r["returned"] for r in runs]),
        Cell(figure="concurrent", size=None, variant=variant,
             method=f"first launch → all {concurrent} succeeded", cairn=True,
             samples=[max(r["succeeded"] for r in runs) - first]),
    ]


def memory_cells(data: dict[str, list[int]], concurrent: dict[str, Any], runs: int) -> list[Cell]:
    def cell(variant: str, method: str, value: float) -> Cell:
        return Cell(figure="memory", size=None, variant=variant, method=method, cairn=True,
                    unit="bytes", samples=[float(value)])

    before, peak = concurrent["memory_before"], concurrent["memory_peak"]
    return [
        cell("at rest", "cairnd (VmRSS)", data["cairnd"][0]),
        cell("one agent waiting", "cairnd (VmRSS)", data["cairnd_busy"][0]),
        cell("one agent waiting", "coordinator process (VmRSS)", data["coordinator"][0]),
        cell("one agent waiting", "coordinator unit, all its processes (VmRSS summed)",
             data["coordinator"][1]),
        cell("one agent waiting", "agent worker process (VmRSS)", data["agent"][0]),
        cell("one agent waiting", "agent unit, all its processes (VmRSS summed)",
             data["agent"][1]),
        cell(f"{runs} concurrent runs", "every process in the machine, VmRSS summed, peak",
             peak[0]),
        cell(f"{runs} concurrent runs", "every process in the machine, VmRSS summed, before",
             before[0]),
        cell(f"{runs} concurrent runs", "every process in the machine, RssAnon summed, peak",
             peak[1]),
        cell(f"{runs} concurrent runs",
             "host used memory (MemTotal − MemAvailable), peak minus before",
             peak[2] - before[2]),
    ]


def run_figures(repo: Path, *, repeat: int, concurrent: int, cells: list[Cell]) -> None:
    """Boot one machine with a pool, run ``INSIDE`` and add the launch, concurrent and
    memory figures to ``cells``."""
    sys.path.insert(0, os.fspath(repo / "tests" / "system"))
    from machine import Machine  # the system tier's harness

    deb = package(repo)
    with Machine(deb, with_pool=True) as machine:
        result = machine.exec(["python3", "-I", "-c", INSIDE, str(repeat), str(concurrent)],
                              timeout=900, check=False)
        if result.returncode != 0:
            raise AssertionError("run benchmark failed in the machine:\n"
                                 + result.stderr.decode(errors="replace")[-3000:])
        data = json.loads(result.stdout.decode().strip().splitlines()[-1])
    new = [*launch_cells(data["sequential"]),
           *concurrent_cells(data["concurrent"], concurrent),
           *memory_cells(data["memory"], data["concurrent"], concurrent)]
    for c in new:
        log.info("%s/%s: median %.4g %s", c.figure, c.method, c.median, c.unit)
    cells.extend(new)
