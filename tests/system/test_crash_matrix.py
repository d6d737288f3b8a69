"""The crash matrix (ARCHITECTURE §5): every built-in workflow killed at every failpoint its
path passes, and once by a machine restart mid-agent, in one booted machine.

The module runs in phases. The first runs each built-in undisturbed (scripted agents,
host evaluators whose metrics the test controls); each later phase enables one failpoint
for the coordinator, the broker, apply and agent units (it fires once per run) and runs,
at the same time, every built-in whose path passes it; the last phase powers the machine
off while every built-in's first agent runs. A cell (built-in, failpoint) holds when its
run ends in the undisturbed run's state (output, operations) with the same live-project
bytes, its failpoint fired, every agent's effect is in the project once (each agent's
line in log.txt is unique), every agent and evaluator unit started once unless a clean
retry was recorded, and nothing is left: no active or failed unit, no subvolume beyond
the undisturbed run's, no intent without its receipt. Results: docs/reliability.md.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from reliability_doc import write_section
from test_escapes import tree
from test_recovery import EXPERIMENT_FAILPOINTS, FAILPOINTS

EVERY = ("implement", "execute-plan", "research", "review", "optimize", "goal")
SETTLING = ("implement", "execute-plan", "optimize", "goal")  # research/review change nothing
# failpoint -> the built-ins whose path passes it
PASSES: dict[str, tuple[str, ...]] = {
    **{name: EVERY for name, (where, _s) in FAILPOINTS.items() if where != "apply"},
    **{name: SETTLING for name, (where, _s) in FAILPOINTS.items() if where == "apply"},
    "measure-after-intent": ("optimize", "goal"),
    "measure-after-receipt": ("optimize", "goal"),
    "experiment-after-decision": ("optimize",),
    "experiment-after-restore": ("optimize",),  # a rejected trial restores W
    "broker-after-spare-rename": ("optimize",),  # ... from the accepted checkpoint's spare
}
RESTART = "machine-restart"
SITUATIONS = {
    **{name: (where, situation) for name, (where, situation) in FAILPOINTS.items()},
    **{name: ("broker" if name.startswith("broker") else "coordinator", situation)
       for name, situation in EXPERIMENT_FAILPOINTS.items()},
    RESTART: ("machine", "powered off while the first agent ran"),
}
CELLS = [(wf, fp) for fp in PASSES for wf in PASSES[fp]] + [(wf, RESTART) for wf in EVERY]
# Known failing cells: (workflow, failpoint) -> the precise cause.
XFAIL: dict[tuple[str, str], str] = {}

LINES = 'n=$(cat log.txt 2>/dev/null | wc -l)'
EVALUATORS = {  # runtime: 10 before any trial, 5 after one (accepted), 20 after two (rejected)
    "bench": f'{LINES}; case $n in 0) v=10;; 1) v=5;; *) v=20;; esac; '
             'printf "{\\"cairn_metrics\\": {\\"runtime\\": %s}}\\n" "$v"',
    "tests": f'{LINES}; v=0; [ "$n" -ge 2 ] && v=1; '
             'printf "{\\"cairn_metrics\\": {\\"holds\\": %s}}\\n" "$v"',
}
POINTS = ["add NOTES.md", "mention NOTES.md in CHANGELOG.md"]


def hold(deadline: int) -> dict[str, Any]:
    """A step that sleeps until ``deadline`` (epoch seconds); nothing once it passed."""
    return {"action": "run", "argv": [
        "/bin/sh", "-c", f'now=$(date +%s); [ "$now" -lt {deadline} ] && '
        f'sleep $(({deadline} - now)); true']}


def writer(line: str, deadline: int, summary: str = "{title}") -> dict[str, Any]:
    """A write agent: a file of its own, a pause (the crash window with its write in W),
    then its line in log.txt."""
    return {"steps": [{"action": "write", "path": "notes/{title}.txt", "content": "{prompt}\n"},
                      hold(deadline), {"action": "sleep", "seconds": 0.5},
                      {"action": "append", "path": "log.txt", "content": f"{line}\n"}],
            "output": {"summary": summary}, "handoff": "{title} done"}


def reader(output: dict[str, Any], deadline: int) -> dict[str, Any]:
    return {"steps": [hold(deadline)], "output": output, "handoff": "{title} read"}


TRIAL = ('n=$(cat log.txt 2>/dev/null | wc -l); echo "trial $((n + 1))" >> log.txt')


def plans(deadline: int) -> dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]]:
    """Built-in -> (its args, profile -> scripted agent)."""
    finding = {"severity": "low", "where": "src/app.py:1", "problem": "{title}: no guard"}
    trial = writer("", deadline, summary="one change")
    trial["steps"][-1] = {"action": "run", "argv": ["/bin/sh", "-c", TRIAL]}
    return {
        "implement": ({"objective": "add NOTES.md"},
                      {"implementer": writer("implemented", deadline)}),
        "execute-plan": ({"plan": "docs/plan.md"}, {
            "planner": {"steps": [hold(deadline)], "output": {"points": POINTS},
                        "handoff": "two points"},
            "implementer": writer("{title}", deadline)}),
        "research": ({"question": "what does app.py do?", "lines": 2}, {
            "researcher": reader({"answer": "{title}: it prints hi",
                                  "evidence": ["src/app.py:1"]}, deadline)}),
        "review": ({"focus": "error handling", "reviewers": 2}, {
            "reviewer": reader({"verdict": "approve", "summary": "{title} looked",
                                "findings": [finding]}, deadline)}),
        "optimize": ({"objective": "faster", "max_trials": 2}, {"implementer": trial}),
        "goal": ({"goal": "two attempts", "check": "tests", "max_attempts": 4},
                 {"implementer": writer("{title}", deadline)}),
    }


@dataclass
class Run:
    """One finished run and what the machine held after it."""

    workflow: str
    run_id: str
    project: str
    data: dict[str, Any] = field(default_factory=dict)
    tree: str = ""
    log: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    agent_starts: dict[str, list[int]] = field(default_factory=dict)
    measure_starts: dict[str, int] = field(default_factory=dict)
    subvolumes: set[str] = field(default_factory=set)
    units: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    # Every event of the run, from the journal ('cairn show' lists a window of them).
    events: list[dict[str, Any]] = field(default_factory=list)


EVENTS = (  # argv: the journal, then the runs
    "import json, sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(json.dumps(["
    "{'run_id': r, 'event': e, 'op_id': o, 'data': json.loads(d)} for r, e, o, d in "
    "db.execute('SELECT run_id, event, op_id, data FROM events WHERE run_id IN (%s) ORDER BY "
    "cursor' % ','.join('?' * len(sys.argv[2:])), sys.argv[2:])]))"
)
PENDING = (
    "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print('\\n'.join("
    "r[0] + ' ' + r[1] for r in db.execute('SELECT run_id, intent_id FROM intents i WHERE "
    "NOT EXISTS (SELECT 1 FROM receipts r WHERE r.run_id=i.run_id "
    "AND r.intent_id=i.intent_id)')))"
)


def cairn(machine: Machine, *argv: str) -> str:
    return machine.exec(["cairn", *argv], user="alice", timeout=120).stdout.decode()


def set_failpoint(machine: Machine, name: str | None) -> None:
    for unit in ("cairn-coordinator@.service", "cairn-broker.service"):
        dropin = f"/etc/systemd/system/{unit}.d"
        if name is None:
            machine.exec(["rm", "-f", f"{dropin}/failpoint.conf"])
            continue
        machine.exec(["mkdir", "-p", dropin])
        machine.exec(["tee", f"{dropin}/failpoint.conf"],
                     input=f"[Service]\nEnvironment=CAIRN_FAILPOINTS={name}\n".encode())
    machine.exec(["systemctl", "daemon-reload"])
    machine.exec(["systemctl", "stop", "cairn-broker.service"])


def launch(machine: Machine, tag: str, workflow: str, deadline: int) -> Run:
    args, profiles = plans(deadline)[workflow]
    project = f"/home/alice/{tag}-{workflow}"
    machine.exec(["mkdir", "-p", f"{project}/src", f"{project}/docs"], user="alice")
    for name, text in (("CHANGELOG.md", "# Changelog\n"), ("src/app.py", "print('hi')\n"),
                       ("docs/plan.md", "# Plan\n1. add NOTES.md\n2. mention it\n")):
        machine.exec(["tee", f"{project}/{name}"], user="alice", input=text.encode())
    scripted = []
    for profile, body in profiles.items():
        path = f"/home/alice/{tag}-{workflow}-{profile}.json"
        machine.exec(["tee", path], user="alice", input=json.dumps(body).encode())
        scripted += ["--scripted", f"builtin:{profile}={path}"]
    out = cairn(machine, "launch", f"builtin:{workflow}", "--project", project,
                "--args", json.dumps(args), *scripted)
    return Run(workflow, out.strip().splitlines()[-1], project)


def start_phase(machine: Machine, tag: str, workflows: tuple[str, ...],
                deadline: int = 0) -> list[Run]:
    with ThreadPoolExecutor(len(workflows)) as pool:
        return list(pool.map(lambda wf: launch(machine, tag, wf, deadline), workflows))


def finish_phase(machine: Machine, runs: list[Run], failpoint: str | None) -> None:
    """Wait for every run of the phase to end, then record what the machine holds."""
    deadline, waiting = time.monotonic() + 420, list(runs)
    while waiting:
        for run in list(waiting):
            run.data = json.loads(cairn(machine, "show", run.run_id, "--json"))
            if run.data["run"]["state"] in ("succeeded", "failed", "cancelled", "blocked"):
                waiting.remove(run)
        if waiting and time.monotonic() > deadline:
            pytest.fail(f"stuck: {[(r.workflow, r.data['run']['state']) for r in waiting]}")
        time.sleep(1)
    starts = machine.exec(["journalctl", "--no-pager", "-o", "cat", "_PID=1"]
                          ).stdout.decode()
    volumes = machine.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"]
                           ).stdout.decode()
    events = json.loads(machine.exec(["python3", "-c", EVENTS, "/var/lib/cairn/journal/journal.db",
                                      *(r.run_id for r in runs)]).stdout)
    pending = machine.exec(["python3", "-c", PENDING, "/var/lib/cairn/journal/journal.db"]
                           ).stdout.decode().split("\n")
    for run in runs:
        rid = run.run_id
        run.tree = tree(machine, run.project)
        run.log = machine.exec(["cat", f"{run.project}/log.txt"], check=False
                               ).stdout.decode().splitlines()
        if failpoint:
            run.fired = machine.exec(
                ["find", f"/var/lib/cairn/runs/{rid}", f"/var/lib/cairn/pool/runs/{rid}",
                 "-name", f"failpoint-{failpoint}"], check=False).stdout.decode().split()
        for op, attempt in re.findall(rf"Started cairn-agent-{rid}-(.+)-(\d+)\.service",
                                      starts):
            run.agent_starts.setdefault(op, []).append(int(attempt))
        for unit in re.findall(rf"Started (cairn-measure-{rid}-\S+)\.service", starts):
            run.measure_starts[unit] = run.measure_starts.get(unit, 0) + 1
        prefix = f"runs/{rid}/"
        run.subvolumes = {line.split(prefix, 1)[1] for line in volumes.splitlines()
                          if prefix in line}
        listed = machine.exec(["systemctl", "list-units", "--all", "--plain", "--no-legend",
                               f"*{rid}*"]).stdout.decode()
        run.units = [line for line in listed.splitlines()
                     if line and " inactive " not in f" {line} "]
        run.pending = [p.split()[1] for p in pending if p.startswith(rid + " ")]
        run.events = [e for e in events if e["run_id"] == rid]


@dataclass
class Matrix:
    machine: Machine
    clean: dict[str, Run]
    cells: dict[tuple[str, str], Run]
    seconds: float


@pytest.fixture(scope="module")
def matrix(deb: Path) -> Iterator[Matrix]:
    """Every phase, in one machine: undisturbed, each failpoint, then a machine restart."""
    started = time.monotonic()
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
        # the six built-ins of a phase run side by side: the machine-wide admission (2 runs
        # a CPU by default) must not queue any, or the restart finds one with no agent
        machine.exec(["tee", "/etc/cairn/admission.toml"],
                     input=b"max_running_runs = 8\nmax_running_per_user = 8\n")
        for name, script in EVALUATORS.items():
            body = (f"argv = {json.dumps(['/bin/sh', '-c', script])}\ntimeout_sec = 60\n"
                    "warmups = 0\nsamples = 1\nnetwork = false\n")
            machine.exec(["tee", f"/etc/cairn/evaluators.d/{name}.toml"], input=body.encode())
        clean = start_phase(machine, "clean", EVERY)
        finish_phase(machine, clean, None)
        print(f"phase clean: {time.monotonic() - started:.0f} s", flush=True)
        cells: dict[tuple[str, str], Run] = {}
        for n, (failpoint, workflows) in enumerate(PASSES.items()):
            set_failpoint(machine, failpoint)
            runs = start_phase(machine, f"f{n}", workflows)
            finish_phase(machine, runs, failpoint)
            print(f"phase {failpoint}: {time.monotonic() - started:.0f} s", flush=True)
            cells.update({(r.workflow, failpoint): r for r in runs})
        set_failpoint(machine, None)
        deadline = int(time.time()) + 40  # every first agent holds until then
        runs = start_phase(machine, "restart", EVERY, deadline)
        while True:  # every run has an agent running, inside its hold
            agents = [[o for o in json.loads(cairn(machine, "show", r.run_id, "--json"))
                       ["operations"] if o["kind"] == "agent" and o["state"] == "started"]
                      for r in runs]
            if all(agents) or time.time() > deadline - 6:
                break
            time.sleep(1)
        assert all(agents), "not every run reached an agent before the machine restart"
        time.sleep(max(0.0, deadline - 6 - time.time()))
        machine.reboot()
        finish_phase(machine, runs, None)
        cells.update({(r.workflow, RESTART): r for r in runs})
        yield Matrix(machine, {r.workflow: r for r in clean}, cells,
                     time.monotonic() - started)


RESULTS: dict[tuple[str, str], dict[str, Any]] = {}


def shape(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(o["op_id"], o["scope"], o["kind"], o["state"])
            for o in sorted(data["operations"], key=lambda o: (o["scope"], o["seq"]))]


def changed(run: Run) -> dict[str, bool | None]:
    """op -> whether the broker saw the agent change W at its boundary."""
    return {o["op_id"]: (o.get("checkpoint") or {}).get("changed")
            for o in run.data["operations"] if o["kind"] == "agent"}


def test_undisturbed_runs_succeed(matrix: Matrix) -> None:
    outputs = {wf: r.data["run"]["output"] for wf, r in matrix.clean.items()}
    for wf, run in matrix.clean.items():
        assert run.data["run"]["state"] == "succeeded", (wf, run.data["run"]["error"])
        assert all(attempts == [1] for attempts in run.agent_starts.values()), wf
        assert run.units == [] and run.pending == [], (wf, run.units, run.pending)
    # what root saw at each boundary: readers changed nothing, writers something
    for wf in ("research", "review"):
        assert set(changed(matrix.clean[wf]).values()) == {False}, changed(matrix.clean[wf])
    for wf in ("implement", "goal"):
        assert set(changed(matrix.clean[wf]).values()) == {True}, changed(matrix.clean[wf])
    assert all(c is not None for r in matrix.clean.values() for c in changed(r).values())
    assert outputs["optimize"]["accepted"] == 1 and outputs["goal"]["attempts"] == 2
    assert matrix.clean["implement"].log == ["implemented"]
    assert matrix.clean["execute-plan"].log == ["point 1", "point 2"]
    assert matrix.clean["optimize"].log == ["trial 1"]  # trial 2 was rejected
    assert matrix.clean["goal"].log == ["attempt 1", "attempt 2"]


def params() -> list[Any]:
    return [pytest.param(wf, fp, id=f"{wf}-{fp}", marks=[pytest.mark.xfail(
        strict=True, reason=XFAIL[(wf, fp)])] if (wf, fp) in XFAIL else [])
        for wf, fp in CELLS]


@pytest.mark.parametrize(("workflow", "failpoint"), params())
def test_cell(matrix: Matrix, workflow: str, failpoint: str) -> None:
    clean, run = matrix.clean[workflow], matrix.cells[(workflow, failpoint)]
    data = run.data
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == clean.data["run"]["output"]
    assert shape(data) == shape(clean.data)
    assert run.tree == clean.tree  # the live project, byte for byte
    assert run.log == clean.log  # every agent's line once, none of a killed attempt
    # each boundary compared with where its agent began, retried or not
    assert changed(run) == changed(clean)
    if failpoint != RESTART:
        assert run.fired, f"{failpoint} never fired"
    retried = {op for op, attempts in run.agent_starts.items() if len(attempts) > 1}
    retries = sum(1 for e in run.events if e["event"] == "op-retry")
    assert set(run.agent_starts) == set(clean.agent_starts)
    where, situation = SITUATIONS[failpoint]
    # A broker that died after recording an agent's attempt and before starting its unit
    # (amid another run's call) leaves that attempt unstarted: the coordinator retries it
    # cleanly, so the first unit PID 1 started is a later attempt's.
    unstarted = {op for op, attempts in run.agent_starts.items()
                 if where == "broker" and attempts and attempts[0] > 1}
    assert all(attempts == list(range(attempts[0], attempts[0] + len(attempts)))
               and (attempts[0] == 1 or op in unstarted)
               for op, attempts in run.agent_starts.items()), run.agent_starts
    if failpoint == "agent-before-finish":  # every first attempt died
        assert retried == set(clean.agent_starts) and retries == len(retried)
    elif failpoint == RESTART:  # the agents running at the power-off, retried once
        assert retried and retries == len(retried)
        assert all(len(a) == 2 for a in run.agent_starts.values() if len(a) > 1)
        assert any(e["event"] == "reconciled" for e in run.events)
    else:  # on a miss, the run's own log says where the finish was lost
        assert retried == set() and retries == len(unstarted), (
            run.agent_starts, matrix.machine.journal(run_id=run.run_id)[-12000:])
    from_file = {e["op_id"] for e in run.events
                 if e["event"] == "op-finished" and e["data"]["via"] == "file"}
    if failpoint == "agent-after-result-file":  # each finish settled from its file, once
        assert from_file == set(clean.agent_starts), from_file
    assert set(run.measure_starts) == {u.replace(clean.run_id, run.run_id)
                                       for u in clean.measure_starts}
    if where != "broker":  # nothing measured twice
        assert set(run.measure_starts.values()) <= {1}, run.measure_starts
    # else: the one broker serves every run, and an evaluator it was waiting on when it
    # died runs again for the retried intent (its measurement still recorded once: shape)
    # nothing left behind: units, intents, subvolumes (one W per scope, as undisturbed)
    assert run.units == [], run.units
    assert run.pending == [], run.pending

    def generic(volumes: set[str]) -> list[str]:
        return sorted(re.sub(r"/W\.\d+$", "/W", v) for v in volumes)

    assert generic(run.subvolumes) == generic(clean.subvolumes)
    restarts = sum(1 for e in run.events if e["event"] == "lease-acquired") - 1
    if where == "coordinator":
        assert restarts >= 1
    RESULTS[(workflow, failpoint)] = {
        "process": where, "situation": situation,
        "agent_launches": sum(len(v) for v in run.agent_starts.values()),
        "clean_retries": retries, "coordinator_restarts": max(restarts, 0), "orphans": 0,
    }


def test_write_matrix_tables(matrix: Matrix) -> None:
    """docs/reliability.md's matrix section, from this session's cells (runs last)."""
    missing = [c for c in CELLS if c not in RESULTS and c not in XFAIL]
    assert not missing, f"cells that did not hold: {missing}"
    lines = [
        "## Crash matrix: every built-in at every failpoint it passes",
        "",
        "From `tests/system/test_crash_matrix.py`: one machine, each built-in with scripted",
        "agents, run undisturbed, then once per failpoint its path passes (the named process",
        "SIGKILLed the first time the run reaches it, systemd restarting what died) and once",
        "with the machine powered off while its first agent ran. A row holds when the run",
        "ended with the undisturbed run's output, operations and live-project bytes, every",
        "agent's effect once, and no unit, subvolume or intent left behind. One broker",
        "serves every run, so a broker row also kills the broker amid the other runs'",
        "calls; an evaluator it was waiting on then runs again (measured once), and an",
        "import or candidate it was waiting on is stopped and made again from nothing",
        "(`tests/btrfs/test_retried_helpers.py`).",
        f"{len(CELLS)} cells; the module took {matrix.seconds / 60:.1f} min.",
        "",
    ]
    for workflow in EVERY:
        rows = [fp for wf, fp in CELLS if wf == workflow]
        lines += [
            f"### `builtin:{workflow}`", "",
            "| failpoint | process killed | state at the crash | outcome | agent launches "
            "| clean retries | coordinator restarts | orphans |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for fp in rows:
            r = RESULTS.get((workflow, fp))
            if r is None:
                where, situation = SITUATIONS[fp]
                lines.append(f"| `{fp}` | {where} | {situation} | **fails**: "
                             f"{XFAIL[(workflow, fp)]} | | | | |")
                continue
            lines.append(
                f"| `{fp}` | {r['process']} | {r['situation']} | recovered "
                f"| {r['agent_launches']} | {r['clean_retries']} "
                f"| {r['coordinator_restarts']} | {r['orphans']} |")
        lines.append("")
    write_section("matrix", lines)
