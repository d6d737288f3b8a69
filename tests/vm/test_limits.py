"""cgroup v2 limits of agent units and the cgroup-empty proof, on a real kernel.

Driven through the cairn CLI as alice inside a QEMU/TCG VM; the host side only reads what
the VM's kernel and systemd report (cgroup files, the journal). The limits checked are the
launch description's defaults (:class:`cairn.protocol.launch.Limits`), as every run gets them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from cairn.protocol.launch import Limits

if TYPE_CHECKING:
    from machine import VirtualMachine

LIMITS = Limits()
CGROUP_FS = "/sys/fs/cgroup"
RUN_TIMEOUT = 420.0
CHUNK = 64 << 20
# More than MemoryMax, less than the VM's memory: only the cgroup limit can stop it.
ALLOCATION_CAP = LIMITS.memory_max + (1 << 30)
ALLOCATE = (
    "chunks = []\n"
    f"while len(chunks) * {CHUNK} < {ALLOCATION_CAP}:\n"
    f"    chunks.append(bytearray({CHUNK}))\n"
    "    chunks[-1][::4096] = b'x' * (len(chunks[-1]) // 4096)\n"
)
# Forks until the kernel refuses, holds every child at the limit for a while, then ends
# them itself and writes what happened into the workspace (so into the live project).
FORK_BOMB = """
import errno, os, signal, time
children = []
while True:
    try:
        pid = os.fork()
    except OSError as exc:
        refused = errno.errorcode[exc.errno]
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    children.append(pid)
time.sleep(12)
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)
with open("forks.json", "w") as out:
    out.write('{"forked": %d, "refused": "%s"}' % (len(children), refused))
"""
STRAY_SLEEP = "6131"


# -- driving cairn in the VM ----------------------------------------------------------


def cairn(vm: VirtualMachine, *argv: str) -> str:
    return vm.exec(["cairn", *argv], user="alice", timeout=300).stdout.decode()


def make_project(vm: VirtualMachine, name: str) -> str:
    project = f"/home/alice/{name}"
    vm.exec(["mkdir", "-p", project], user="alice")
    vm.exec(["tee", f"{project}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    return project


def launch(vm: VirtualMachine, project: str, steps: list[dict[str, Any]]) -> str:
    script = {"steps": steps, "output": {"summary": "done: {prompt}"}, "handoff": "done"}
    path = f"{project}.agent.json"
    vm.exec(["tee", path], user="alice", input=json.dumps(script).encode())
    out = cairn(
        vm,
        "launch",
        "builtin:implement",
        "--project",
        project,
        "--args",
        json.dumps({"objective": "limits"}),
        "--scripted",
        f"builtin:implementer={path}",
    )
    return out.strip().splitlines()[-1]


def show(vm: VirtualMachine, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cairn(vm, "show", run_id, "--json"))
    return data


def wait_finished(vm: VirtualMachine, run_id: str) -> dict[str, Any]:
    """``cairn show`` of the run once it ended. Waits on the coordinator unit with
    systemctl, because every ``cairn`` call costs seconds of the emulated CPU."""
    coordinator = f"cairn-coordinator@{run_id}.service"
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        state = vm.exec(
            ["systemctl", "show", "--property=ActiveState", "--value", coordinator]
        ).stdout.decode().strip()
        if state in ("inactive", "failed"):
            data = show(vm, run_id)
            if data["run"]["state"] in ("succeeded", "failed", "cancelled"):
                return data
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id} did not end:\n{context(vm, run_id)}")
        time.sleep(1)


def context(vm: VirtualMachine, run_id: str) -> str:
    """The run's journal for a failure message, without the fork bomb's retry noise."""
    noise = ("fork: retry", "fork: Resource temporarily", "with signal SIGKILL", "SIGTERM")
    lines = [line for line in journal_lines(vm, run_id) if not any(n in line for n in noise)]
    return "\n".join(lines[-60:])


def agent_unit(run_id: str) -> str:
    return f"cairn-agent-{run_id}-root-1-1.service"


def wait_agent_cgroup(vm: VirtualMachine, unit: str, timeout: float = RUN_TIMEOUT) -> str:
    """The control group of the running agent unit, once systemd reports one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = vm.exec(
            ["systemctl", "show", "--property=ActiveState,ControlGroup", unit]
        ).stdout.decode()
        props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        if props.get("ActiveState") == "active" and props.get("ControlGroup"):
            return props["ControlGroup"]
        time.sleep(0.3)
    pytest.fail(f"{unit} never became active:\n{vm.journal(unit=unit)[-3000:]}")


def cgroup_files(vm: VirtualMachine, cgroup: str, *names: str) -> dict[str, str] | None:
    """The named files of a cgroup v2 directory in the VM, or None once it is gone."""
    proc = vm.exec(
        ["sh", "-c", 'cd "$1" && shift && grep -H "" "$@"', "sh", CGROUP_FS + cgroup, *names],
        check=False,
    )
    if proc.returncode != 0:
        return None
    files: dict[str, str] = {}
    for line in proc.stdout.decode().splitlines():
        name, _, value = line.partition(":")
        files[name] = f"{files[name]}\n{value}" if name in files else value
    return files


def keyed(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file such as ``pids.events`` or ``cgroup.events``."""
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def cgroup_gone_or_empty(vm: VirtualMachine, cgroup: str) -> bool:
    events = cgroup_files(vm, cgroup, "cgroup.events")
    return events is None or keyed(events["cgroup.events"])["populated"] == 0


def broker_says_empty(vm: VirtualMachine, cgroup: str) -> bool:
    """The broker's QUIESCE check itself, :func:`cairn.systemd.cgroup_is_empty`, in the VM."""
    code = "import sys; from cairn.systemd import cgroup_is_empty as e; print(e(sys.argv[1]))"
    out = vm.exec(["python3", "-I", "-c", code, cgroup]).stdout.decode().strip()
    assert out in ("True", "False"), out
    return out == "True"


def sample_while(
    vm: VirtualMachine, cgroup: str, names: tuple[str, ...], done: Callable[[dict[str, str]], bool]
) -> list[dict[str, str]]:
    """Read ``names`` of ``cgroup`` repeatedly until ``done`` holds or the cgroup is gone."""
    samples: list[dict[str, str]] = []
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        files = cgroup_files(vm, cgroup, *names)
        if files is None:
            return samples
        samples.append(files)
        if done(files):
            return samples
        time.sleep(0.5)
    pytest.fail(f"{cgroup} still exists after {RUN_TIMEOUT:.0f} s: {samples[-1:]}")


def journal_lines(vm: VirtualMachine, run_id: str) -> list[str]:
    return vm.journal(run_id=run_id).splitlines()


# -- MemoryMax -------------------------------------------------------------------------


class OomRun:
    def __init__(self, run_id: str, project: str, cgroup: str, files: dict[str, str]) -> None:
        self.run_id = run_id
        self.project = project
        self.cgroup = cgroup
        self.files = files
        self.data: dict[str, Any] = {}


@pytest.fixture(scope="module")
def oom_run(vm: VirtualMachine) -> OomRun:
    """A run whose agent touches more memory than MemoryMax, finished."""
    assert vm.memory_mib << 20 > ALLOCATION_CAP + (512 << 20), "the VM is too small"
    project = make_project(vm, "oom")
    run_id = launch(vm, project, [{"action": "run", "argv": ["python3", "-c", ALLOCATE]}])
    cgroup = wait_agent_cgroup(vm, agent_unit(run_id))
    files = cgroup_files(vm, cgroup, "memory.max", "memory.swap.max")
    assert files is not None, f"{cgroup} vanished before its limits could be read"
    result = OomRun(run_id, project, cgroup, files)
    result.data = wait_finished(vm, run_id)
    return result


def test_memory_max_is_enforced_by_the_kernel_and_fails_the_run(
    vm: VirtualMachine, oom_run: OomRun
) -> None:
    assert oom_run.files["memory.max"] == str(LIMITS.memory_max)
    assert oom_run.files["memory.swap.max"] == "0"

    data = oom_run.data
    assert data["run"]["state"] == "failed"
    (op,) = data["operations"]
    assert op["state"] != "committed"
    assert not op.get("checkpoint")
    assert vm.read(f"{oom_run.project}/CHANGELOG.md") == "# Changelog\n"

    # The kernel's OOM report names the agent's cgroup as the constraint, not the machine.
    kernel = vm.exec(["journalctl", "-k", "--no-pager", "--output=cat"]).stdout.decode()
    reports = [line for line in kernel.splitlines() if f"oom_memcg={oom_run.cgroup}," in line]
    assert reports, kernel[-3000:]
    assert all("constraint=CONSTRAINT_MEMCG" in line for line in reports)
    assert "Out of memory: Killed" not in kernel  # no machine-wide OOM

    unit = agent_unit(oom_run.run_id)
    assert f"{unit}: Failed with result 'oom-kill'." in journal_lines(vm, oom_run.run_id)
    assert cgroup_gone_or_empty(vm, oom_run.cgroup)


def test_oom_error_names_the_memory_limit(oom_run: OomRun) -> None:
    error = oom_run.data["run"]["error"] or ""
    assert "MemoryMax" in error, error


# -- TasksMax --------------------------------------------------------------------------


def test_tasks_max_stops_a_fork_bomb(vm: VirtualMachine) -> None:
    project = make_project(vm, "forkbomb")
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["python3", "-c", FORK_BOMB]},
        {"action": "append", "path": "CHANGELOG.md", "content": "- survived a fork bomb\n"},
    ]
    run_id = launch(vm, project, steps)
    cgroup = wait_agent_cgroup(vm, agent_unit(run_id))
    # A run is background work (units/cairn.slice): its agent is placed under cairn.slice,
    # which weighs 20 against the 100 of the services people use.
    assert cgroup.startswith("/cairn.slice/cairn-agents.slice/"), cgroup
    assert vm.read("/sys/fs/cgroup/cairn.slice/cpu.weight").strip() == "20"
    assert vm.read("/sys/fs/cgroup/system.slice/cpu.weight").strip() == "100"

    def refused_forks(files: dict[str, str]) -> bool:
        return keyed(files["pids.events"])["max"] > 0

    samples = sample_while(vm, cgroup, ("pids.current", "pids.max", "pids.events"), refused_forks)
    assert samples and refused_forks(samples[-1]), f"the kernel never refused a fork: {samples}"
    assert {s["pids.max"] for s in samples} == {str(LIMITS.tasks_max)}
    assert max(int(s["pids.current"]) for s in samples) <= LIMITS.tasks_max

    # The machine outside the agent's cgroup still forks and answers.
    started = time.monotonic()
    assert vm.exec(["sh", "-c", "echo alive"], timeout=60).stdout == b"alive\n"
    assert time.monotonic() - started < 30

    data = wait_finished(vm, run_id)
    assert data["run"]["state"] == "succeeded", f"{data['run']['error']}\n{context(vm, run_id)}"
    # The bomb was stopped by the limit (EAGAIN), not by anything else, and only there:
    # the worker and its Python child hold a few of the unit's tasks.
    forks = json.loads(vm.read(f"{project}/forks.json"))
    assert forks["refused"] == "EAGAIN"
    assert LIMITS.tasks_max - 16 <= forks["forked"] < LIMITS.tasks_max
    # The agent itself kept running under the limit and finished its work.
    assert vm.read(f"{project}/CHANGELOG.md") == "# Changelog\n- survived a fork bomb\n"
    assert cgroup_gone_or_empty(vm, cgroup)


# -- the cgroup-empty proof ------------------------------------------------------------


def wait_stray(vm: VirtualMachine, timeout: float = 120) -> int:
    """The PID of the agent's stray ``sleep``, once the agent started it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = vm.exec(["pgrep", "-f", f"^sleep {STRAY_SLEEP}$"], check=False).stdout.split()
        if len(found) > 1:
            pytest.fail(f"more than one stray process: {found}")
        if found:
            return int(found[0])
        time.sleep(0.5)
    pytest.fail(f"the agent's stray process did not appear within {timeout:.0f} s")


def test_checkpoint_waits_for_an_empty_agent_cgroup(vm: VirtualMachine) -> None:
    project = make_project(vm, "stray")
    steps: list[dict[str, Any]] = [
        # A process that outlives the agent's main process unless systemd ends it.
        {"action": "run", "argv": ["sh", "-c", f"sleep {STRAY_SLEEP} >/dev/null 2>&1 &"]},
        {"action": "sleep", "seconds": 15},
        {"action": "append", "path": "CHANGELOG.md", "content": "- left a stray process\n"},
    ]
    run_id = launch(vm, project, steps)
    unit = agent_unit(run_id)
    cgroup = wait_agent_cgroup(vm, unit)

    stray = wait_stray(vm)
    stray_cgroup = vm.read(f"/proc/{stray}/cgroup").strip()
    assert stray_cgroup == f"0::{cgroup}"
    events = cgroup_files(vm, cgroup, "cgroup.events")
    assert events is not None and keyed(events["cgroup.events"])["populated"] == 1
    assert not broker_says_empty(vm, cgroup)

    data = wait_finished(vm, run_id)
    assert data["run"]["state"] == "succeeded", f"{data['run']['error']}\n{context(vm, run_id)}"
    assert vm.exec(["pgrep", "-f", f"^sleep {STRAY_SLEEP}$"], check=False).returncode == 1
    assert cgroup_gone_or_empty(vm, cgroup)
    assert broker_says_empty(vm, cgroup)

    # The unit (with its stray) was gone before the boundary committed its checkpoint.
    lines = journal_lines(vm, run_id)
    ended = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(unit)}: Consumed ", line)]
    committed = [i for i, line in enumerate(lines) if "boundary-committed root-1" in line]
    assert ended and committed, "\n".join(lines[-40:])
    assert ended[0] < committed[0]


# -- the emulator itself -----------------------------------------------------------------

# Every cpu.max that leaves or returns to "max" flips the kernel's cfs-bandwidth static key,
# so the kernel rewrites a jump in its own scheduler code while the other vCPU runs it. With
# one host thread per vCPU (tcg,thread=multi), QEMU 7.2 let that vCPU execute the half-patched
# instruction: the guest panicked within seconds, and in CI during an agent's first launch.
FLIP_CPU_QUOTA = """
echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/quota-flips
( echo $BASHPID > /sys/fs/cgroup/quota-flips/cgroup.procs; while :; do /bin/true; done ) &
busy=$!
end=$(( $(date +%s) + 20 ))
flips=0
while [ "$(date +%s)" -lt "$end" ]; do
  echo "20000 100000" > /sys/fs/cgroup/quota-flips/cpu.max
  echo max > /sys/fs/cgroup/quota-flips/cpu.max
  flips=$((flips + 1))
done
kill "$busy"; wait "$busy" 2>/dev/null
echo "$flips"
"""


def test_the_guest_kernel_survives_cpu_quota_flips(vm: VirtualMachine) -> None:
    flips = int(vm.exec(["bash", "-c", FLIP_CPU_QUOTA], timeout=180).stdout)
    assert flips > 20, flips
    assert vm.exec(["sh", "-c", "echo alive"], timeout=60).stdout == b"alive\n"
    kernel = vm.exec(["journalctl", "-k", "--no-pager", "--output=cat"]).stdout.decode()
    assert "Oops" not in kernel and "BUG:" not in kernel, kernel[-3000:]
