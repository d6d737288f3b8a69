"""Admission under load, in a booted test machine: how long ``cairn launch`` takes to
return when many launches arrive at once and most of them are queued, and how long until
every run has ended. The goal: each ``cairn launch`` returns in under a second.

    python3 tests/bench/admission_figures.py DEB [LAUNCHES] [LIMIT] [AT_ONCE] [--scripted] [--warm]

Launches builtin:implement, alternately as alice and bob, ``AT_ONCE`` ``cairn launch``
processes at a time, with ``max_running_runs = LIMIT``; prints one JSON line of figures.
The agent finishes at once: the host's configured command profile, as a person launches
(``/etc/cairn/profiles.d/builtin-implementer.toml``), or with ``--scripted`` a scripted
agent the caller sends (``--scripted PROFILE=FILE``, which the CLI validates with the
protocol's model, so each launch loads pydantic). Each launch is timed inside the machine, by
one driver script as a person's shell would see it (the ``cairn launch`` process started as
the user, on a project made beforehand), so the host's ``nsenter`` is not part of the
figure. Before that, the same number of interpreters importing what ``cairn launch``
imports, as many at a time: the launch path's own start with nothing else of cairn
running, the floor under any launch's time on the machine (``start_*``). The system test
``tests/system/test_launch_admission.py`` asserts the limit and that every run succeeds.

The machine is freshly booted (cairnd and the root broker start at boot) and has served
no launch yet; ``--warm`` launches one run first and waits for it to end, as on a host
that has (the figures say which: ``host``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

GOAL_SECONDS = 1.0

# Run as root inside the machine: argv = launches, at_once, then JSON {user: agent file}.
DRIVER = r'''
import json, os, pwd, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

launches, at_once, agents = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
users = [u for _ in range(launches // 2) for u in ("alice", "bob")]


def timed(user, argv):
    # As the user's shell starts it: the process itself becomes the user (no setpriv or
    # env in between, which would be timed too) and gets the environment of a login.
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
           "PATH": "/usr/local/bin:/usr/bin:/bin"}
    began = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=pw.pw_dir, user=pw.pw_uid,
                          group=pw.pw_gid, extra_groups=os.getgrouplist(user, pw.pw_gid))
    took = time.monotonic() - began
    if proc.returncode:
        sys.exit(f"{user}: {' '.join(argv)} failed: {proc.stderr.decode()[-2000:]}")
    return took, proc.stdout.decode().split(), proc.stderr.decode()


def project(i, user):
    return f"{pwd.getpwnam(user).pw_dir}/p-bench-{i}"


def launch(i, user):
    scripted = ["--scripted", f"builtin:implementer={agents[user]}"] if agents else []
    took, out, said = timed(user, [
        "cairn", "launch", "builtin:implement", "--project", project(i, user), "--args",
        json.dumps({"objective": "admission"}), *scripted])
    return {"run": out[-1], "seconds": took, "queued": "queued" in said}


# The projects exist before anyone launches, as a person's do.
for i, user in enumerate(users):
    timed(user, ["mkdir", "-p", project(i, user)])
# The floor: the launch path's own start (cairn.cli.launching, what `cairn launch` imports),
# as many at a time, with nothing else of cairn running.
start = ["python3", "-I", "-c", "import cairn.cli.launching"]
with ThreadPoolExecutor(at_once) as pool:
    floor = list(pool.map(lambda u: timed(u, start)[0], users))
began = time.monotonic()
with ThreadPoolExecutor(at_once) as pool:
    launched = list(pool.map(launch, range(len(users)), users))
print(json.dumps({"floor": floor, "launched": launched,
                  "returned": time.monotonic() - began}))
'''


# The agent of every run: write one file and answer at once.
COMMAND_PROFILE = """\
kind = "command"
argv = ["/usr/bin/python3", "-I", "-c", '''
import json, pathlib
pathlib.Path("NOTES.md").write_text("admitted\\n")
print(json.dumps({"output": {"summary": "wrote NOTES.md"}, "handoff": "one new file"}))
''']
"""


def figures(
    deb: Path, launches: int, limit: int, at_once: int, *, scripted: bool = False,
    warm: bool = False,
) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, os.fspath(repo / "tests" / "system"))
    from machine import Machine  # the system tier's harness
    from test_launch_admission import script, wait_all_ended

    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/etc/cairn/admission.toml"],
                     input=f"max_running_runs = {limit}\n".encode())
        if scripted:
            agents = {user: script(machine, user) for user in ("alice", "bob")}
        else:
            agents = {}
            machine.exec(["mkdir", "-p", "/etc/cairn/profiles.d"])
            machine.exec(["tee", "/etc/cairn/profiles.d/builtin-implementer.toml"],
                         input=COMMAND_PROFILE.encode())
        if warm:  # a host that has served a launch since it booted
            machine.exec(["mkdir", "-p", "/home/alice/p-warm"], user="alice")
            run = machine.exec(["cairn", "launch", "builtin:implement", "--project",
                                "/home/alice/p-warm", "--args", '{"objective": "warm"}'],
                               user="alice").stdout.decode().split()[-1]
            wait_all_ended(machine, [run], timeout=600)
        began = time.monotonic()
        out = machine.exec(["python3", "-I", "-c", DRIVER, str(launches), str(at_once),
                            json.dumps(agents)], timeout=3600).stdout
        data = json.loads(out.decode().strip().splitlines()[-1])
        launched = data["launched"]
        states = wait_all_ended(machine, [r["run"] for r in launched], timeout=3600)
        ended = time.monotonic() - began
    took = sorted(r["seconds"] for r in launched)
    floor = sorted(data["floor"])
    return {
        "agent": "scripted" if scripted else "command profile",
        "host": "one launch served before" if warm else "freshly booted",
        "launches": launches,
        "limit": limit,
        "at_once": at_once,
        "queued": sum(r["queued"] for r in launched),
        "launch_median_s": round(took[len(took) // 2], 3),
        "launch_p90_s": round(took[int(len(took) * 0.9)], 3),
        "launch_max_s": round(took[-1], 3),
        "under_goal": sum(t < GOAL_SECONDS for t in took),
        "admitted_at_once_median_s": _median([r["seconds"] for r in launched
                                                if not r["queued"]]),
        "queued_median_s": _median([r["seconds"] for r in launched if r["queued"]]),
        "start_median_s": round(floor[len(floor) // 2], 3),
        "start_max_s": round(floor[-1], 3),
        "all_returned_s": round(data["returned"], 1),
        "all_ended_s": round(ended, 1),
        "succeeded": sum(state == "succeeded" for state in states.values()),
    }


def _median(values: list[float]) -> float | None:
    return round(sorted(values)[len(values) // 2], 3) if values else None


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--scripted", "--warm")]
    if not args:
        sys.exit(__doc__)
    numbers = [int(a) for a in args[1:]] + [64, 8, 16][len(args) - 1:]
    print(json.dumps(figures(Path(args[0]), *numbers[:3], scripted="--scripted" in sys.argv,
                             warm="--warm" in sys.argv)))
