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
import ctypes, json, os, pwd, resource, sqlite3, struct, subprocess, sys, threading, time

repeat, concurrent = int(sys.argv[1]), int(sys.argv[2])
STARTS = json.loads(sys.argv[3])
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


PID1 = "systemd (PID 1, and what it forked that ended unseen)"
KINDS = (("cairn.service", "cairnd"), ("cairn-broker.service", "broker"),
         ("cairn-coordinator@", "coordinator unit"), ("cairn-agent-", "agent unit"),
         ("cairn-import-", "import unit"), ("cairn-candidate-", "candidate unit"),
         ("cairn-apply-", "apply unit"), ("cairn-egress@", "egress unit"),
         ("init.scope", PID1),
         ("dbus.service", "D-Bus"), ("systemd-journald.service", "journald"))
RUN_KINDS = ("coordinator unit", "agent unit", "import unit", "candidate unit", "apply unit")
BENCH, CLI = "the bench script itself", "cairn launch (CLI), process accounting"
ACCT_FILE = "/var/tmp/cairn-bench.acct"
ACCT_V3 = struct.Struct("<BBH6If8H16s")
TICK = os.sysconf("SC_CLK_TCK")


def unit_of(pid):
    """The unit a process belongs to by its name=systemd cgroup, None if gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "name=systemd":
                    return path.rsplit("/", 1)[-1] or "init.scope"
    except (FileNotFoundError, ProcessLookupError):
        return None
    return "?"


def kind_of(unit):
    for prefix, kind in KINDS:
        if unit.startswith(prefix):
            return kind
    return unit or "unknown"


def cpu_ticks(pid):
    """(start time, utime + stime) in clock ticks, None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[19]), int(fields[11]) + int(fields[12])


def comp_t(value):
    return (value & 0x1FFF) << (3 * (value >> 13))


class Accounting:
    """CPU time by process kind while it is on: BSD process accounting (the kernel
    writes a record for every process of this PID namespace when it exits) for the
    processes that end, /proc/PID/stat deltas for those that live on. Each process's
    unit is read from its cgroup as soon as it is seen (a scan of /proc every 20 ms);
    one that ended unseen counts as its parent's."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        os.close(os.open(ACCT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        if self.libc.acct(ACCT_FILE.encode()) != 0:
            raise OSError(ctypes.get_errno(), "acct() refused")
        self.units = {}
        self.before = {pid: cpu_ticks(pid) for pid in self.pids()}
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self.watch)
        self.watcher.start()

    @staticmethod
    def pids():
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]

    def watch(self):
        while True:
            for pid in self.pids():
                if self.units.get(pid) in (None, "init.scope"):
                    unit = unit_of(pid)
                    if unit is not None:
                        self.units[pid] = unit
            if self.stop.wait(0.02):
                return

    def close(self):
        """{kind: [CPU seconds, processes]} for everything that ran meanwhile."""
        self.stop.set()
        self.watcher.join()
        self.libc.acct(None)
        with open(ACCT_FILE, "rb") as fh:
            raw = fh.read()
        os.unlink(ACCT_FILE)
        ended = {}
        parent = {}
        for offset in range(0, len(raw) - ACCT_V3.size + 1, ACCT_V3.size):
            rec = ACCT_V3.unpack_from(raw, offset)
            if rec[1] & 0x7F != 3:
                raise SystemExit(f"process accounting record version {rec[1]}, not 3")
            pid, ppid = rec[6], rec[7]
            ended[pid] = (comp_t(rec[10]) + comp_t(rec[11])) / 100  # AHZ is 100 in v3
            parent[pid] = ppid
        me = os.getpid()

        def kind(pid):
            if pid == me:
                return BENCH
            for _ in range(64):
                if parent.get(pid) == me:
                    return CLI
                unit = self.units.get(pid)
                if unit is not None and unit != "init.scope":
                    return kind_of(unit)
                if pid == 1:
                    return PID1
                if pid not in parent:
                    return kind_of(unit) if unit else "unseen"
                pid = parent[pid]
            return "unseen"

        out = {}
        for pid, seconds in ended.items():
            entry = out.setdefault(kind(pid), [0.0, 0])
            entry[0] += seconds
            entry[1] += 1
        for pid in self.pids():
            now = cpu_ticks(pid)
            if now is None or pid in ended:
                continue
            then = self.before.get(pid)
            used = now[1] - (then[1] if then and then[0] == now[0] else 0)
            if used:
                out.setdefault(kind(pid), [0.0, 0])[0] += used / TICK
        return out


def wait_quiet(timeout):
    """Until no process of a run's units is left (a coordinator outlives its run's
    last journal write by a moment)."""
    deadline = time.monotonic() + timeout
    while any(kind_of(unit_of(pid) or "") in RUN_KINDS for pid in Accounting.pids()):
        if time.monotonic() > deadline:
            raise SystemExit("run units still alive after their runs ended")
        time.sleep(0.05)


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
    accounting = Accounting()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start.wait()
    try:
        for t in threads:
            t.join(300)
        if any(r is None for r in results):
            raise SystemExit("a concurrent cairn launch did not return")
        wait_ended([r[0] for r in results], 300)
        wait_quiet(60)
    finally:
        stop.set()
        sampler.join()
        cpu = accounting.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The launch processes were this script's children: their exact CPU time.
    cli = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    cpu["cairn launch (CLI), getrusage"] = [cli, len(results)]
    first = min(r[1] for r in results)
    runs = []
    for run_id, invoked, returned in results:
        runs.append({"invoked": invoked, "returned": returned, **marks(run_id)})
    return {"runs": runs, "first_invoked": first, "memory_before": before,
            "memory_peak": peak, "cpu": cpu}


def process_starts():
    """Wall time of a Python start that imports what each of a run's processes imports
    first (as installed), five times each, nothing else running."""
    out = {}
    for label, module in STARTS:
        code = f"import {module}" if module else "pass"
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run(["python3", "-I", "-c", code], check=True)
            samples.append(time.perf_counter() - t0)
        out[label] = samples
    return out


out = {"sequential": sequential(), "memory": at_rest_and_waiting(), "starts": process_starts()}
out["concurrent"] = together()
print(json.dumps(out))
'''

# Figures of one sample by design (one batch of concurrent runs, one reading of memory).
SINGLE_SHOT = ("concurrent", "memory", "cpu")
# Process kinds the in-machine script reports that are not part of a run's cost: itself,
# and the launch processes as process accounting saw them (getrusage has them exactly).
BENCH = "the bench script itself"
CLI_ACCOUNTED = "cairn launch (CLI), process accounting"

# What each process of a run imports first: (label, module; empty for bare Python).
STARTS = (
    ("python3 -I, nothing imported", ""),
    ("cairn CLI (cairn.cli)", "cairn.cli"),
    ("model egress (cairn.coordinator.egress)", "cairn.coordinator.egress"),
    ("coordinator (cairn.coordinator.__main__)", "cairn.coordinator.__main__"),
    # What the coordinator's main imports once it has checked its argument.
    ("coordinator's run (cairn.coordinator.core)", "cairn.coordinator.core"),
    ("control worker (cairn.workflow.runtime)", "cairn.workflow.runtime"),
    ("import unit (cairn.importer)", "cairn.importer"),
    ("agent worker (cairn.worker.__main__, from the package)", "cairn.worker.__main__"),
    ("candidate unit (cairn.worker.candidate)", "cairn.worker.candidate"),
    ("apply unit (cairn.worker.apply)", "cairn.worker.apply"),
)

# (label, start mark, end mark) for each phase of a run, in the order they happen.
PHASES = (
    ("cairn launch until the run is recorded (CLI start, cairnd's review)", "invoked",
     "recorded"),
    ("until the coordinator holds the lease (broker and coordinator unit start, and the "
     "egress unit's for a run with model providers)", "recorded", "lease"),
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
    return cells + phase_cells("launch", "one scripted agent, one line", runs)


def phase_cells(figure: str, variant: str, runs: list[dict[str, float]]) -> list[Cell]:
    """One ``of which`` row per phase of :data:`PHASES`."""
    return [Cell(figure=figure, size=None, variant=variant, method=f"of which: {label}",
                 cairn=True, samples=_each(runs, start, end))
            for label, start, end in PHASES]


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
        *phase_cells("concurrent", variant, runs),
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


def cpu_cells(cpu: dict[str, list[float]], runs: int) -> list[Cell]:
    """CPU seconds per run by process kind, over one batch of ``runs`` concurrent runs."""
    variant = f"{runs} concurrent runs"

    def cell(method: str, seconds: float) -> Cell:
        return Cell(figure="cpu", size=None, variant=variant, method=method, cairn=True,
                    samples=[seconds / runs])

    counted = {k: v for k, v in cpu.items() if k not in (BENCH, CLI_ACCOUNTED)}
    cells = [cell("every process in the machine, per run", sum(v[0] for v in counted.values()))]
    for kind, (seconds, processes) in sorted(counted.items(), key=lambda kv: -kv[1][0]):
        ended = f", {processes / runs:.1f} processes per run ended" if processes else ""
        cells.append(cell(f"of which: {kind}{ended}", seconds))
    for kind in (CLI_ACCOUNTED, BENCH):
        if kind in cpu:
            cells.append(cell(f"not counted: {kind}", cpu[kind][0]))
    return cells


def start_cells(starts: dict[str, list[float]]) -> list[Cell]:
    """One row per process kind of :data:`STARTS`, bare Python first."""
    return [Cell(figure="start", size=None, variant="import only", method=label, cairn=True,
                 samples=samples) for label, samples in starts.items()]


def run_figures(repo: Path, *, repeat: int, concurrent: int, cells: list[Cell]) -> None:
    """Boot one machine with a pool, run ``INSIDE`` and add the launch, concurrent and
    memory figures to ``cells``."""
    sys.path.insert(0, os.fspath(repo / "tests" / "system"))
    from machine import Machine  # the system tier's harness

    deb = package(repo)
    with Machine(deb, with_pool=True) as machine:
        result = machine.exec(["python3", "-I", "-c", INSIDE, str(repeat), str(concurrent),
                               json.dumps(STARTS)], timeout=900, check=False)
        if result.returncode != 0:
            raise AssertionError("run benchmark failed in the machine:\n"
                                 + result.stderr.decode(errors="replace")[-3000:])
        data = json.loads(result.stdout.decode().strip().splitlines()[-1])
    new = [*launch_cells(data["sequential"]),
           *concurrent_cells(data["concurrent"], concurrent),
           *memory_cells(data["memory"], data["concurrent"], concurrent),
           *cpu_cells(data["concurrent"]["cpu"], concurrent),
           *start_cells(data["starts"])]
    for c in new:
        log.info("%s/%s: median %.4g %s", c.figure, c.method, c.median, c.unit)
    cells.extend(new)
