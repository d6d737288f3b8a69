"""Escapes tried as an attacker would, in a booted machine with the package installed.

An agent is an adversary and so is every other local user. Each test here is one way out
that was open once (the sandbox issue): through the owner's other processes, into another
run, into another user's results, through files an agent leaves for a more trusted
process, through the journal, and through settlement. A probe runs inside a real agent
unit (a scripted agent's ``run`` step) and reports what it could reach; the tests assert
on that report and on what the host shows afterwards.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_definitions_installed import SOURCE as TRUSTED_SOURCE
from test_definitions_installed import put, trust_project
from test_end_to_end import cairn, finished, launch, make_project, show, wait_for, write_script

REPO = Path(__file__).resolve().parents[2]
CHANGELOG_SCRIPT = json.loads((REPO / "docs/examples/changelog-agent.json").read_text())

# Runs inside the agent unit as the run owner. argv[1] is the launch's objective: JSON
# with the host PIDs of the owner's other processes and a run to forge journal lines for.
PROBE = r"""
import json, os, socket, subprocess, sys
task = json.loads(sys.argv[1])
out = {}

def attempt(name, fn):
    try:
        out[name] = ["ok", fn()]
    except Exception as exc:
        out[name] = ["error", type(exc).__name__]

out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
attempt("pid1_cmdline", lambda: open("/proc/1/cmdline", "rb").read().replace(b"\0", b" ").decode())
for pid in task["owner_pids"]:
    attempt(f"proc_root_{pid}", lambda pid=pid: os.listdir(f"/proc/{pid}/root/home"))
    attempt(f"proc_cwd_{pid}", lambda pid=pid: os.listdir(f"/proc/{pid}/cwd"))
# Every process the agent can see: none may lead outside the unit's own mounts.
leaks = []
for pid in out["pids"]:
    for sub in ("root/home/alice", "root/var/lib/cairn/pool/runs", "root/run/user"):
        try:
            os.listdir(f"/proc/{pid}/{sub}")
            leaks.append(f"{pid}/{sub}")
        except OSError:
            pass
out["proc_leaks"] = leaks
attempt("home", lambda: os.listdir("/home/alice"))
attempt("pool", lambda: os.listdir("/var/lib/cairn/pool/runs"))
attempt("journal_db", lambda: os.listdir("/var/lib/cairn/journal"))
attempt("etc_cairn", lambda: os.listdir("/etc/cairn"))
attempt("run_listing", lambda: sorted(os.listdir("/run")))
attempt("run_cairn_listing", lambda: sorted(os.listdir("/run/cairn")))

def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    finally:
        s.close()
    return "connected"

for name, path in (
    ("system_bus", "/run/dbus/system_bus_socket"),
    ("pid1_private", "/run/systemd/private"),
    ("user_manager", "/run/user/1001/systemd/private"),
    ("user_bus", "/run/user/1001/bus"),
    ("cairnd", "/run/cairn/cairnd.sock"),
    ("broker", "/run/cairn/broker.sock"),
):
    attempt(name, lambda path=path: connect(path))

def forge(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        msg = f"MESSAGE=FORGED-AGENT-{task['token']}\nCAIRN_RUN={task['victim']}\n"
        s.sendto(msg.encode(), path)
    finally:
        s.close()
    return "sent"

THROUGH = {
    "user_manager": "run/user/1001/systemd/private",
    "cairnd": "run/cairn/cairnd.sock",
    "system_bus": "run/dbus/system_bus_socket",
}
for pid in task["owner_pids"]:
    for name, path in THROUGH.items():
        attempt(f"via_{pid}_{name}", lambda p=f"/proc/{pid}/root/{path}": connect(p))

attempt("journal_native", lambda: forge("/run/systemd/journal/socket"))
attempt("journal_devlog", lambda: forge("/dev/log"))
attempt("systemctl_list", lambda: subprocess.run(
    ["systemctl", "list-units", "--no-legend", "cairn-*"], capture_output=True, timeout=20
).stdout.decode())
attempt("systemctl_user", lambda: subprocess.run(
    ["systemctl", "--user", "start", "nonexistent.service"], capture_output=True, timeout=20,
    env={"XDG_RUNTIME_DIR": "/run/user/1001", "PATH": "/usr/bin:/bin"},
).returncode)
attempt("shm_write", lambda: open(f"/dev/shm/cairn-escape-{task['token']}", "w").write("left"))
out["shm_mount"] = [l for l in open("/proc/self/mountinfo") if " /dev/shm " in l]
os.makedirs("escape", exist_ok=True)
with open("escape/probe.json", "w") as fh:
    json.dump(out, fh)
"""


def probe_script(token: str) -> dict[str, Any]:
    return {
        "steps": [{"action": "run", "argv": ["/usr/bin/python3", "-I", "-c", PROBE, "{prompt}"]}],
        "output": {"summary": "probed"},
        "handoff": "",
    }


def main_pid(machine: Machine, unit: str) -> int:
    out = machine.exec(["systemctl", "show", "-p", "MainPID", "--value", unit]).stdout
    return int(out.decode().strip())


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    """One machine for the module: every test makes its own projects and runs in it."""
    with Machine(deb, with_pool=True) as machine:
        machine.enable_user_manager("alice")
        # A process of the owner outside any sandbox, as a shell or an editor would be.
        machine.exec(
            ["systemd-run", "--unit=alice-editor", "--uid=alice", "--gid=alice",
             "-p", "WorkingDirectory=/home/alice", "/bin/sleep", "3600"]
        )
        yield machine


@pytest.fixture(scope="module")
def victim(booted: Machine) -> str:
    """A finished run of alice's: what the probe tries to forge journal lines into."""
    project = make_project(booted)
    run_id = launch(booted, project, write_script(booted, CHANGELOG_SCRIPT), "victim entry")
    wait_for(booted, run_id, finished)
    return run_id


@pytest.fixture(scope="module")
def probe(booted: Machine, victim: str) -> dict[str, Any]:
    """Run the probe in a real agent unit; its report, plus what the host saw meanwhile."""
    token = secrets.token_hex(6)
    owner_pids = [
        main_pid(booted, "alice-editor.service"),
        main_pid(booted, "user@1001.service"),
    ]
    project = "/home/alice/probe"
    booted.exec(["mkdir", "-p", project], user="alice")
    booted.exec(["tee", f"{project}/README"], user="alice", input=b"probe\n")
    path = "/home/alice/probe-agent.json"
    booted.exec(["tee", path], user="alice", input=json.dumps(probe_script(token)).encode())
    objective = json.dumps({"owner_pids": owner_pids, "victim": victim, "token": token})
    run_id = launch(booted, project, path, objective)
    data = wait_for(booted, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    report = json.loads(booted.exec(["cat", f"{project}/escape/probe.json"]).stdout)
    return {
        "report": report,
        "token": token,
        "run_id": run_id,
        "owner_pids": owner_pids,
        "victim": victim,
    }


def refused(result: list[Any]) -> bool:
    first: object = result[0]
    return first == "error"


# -- the owner's other processes ----------------------------------------------------


def test_agent_sees_only_its_own_processes(probe: dict[str, Any]) -> None:
    report = probe["report"]
    assert "/runtime/capsule/cairn-worker" in report["pid1_cmdline"][1], report["pid1_cmdline"]
    assert max(report["pids"]) < 50, report["pids"]
    assert not set(probe["owner_pids"]) & set(report["pids"])


def test_no_proc_root_or_cwd_of_the_owners_other_processes(probe: dict[str, Any]) -> None:
    report = probe["report"]
    for pid in probe["owner_pids"]:
        assert refused(report[f"proc_root_{pid}"]), report[f"proc_root_{pid}"]
        assert refused(report[f"proc_cwd_{pid}"]), report[f"proc_cwd_{pid}"]


@pytest.mark.parametrize("target", ["user_manager", "cairnd", "system_bus"])
def test_no_socket_through_the_owners_other_processes(probe: dict[str, Any], target: str) -> None:
    for pid in probe["owner_pids"]:
        result = probe["report"][f"via_{pid}_{target}"]
        assert refused(result), (pid, result)


def test_no_visible_process_leads_outside_the_unit(probe: dict[str, Any]) -> None:
    assert probe["report"]["proc_leaks"] == []


# kill(-1) reaches every process the caller may signal: in its own PID namespace that is
# nothing (the worker is the namespace's init, which kill(-1) skips).
KILL_ALL = r"""
import os, signal
try:
    os.kill(-1, signal.SIGKILL)
    result = "signalled"
except ProcessLookupError:
    result = "nothing to signal"
open("kill-all.txt", "w").write(result)
"""


def test_kill_all_reaches_nothing_outside_the_unit(booted: Machine, probe: dict[str, Any]) -> None:
    editor = probe["owner_pids"][0]
    project = make_project(booted)
    script = {
        "steps": [{"action": "run", "argv": ["/usr/bin/python3", "-I", "-c", KILL_ALL]}],
        "output": {"summary": "killed"},
        "handoff": "",
    }
    run_id = launch(booted, project, write_script(booted, script), "kill everything")
    data = wait_for(booted, run_id, finished)
    state = booted.exec(["systemctl", "is-active", "alice-editor.service"], check=False)
    assert state.stdout.decode().strip() == "active"
    assert main_pid(booted, "alice-editor.service") == editor
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert booted.exec(["cat", f"{project}/kill-all.txt"]).stdout == b"nothing to signal"


# -- the owner's home, the user manager, cairnd, the system bus ----------------------


def test_no_home_and_no_cairn_state(probe: dict[str, Any]) -> None:
    report = probe["report"]
    for name in ("home", "pool", "journal_db", "etc_cairn"):
        assert refused(report[name]) or report[name][1] == [], (name, report[name])


def test_run_holds_nothing_but_the_agents_channel(probe: dict[str, Any]) -> None:
    report = probe["report"]
    assert set(report["run_listing"][1]) <= {"cairn", "systemd"}, report["run_listing"]
    assert report["run_cairn_listing"] == ["ok", ["agent"]]


@pytest.mark.parametrize("socket_name", ["user_manager", "user_bus"])
def test_no_user_manager(probe: dict[str, Any], socket_name: str) -> None:
    assert refused(probe["report"][socket_name]), probe["report"][socket_name]


def test_systemctl_user_cannot_start_anything(probe: dict[str, Any]) -> None:
    result = probe["report"]["systemctl_user"]
    assert result[0] == "error" or result[1] != 0


@pytest.mark.parametrize("socket_name", ["cairnd", "broker"])
def test_no_cairn_socket(probe: dict[str, Any], socket_name: str) -> None:
    assert refused(probe["report"][socket_name]), probe["report"][socket_name]


@pytest.mark.parametrize("socket_name", ["system_bus", "pid1_private"])
def test_no_system_bus_or_pid1(probe: dict[str, Any], socket_name: str) -> None:
    assert refused(probe["report"][socket_name]), probe["report"][socket_name]


def test_systemctl_lists_no_runs(probe: dict[str, Any]) -> None:
    result = probe["report"]["systemctl_list"]
    assert result[0] == "error" or "flow_" not in result[1], result


def test_no_keyring_calls_in_an_agent_unit(booted: Machine) -> None:
    """Kernel keyrings belong to the UID, not to a namespace, so the agent's filter has no
    keyring calls. (nspawn filters them for the whole machine, so what an agent gets from
    keyctl() here proves nothing: the test reads the running unit's filter instead.)"""
    project = fresh_project(booted)
    steps = [{"action": "sleep", "seconds": 6}]
    script = {"steps": steps, "output": {"summary": "slept"}, "handoff": ""}
    run_id = launch(booted, project, write_script(booted, script), "sleep")
    unit = f"cairn-agent-{run_id}-root-1-1.service"
    deadline = time.monotonic() + 60
    while booted.exec(["systemctl", "is-active", unit], check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{unit} never became active"
        time.sleep(0.2)
    shown = booted.exec(["systemctl", "show", "-p", "SystemCallFilter", "--value", unit])
    allowed = set(shown.stdout.decode().split())
    assert {"openat", "read", "ioctl"} <= allowed
    assert not allowed & {"keyctl", "add_key", "request_key"}
    wait_for(booted, run_id, finished)


def test_dev_shm_is_the_units_own(booted: Machine, probe: dict[str, Any]) -> None:
    assert probe["report"]["shm_write"][0] == "ok"
    (mount,) = probe["report"]["shm_mount"]
    assert " tmpfs " in mount
    left = booted.exec(["ls", "-A", "/dev/shm"]).stdout.decode()
    assert f"cairn-escape-{probe['token']}" not in left


# -- the journal -----------------------------------------------------------------------


@pytest.mark.parametrize("socket_name", ["journal_native", "journal_devlog"])
def test_agent_cannot_reach_the_journal_socket(probe: dict[str, Any], socket_name: str) -> None:
    assert refused(probe["report"][socket_name]), probe["report"][socket_name]


def test_forged_lines_of_another_user_never_appear_in_cairn_logs(
    booted: Machine, victim: str
) -> None:
    token = secrets.token_hex(6)
    booted.exec(
        ["logger", "--journald"], user="bob",
        input=f"MESSAGE=FORGED-BOB-{token}\nCAIRN_RUN={victim}\nPRIORITY=3\n".encode(),
    )
    deadline = time.monotonic() + 10
    # The forged entry is in the journal with the victim's CAIRN_RUN= (so the test can
    # fail), and absent from the victim's view.
    while f"FORGED-BOB-{token}" not in booted.journal(run_id=victim):
        assert time.monotonic() < deadline, "journald did not take the forged entry"
        time.sleep(0.2)
    logs = cairn(booted, "logs", victim)
    assert f"FORGED-BOB-{token}" not in logs
    assert "cairn-agent[" in logs and "boundary-committed" in logs, logs[-2000:]


def test_forged_fields_select_nothing_whatever_cairn_logs_is_asked(
    booted: Machine, victim: str
) -> None:
    """Bob sends what the trusted matches look for, as plain fields: the victim's
    CAIRN_RUN=, UNIT= of its coordinator (only PID 1's counts), a _SYSTEMD_UNIT= (journald
    drops fields a client starts with '_'), at priority err; and a line that looks like
    journalctl's cursor. No filter or format of cairn logs shows any of it."""
    token = secrets.token_hex(6)
    unit = f"cairn-coordinator@{victim}.service"
    booted.exec(
        ["logger", "--journald"], user="bob",
        input=(
            f"MESSAGE=FORGED-FIELDS-{token}\nCAIRN_RUN={victim}\nUNIT={unit}\n"
            f"_SYSTEMD_UNIT={unit}\nOBJECT_SYSTEMD_UNIT={unit}\nPRIORITY=3\n"
        ).encode(),
    )
    booted.exec(["logger", "--", f"-- cursor: s=0;i=1 FORGED-FIELDS-{token}"], user="bob")
    deadline = time.monotonic() + 10
    while f"FORGED-FIELDS-{token}" not in booted.journal(run_id=victim):
        assert time.monotonic() < deadline, "journald did not take the forged entry"
        time.sleep(0.2)
    for options in ([], ["-o", "json"], ["-p", "err"], ["-o", "cat", "-n", "10000"],
                    ["--since", "1 hour ago", "-o", "verbose"]):
        shown = cairn(booted, "logs", *options, victim)
        assert f"FORGED-FIELDS-{token}" not in shown, options
    assert "boundary-committed" in cairn(booted, "logs", "-o", "cat", victim)


def test_cairn_logs_show_the_runs_own_units_by_trusted_fields(
    booted: Machine, probe: dict[str, Any]
) -> None:
    logs = cairn(booted, "logs", probe["run_id"])
    assert f"FORGED-AGENT-{probe['token']}" not in cairn(booted, "logs", probe["victim"])
    assert "cairn-agent[" in logs and "cairn-helper[" in logs
    assert "Started cairn-agent-" in logs or "Deactivated successfully" in logs


def test_coordinator_entries_carry_the_run_and_priorities(booted: Machine) -> None:
    project = make_project(booted)
    script = {"steps": [{"action": "run", "argv": ["/bin/false"]}], "output": {}, "handoff": ""}
    run_id = launch(booted, project, write_script(booted, script), "fail")
    data = wait_for(booted, run_id, finished, timeout=240)
    assert data["run"]["state"] == "failed"
    unit = f"cairn-coordinator@{run_id}.service"
    errors = booted.exec(
        ["journalctl", "--no-pager", "-o", "cat", "-p", "err", "-u", unit]
    ).stdout.decode()
    assert "failed" in errors, errors
    fields = booted.exec(
        ["journalctl", "--no-pager", "-o", "json", "-u", unit, "-n", "20"]
    ).stdout.decode()
    entries = [json.loads(line) for line in fields.splitlines() if line.strip()]
    # the coordinator's own records: journald's native protocol (or stdout where that is
    # unreachable); LogExtraFields= tags both with the run
    own = [e for e in entries if e.get("_TRANSPORT") in ("journal", "stdout")]
    assert own and all(e.get("CAIRN_RUN") == run_id for e in own), own[-3:]


# -- run IDs and per-run directories ---------------------------------------------------


@pytest.mark.parametrize(
    "directory",
    ["/run/cairn/agents", "/run/cairn/egress", "/run/cairn/egress-skipped",
     "/var/lib/cairn/pool/runs"],
)
def test_other_users_cannot_list_run_ids(
    booted: Machine, probe: dict[str, Any], directory: str
) -> None:
    proc = booted.exec(["ls", directory], user="bob", check=False)
    assert proc.returncode != 0 and probe["run_id"] not in proc.stdout.decode()
    assert booted.exec(["test", "-d", directory]).returncode == 0


def test_only_the_broker_makes_or_removes_the_flag_that_skips_a_runs_egress(
    booted: Machine, probe: dict[str, Any]
) -> None:
    """The probe's run has no model provider, so the broker flagged its egress unit to be
    skipped; neither its owner, another user nor the coordinator's user can remove that
    flag, or make one for another run (which would cut that run off from its providers)."""
    flag = f"/run/cairn/egress-skipped/{probe['run_id']}"
    other = "/run/cairn/egress-skipped/flow_" + "0" * 32
    for user in ("alice", "bob", "cairn"):
        for argv in (["rm", "-f", flag], ["touch", other]):
            proc = booted.exec(argv, user=user, check=False)
            assert proc.returncode != 0 and "Permission denied" in proc.stderr.decode(), argv
    assert booted.exec(["test", "-f", flag]).returncode == 0
    assert booted.exec(["test", "-e", other], check=False).returncode != 0


def test_other_users_cannot_read_a_runs_checkpoint(booted: Machine, probe: dict[str, Any]) -> None:
    data = show(booted, probe["run_id"])
    checkpoint = data["operations"][0]["checkpoint"]["s"]["path"]
    assert booted.exec(["test", "-e", f"{checkpoint}/escape/probe.json"]).returncode == 0
    for user in ("bob", "alice"):
        proc = booted.exec(["cat", f"{checkpoint}/escape/probe.json"], user=user, check=False)
        assert proc.returncode != 0, user


def test_a_finished_runs_channel_directory_is_gone(booted: Machine, probe: dict[str, Any]) -> None:
    channel = f"/run/cairn/agents/{probe['run_id']}"
    assert booted.exec(["test", "-e", channel], check=False).returncode != 0


# -- files an agent leaves for a more trusted process ----------------------------------


def fresh_project(machine: Machine, user: str = "alice") -> str:
    """A project of its own for one test: src/ with two files, and a CHANGELOG."""
    project = f"/home/{user}/p-{secrets.token_hex(4)}"
    machine.exec(["mkdir", "-p", f"{project}/src/pkg"], user=user)
    for name, text in (
        ("CHANGELOG.md", "# Changelog\n"),
        ("src/app.py", "print('hi')\n"),
        ("src/pkg/lib.py", "X = 1\n"),
    ):
        machine.exec(["tee", f"{project}/{name}"], user=user, input=text.encode())
    return project


def run_script(
    machine: Machine, steps: list[dict[str, Any]], objective: str, user: str = "alice",
    timeout: float = 240, project: str | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """Launch builtin:implement with a scripted agent doing ``steps`` (in a fresh project
    unless one is given); wait for the end."""
    project = project or fresh_project(machine, user)
    script = {"steps": steps, "output": {"summary": "{prompt}"}, "handoff": "done"}
    path = f"/home/{user}/agent-{secrets.token_hex(4)}.json"
    machine.exec(["tee", path], user=user, input=json.dumps(script).encode())
    out = cairn(
        machine, "launch", "builtin:implement", "--project", project,
        "--args", json.dumps({"objective": objective}),
        "--scripted", f"builtin:implementer={path}", user=user,
    )
    run_id = out.strip().splitlines()[-1]
    deadline = time.monotonic() + timeout
    while True:
        data = json.loads(cairn(machine, "show", run_id, "--json", user=user))
        if finished(data):
            return project, run_id, data
        if time.monotonic() > deadline:
            pytest.fail(f"{run_id} did not finish: {cairn(machine, 'logs', run_id, user=user)}")
        time.sleep(0.5)


def tree(machine: Machine, project: str) -> str:
    """Every entry of a project with its type, mode and content hash, for byte-identity."""
    script = f"cd {project} && find . -printf '%y %m %p %l\\n' | sort && " \
             "find . -type f -print0 | sort -z | xargs -0 sha256sum"
    return machine.exec(["sh", "-c", script]).stdout.decode()


@pytest.fixture(scope="module")
def bobs_run(booted: Machine) -> tuple[str, str]:
    """A finished run of bob's whose output names a secret only bob may see."""
    secret = f"BOB-SECRET-{secrets.token_hex(6)}"
    steps = CHANGELOG_SCRIPT["steps"]
    _project, run_id, data = run_script(booted, steps, secret, user="bob")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    return run_id, secret


def test_a_result_file_symlink_to_another_users_run_is_not_followed(
    booted: Machine, bobs_run: tuple[str, str]
) -> None:
    bob_run, secret = bobs_run
    target = f"/var/lib/cairn/runs/{bob_run}/ops/root-1/outputs.1/finish.json"
    assert secret.encode() in booted.exec(["cat", target]).stdout
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["ln", "-s", "{prompt}", "/outputs/finish.json"]},
        {"action": "run", "argv": ["/bin/false"]},
    ]
    _project, run_id, data = run_script(booted, steps, target)
    assert data["run"]["state"] == "failed"
    shown = cairn(booted, "show", run_id, "--json")
    assert secret not in shown and secret not in cairn(booted, "logs", run_id)
    assert not [e for e in data["events"] if e["event"] == "op-finished"]  # no result taken


def test_another_users_run_is_never_named_by_prefix_or_at_last(
    booted: Machine, bobs_run: tuple[str, str]
) -> None:
    """A unique prefix of bob's run ID, typed by alice, names nothing; her @last is hers."""
    bob_run, secret = bobs_run
    prefix = bob_run.removeprefix("flow_")[:8]
    assert bob_run in cairn(booted, "show", prefix, "--json", user="bob")
    proc = booted.exec(["cairn", "show", prefix, "--json"], user="alice", check=False)
    assert proc.returncode != 0
    assert f"no run {prefix}" in proc.stderr.decode()
    assert secret.encode() not in proc.stdout + proc.stderr
    mine = booted.exec(["cairn", "show", "@last", "--json"], user="alice", check=False)
    assert secret.encode() not in mine.stdout + mine.stderr
    if mine.returncode == 0:
        assert json.loads(mine.stdout)["run"]["run_id"] != bob_run


def test_another_users_run_cannot_be_replayed_into_ones_own(
    booted: Machine, bobs_run: tuple[str, str]
) -> None:
    """Alice replaying bob's run would get his checkpoints reminted into a run of hers:
    cairnd names no such run, records nothing, and no subvolume of hers appears."""
    bob_run, secret = bobs_run
    runs = booted.exec(["ls", "/var/lib/cairn/pool/runs"]).stdout.decode().split()
    proc = booted.exec(["cairn", "replay", bob_run, "--through", "root-1"], user="alice",
                       check=False)
    assert proc.returncode != 0
    assert f"no run {bob_run}" in proc.stderr.decode()
    assert secret.encode() not in proc.stdout + proc.stderr
    assert booted.exec(["ls", "/var/lib/cairn/pool/runs"]).stdout.decode().split() == runs


def test_an_entry_the_agent_made_unreadable_is_refused_by_name(booted: Machine) -> None:
    """An agent that takes its own read permission away cannot fail the owner's candidate
    unit: that file is refused by name and the rest is applied."""
    steps: list[dict[str, Any]] = [
        {"action": "write", "path": "src/locked.py", "content": "x\n"},
        {"action": "run", "argv": ["chmod", "000", "src/locked.py"]},
        {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    ]
    project, run_id, data = run_script(booted, steps, "locked")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    refused = data["settlement"]["candidate"]["refused"]
    assert refused == [{"path": "src/locked.py", "reason": "not readable by its owner (mode 0000)"}]
    assert data["settlement_summary"]["label"] == "applied, 1 refused"
    assert booted.exec(["test", "-e", f"{project}/src/locked.py"], check=False).returncode != 0
    assert b"- locked" in booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout


def test_a_fifo_result_file_does_not_hang_the_run(booted: Machine) -> None:
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["mkfifo", "/outputs/finish.json"]},
        {"action": "run", "argv": ["/bin/false"]},
    ]
    started = time.monotonic()
    _project, run_id, data = run_script(booted, steps, "fifo", timeout=150)
    assert data["run"]["state"] == "failed", data["run"]["error"]
    assert "ended without finish_work" in data["run"]["error"]
    assert time.monotonic() - started < 150


def test_a_fifo_or_symlink_service_result_is_not_followed(booted: Machine) -> None:
    """The record of how the unit ended is written in the agent's /outputs: a FIFO there
    must neither hang the coordinator nor turn into a fake limit."""
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["mkfifo", "/outputs/service-result"]},
        {"action": "run", "argv": ["/bin/false"]},
    ]
    _project, run_id, data = run_script(booted, steps, "fifo", timeout=200)
    assert data["run"]["state"] == "failed"
    assert "ended without finish_work" in data["run"]["error"], data["run"]["error"]


# -- settlement ------------------------------------------------------------------------


def test_a_directory_replaced_by_a_refused_symlink_keeps_its_files(booted: Machine) -> None:
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["rm", "-rf", "src"]},
        {"action": "run", "argv": ["ln", "-s", "/etc", "src"]},
    ]
    project = fresh_project(booted)
    before = tree(booted, project)
    _project, run_id, data = run_script(booted, steps, "swap src", project=project)
    refused = {r["path"]: r["reason"] for r in data["settlement"]["candidate"]["refused"]}
    assert "src" in refused and "src/app.py" in refused and "src/pkg/lib.py" in refused
    assert data["settlement"]["candidate"]["accepted"] == []
    assert tree(booted, project) == before
    summary = data["settlement_summary"]
    assert summary["complete"] is False and "refused" in summary["label"]
    ps = json.loads(cairn(booted, "ps", "--json"))
    (row,) = [r for r in ps if r["run_id"] == run_id]
    assert "refused" in row["settlement_summary"]["label"]
    assert "refused" in cairn(booted, "ps")


def test_files_in_a_nested_subvolume_are_reported_refused(booted: Machine) -> None:
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["btrfs", "subvolume", "create", "src/nest"]},
        {"action": "write", "path": "src/nest/secret.txt", "content": "x\n"},
        {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    ]
    project, run_id, data = run_script(booted, steps, "nest")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    refused = data["settlement"]["candidate"]["refused"]
    reason = "nested subvolume: its contents are not part of the proposal"
    assert refused == [{"path": "src/nest", "reason": reason}]
    assert data["settlement_summary"]["label"] == "applied, 1 refused"
    assert booted.exec(["test", "-e", f"{project}/src/nest"], check=False).returncode != 0
    assert b"- nest" in booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout


def test_nested_subvolumes_of_failed_attempts_are_removed(booted: Machine) -> None:
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["btrfs", "subvolume", "create", "nest"]},
        {"action": "write", "path": "nest/f", "content": "x\n"},
        {"action": "run", "argv": ["btrfs", "subvolume", "create", "nest/inner"]},
        {"action": "run", "argv": ["btrfs", "property", "set", "nest", "ro", "true"]},
        {"action": "run", "argv": ["/bin/false"]},
    ]
    _project, run_id, data = run_script(booted, steps, "nest and fail")
    assert data["run"]["state"] == "failed"
    scopes = f"/var/lib/cairn/pool/runs/{run_id}/scopes/root"
    assert booted.exec(["ls", scopes]).stdout.decode().split() == ["W.3"]
    listed = booted.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"]).stdout.decode()
    assert f"{run_id}/scopes/root/W.1" not in listed and f"{run_id}/scopes/root/W.2" not in listed


def test_files_changed_without_a_byte_written_reach_the_live_project(booted: Machine) -> None:
    """The agent changes two files without writing a byte: a reflink of another file of
    the same size, a truncate back to the same size. The settlement's tree search (no
    extent of either is newer than Q) still sees both, and the live project gets them."""
    project = fresh_project(booted)
    for name, byte in (("src/a.bin", b"a"), ("src/b.bin", b"b"), ("src/c.bin", b"c")):
        booted.exec(["tee", f"{project}/{name}"], user="alice", input=byte * 8192)
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["cp", "--reflink=always", "src/b.bin", "src/a.bin"]},
        {"action": "run", "argv": ["sh", "-c",
                                   "truncate -s 0 src/c.bin && truncate -s 8192 src/c.bin"]},
    ]
    _project, run_id, data = run_script(booted, steps, "no byte written", project=project)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert sorted(data["settlement"]["apply"]["applied"]) == ["src/a.bin", "src/c.bin"]
    assert booted.exec(["cat", f"{project}/src/a.bin"]).stdout == b"b" * 8192
    assert booted.exec(["cat", f"{project}/src/c.bin"]).stdout == bytes(8192)
    candidate = booted.journal(unit=f"cairn-candidate-{run_id}.service")
    assert "changes from a tree search" in candidate, candidate[-2000:]


BIND_SOCKET = "import socket; socket.socket(socket.AF_UNIX).bind('src/sock')"


def test_fifos_and_sockets_in_the_proposal_are_reported_refused(booted: Machine) -> None:
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["mkfifo", "src/pipe"]},
        {"action": "run", "argv": ["/usr/bin/python3", "-c", BIND_SOCKET]},
        {"action": "run", "argv": ["sh", "-c", "rm src/app.py && mkfifo src/app.py"]},
        {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    ]
    project, _run_id, data = run_script(booted, steps, "special files")
    refused = {r["path"]: r["reason"] for r in data["settlement"]["candidate"]["refused"]}
    assert refused == {"src/app.py": "fifo", "src/pipe": "fifo", "src/sock": "socket"}
    assert data["settlement_summary"]["label"] == "applied, 3 refused"
    assert booted.exec(["cat", f"{project}/src/app.py"]).stdout == b"print('hi')\n"


# -- the control worker, as if review had a hole -----------------------------------------

HOSTILE_WORKFLOW = r"""
import json, os, socket
def t(f):
    try:
        f()
        return "ALLOWED"
    except OSError as e:
        return e.strerror
r = {p: t(lambda p=p: open(p, "rb").read(1)) for p in [
    "/var/lib/cairn/journal/journal.db", "/var/lib/cairn/broker/receipts.db"]}
r.update({"ls " + d: t(lambda d=d: os.listdir(d)) for d in [
    "/var/lib/cairn", "/var/lib/cairn/runs", "/etc/cairn"]})
r.update({s: t(lambda s=s: socket.socket(socket.AF_UNIX).connect(s)) for s in [
    "/run/cairn/broker.sock", "/run/cairn/cairnd.sock"]})
r["write"] = t(lambda: open("/var/lib/cairn/runs/x", "w"))
r["exec"] = t(lambda: os.execv("/bin/sh", ["sh"]))
r["kill_parent"] = t(lambda: os.kill(os.getppid(), 0))
raise RuntimeError(json.dumps(r))
"""

SPAWN_WORKER = """
import sys
from cairn.protocol.control import StartWorkflow
from cairn.proc import make_env
from cairn.workflow import runtime
w = runtime.spawn(make_env())
start = StartWorkflow(source=open(sys.argv[1]).read(), filename="wf.py", args={})
w.stdin.write(start.model_dump_json() + "\\n")
w.stdin.flush()
print(w.stdout.readline().strip())
print("status", w.wait())
"""
# Lines of the coordinator's unit that are not its sandbox.
NOT_SANDBOX = ("ExecStart=", "Type=", "Restart", "ImportCredential=", "LogExtraFields=")


def coordinator_sandbox(machine: Machine) -> list[str]:
    """The installed coordinator unit's [Service] settings, as ``systemd-run -p`` args."""
    text = machine.exec(["cat", "/usr/lib/systemd/system/cairn-coordinator@.service"])
    service = text.stdout.decode().split("[Service]", 1)[1]
    args: list[str] = []
    for raw in service.splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and not line.startswith(NOT_SANDBOX):
            args += ["-p", line.replace("%i", "flow_" + "0" * 32)]
    return args


def test_hostile_code_in_the_control_worker_reaches_nothing(booted: Machine) -> None:
    """The worker runs with the coordinator's own unit sandbox (as user cairn, the owner of
    the journal); only its own sandbox stands between workflow code and Cairn's state."""
    # Not under /tmp or /var/tmp: the unit's PrivateTmp= would hide it.
    booted.exec(["tee", "/opt/hostile.py"], input=HOSTILE_WORKFLOW.encode())
    booted.exec(["chmod", "0644", "/opt/hostile.py"])
    proc = booted.exec(
        ["systemd-run", "--wait", "--pipe", "--quiet", *coordinator_sandbox(booted),
         "/usr/bin/python3", "-I", "-c", SPAWN_WORKER, "/opt/hostile.py"],
        timeout=120,
    )
    first, status = proc.stdout.decode().strip().splitlines()[-2:]
    failure = json.loads(first)
    assert failure["type"] == "failure" and status == "status 1", proc.stdout
    report = json.loads(failure["error"][failure["error"].index("{"):])
    assert len(report) == 10
    allowed = {k: v for k, v in report.items() if v == "ALLOWED"}
    assert not allowed, report


def test_a_trusted_project_definition_an_agent_rewrote_is_refused(booted: Machine) -> None:
    """An agent can change a project, and its change is applied; it cannot change the
    owner's trust decision, so the definition it rewrote no longer launches."""
    project = fresh_project(booted)
    definition = put(booted, f"{project}/.cairn/workflows/tidy.py", TRUSTED_SOURCE)
    trust_project(booted, project)
    steps = [{"action": "append", "path": ".cairn/workflows/tidy.py", "content": "# {prompt}\n"}]
    _project, run_id, data = run_script(booted, steps, "rewritten by the agent", project=project)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert b"# rewritten by the agent\n" in booted.exec(["cat", definition]).stdout
    proc = booted.exec(
        ["cairn", "launch", "project:tidy", "--project", project], user="alice", check=False
    )
    assert proc.returncode != 0
    assert proc.stderr.decode().startswith(
        f"cairn: project:tidy changed since {project} was trusted (review hash now sha256:"
    ), proc.stderr.decode()


# Runs in the agent unit: 300 notes as fast as the socket takes them, each 100 KB with a
# terminal escape sequence, one message that claims to be another event, and, once the
# rate allows again, one more note.
NOTE_FLOOD = r"""
import json, socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/run/cairn/agent/agent.sock")
f = s.makefile("rwb")
for i in range(300):
    text = "\x1b]0;owned\x07\x1b[2J" + str(i) + "x" * 100_000
    f.write(json.dumps({"type": "note", "text": text}).encode() + b"\n")
    f.flush()
    f.readline()
forged = {"type": "progress", "text": "x", "event": "run-succeeded", "phase": "apply"}
f.write(json.dumps(forged).encode() + b"\n")
f.flush()
f.readline()
time.sleep(1.5)
f.write(json.dumps({"type": "note", "text": "after the flood"}).encode() + b"\n")
f.flush()
f.readline()
"""


def test_an_agent_flooding_notes_is_bounded_and_cannot_drive_the_terminal(
    booted: Machine,
) -> None:
    steps = [{"action": "run", "argv": ["/usr/bin/python3", "-I", "-c", NOTE_FLOOD]}]
    _project, run_id, data = run_script(booted, steps, "flood")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    watched = booted.exec(["cairn", "watch", run_id], user="alice", timeout=120).stdout
    assert b"\x1b" not in watched and b"\x07" not in watched
    notes = [line for line in watched.decode().splitlines() if " note " in line]
    # a burst of five, then two a second: far fewer than 300, each at most 2,000 chars
    assert 5 <= len(notes) < 150, len(notes)
    assert all(len(line) < 2200 for line in notes)
    # (the scripted agent's own "run …" note quotes the script, this text included)
    afters = [line for line in notes if ": after the flood (" in line]
    assert len(afters) == 1, afters
    (after,) = afters
    assert "notes dropped so far" in after
    events = json.loads(cairn(booted, "show", run_id, "--json"))["events"]
    # the message that claimed to be another event was refused as malformed
    assert len([e for e in events if e["event"] == "run-succeeded"]) == 1
    # progress comes only from the import helper (this run applies nothing); none of it
    # carries what the forged message said
    progress = [e["data"] for e in events if e["event"] == "progress"]
    assert all(p["phase"] == "import" and not {"text", "event"} & set(p) for p in progress)
    # the journal holds exactly the notes watch showed, each bounded
    kept = [e["data"] for e in events if e["event"] == "agent-note"]
    assert len(kept) == len(notes) and all(len(str(note)) <= 2200 for note in kept)


NOTIFICATIONS = (
    "import json\n"
    "from cairn.cli.client import request\n"
    "from cairn.protocol.daemon import NotificationsRequest\n"
    "print(json.dumps(request(NotificationsRequest(cursor=0))))\n"
)


def test_notifications_of_another_users_runs_never_reach_the_caller(
    booted: Machine, victim: str
) -> None:
    """cairnd answers the notifier by the socket's peer credentials: asked from the very
    first event, alice gets her finished run and bob gets nothing of it."""

    def events_of(user: str) -> list[dict[str, Any]]:
        out = booted.exec(["/usr/bin/python3", "-I", "-c", NOTIFICATIONS], user=user)
        return list(json.loads(out.stdout)["events"])

    state = json.loads(cairn(booted, "show", victim, "--json"))["run"]["state"]
    assert [e["event"] for e in events_of("alice") if e["run_id"] == victim] == [state]
    assert [e for e in events_of("bob") if e["run_id"] == victim] == []


# -- retention -------------------------------------------------------------------------


def test_another_user_cannot_delete_a_run_by_id_or_prefix(
    booted: Machine, bobs_run: tuple[str, str]
) -> None:
    bob_run, _secret = bobs_run
    for ref in (bob_run, bob_run.removeprefix("flow_")[:8]):
        proc = booted.exec(["cairn", "rm", "--yes", ref], user="alice", check=False)
        assert proc.returncode != 0
        assert "no run" in proc.stderr.decode(), proc.stderr
    would = booted.exec(["cairn", "prune", "--keep", "0", "--dry-run"], user="alice")
    assert bob_run not in would.stdout.decode()
    kept = booted.exec(["test", "-d", f"/var/lib/cairn/pool/runs/{bob_run}/checkpoints"],
                       check=False)
    assert kept.returncode == 0


def test_deleting_a_run_follows_no_link_it_left_and_takes_its_own_subvolumes(
    booted: Machine,
) -> None:
    precious = "/home/alice/precious.txt"
    booted.exec(["tee", precious], user="alice", input=b"keep me\n")
    steps: list[dict[str, Any]] = [
        {"action": "run", "argv": ["ln", "-s", precious, "link"]},
        {"action": "run", "argv": ["ln", "-s", "/home/alice", "/state/home"]},
        {"action": "run", "argv": ["btrfs", "subvolume", "create", "nest"]},
        {"action": "write", "path": "nest/f", "content": "x\n"},
        {"action": "run", "argv": ["btrfs", "property", "set", "nest", "ro", "true"]},
        {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    ]
    _project, run_id, data = run_script(booted, steps, "links and nests")
    assert data["settlement"] is not None, data["run"]["error"]

    out = cairn(booted, "rm", "--yes", run_id)

    assert out.startswith(f"deleted {run_id} ("), out
    assert booted.exec(["cat", precious]).stdout == b"keep me\n"
    assert booted.exec(["test", "-d", "/home/alice"], check=False).returncode == 0
    listed = booted.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"]).stdout.decode()
    assert run_id not in listed
    gone = booted.exec(["test", "-e", f"/var/lib/cairn/pool/runs/{run_id}"], check=False)
    assert gone.returncode != 0


def test_doctors_check_of_applied_paths_follows_no_link_and_reads_as_the_owner(
    booted: Machine,
) -> None:
    """The owner replaces an applied file with a link to a file only root may read: the
    check unit (run as the owner, the live project read-only) reports the path changed
    and neither follows the link nor shows a byte of its target."""
    steps = [{"action": "write", "path": "src/added.py", "content": "added\n"}]
    project, run_id, data = run_script(booted, steps, "check my links")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    booted.exec(["rm", f"{project}/src/added.py"], user="alice")
    booted.exec(["ln", "-s", "/etc/shadow", f"{project}/src/added.py"], user="alice")
    before = tree(booted, project)

    proc = booted.exec(["cairn", "doctor", run_id, "--json"], user="alice", check=False)
    report = json.loads(proc.stdout)
    (run,) = report["runs"]
    assert run["problems"] == [], run
    assert run["applied"]["changed"] == 1
    assert any(w.startswith("src/added.py in the live project") for w in run["warnings"])
    assert "root:" not in proc.stdout.decode()
    assert tree(booted, project) == before


MEASURED_WORKFLOW = '''
from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Outcome(Model):
    summary: str


change = agent(profile="test:change", access="write", output=Outcome)


@workflow(description="An agent's change, measured.", input=Goal, output=Outcome)
async def run(flow, args: Goal) -> Outcome:
    await flow.agent(change, prompt=args.goal)
    measured = await flow.measure_proposal("escape-score", metrics={
        "score": {"unit": "points", "direction": "lower"}})
    return Outcome(summary=str(measured["values"]))
'''
READ_SCORE = """\
argv = ["/bin/sh", "-c", "printf '{\\"cairn_metrics\\": {\\"score\\": %s}}\\\\n' \
\\"$(cat score.txt)\\""]
timeout_sec = 60
"""


def test_an_agent_cannot_make_an_evaluator_read_what_its_owner_may_not(
    booted: Machine,
) -> None:
    """The agent replaces the file the host's evaluator reads with a link to /etc/shadow:
    the evaluator runs as the project's owner in its unit, so the read fails, the
    measurement fails by name, and nothing of the file reaches the record."""
    booted.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
    booted.exec(["tee", "/etc/cairn/evaluators.d/escape-score.toml"], input=READ_SCORE.encode())
    try:
        project = fresh_project(booted, "alice")
        booted.exec(["tee", f"{project}/score.txt"], user="alice", input=b"3\n")
        booted.exec(["tee", "/home/alice/measured.py"], user="alice",
                    input=MEASURED_WORKFLOW.encode())
        steps = [{"action": "run", "argv": ["rm", "score.txt"]},
                 {"action": "run", "argv": ["ln", "-s", "/etc/shadow", "score.txt"]}]
        script = {"steps": steps, "output": {"summary": "linked"}, "handoff": "linked"}
        booted.exec(["tee", "/home/alice/link-score.json"], user="alice",
                    input=json.dumps(script).encode())
        review = cairn(booted, "workflow", "review", "/home/alice/measured.py")
        review_hash = review.strip().splitlines()[-1].split()[-1]
        out = cairn(booted, "launch", "/home/alice/measured.py", "--confirm", review_hash,
                    "--project", project, "--args", '{"goal": "g"}',
                    "--scripted", "test:change=/home/alice/link-score.json")
        run_id = out.strip().splitlines()[-1]
        data = wait_for(booted, run_id, finished)
    finally:
        booted.exec(["rm", "-f", "/etc/cairn/evaluators.d/escape-score.toml"])
    assert data["run"]["state"] == "failed"
    assert "no metric line" in data["run"]["error"]
    (measure,) = [o for o in data["operations"] if o["kind"] == "measure_proposal"]
    assert measure["state"] == "failed" and "no metric line" in measure["error"]
    shadow_root = booted.exec(["sh", "-c", "head -c 20 /etc/shadow"]).stdout.decode()
    record = json.dumps(data) + booted.journal(run_id=run_id)
    assert shadow_root and shadow_root not in record
    assert booted.exec(["readlink", f"{project}/score.txt"], check=False).returncode != 0


def test_a_launch_argument_cannot_reach_an_evaluator_outside_the_hosts_directory(
    booted: Machine,
) -> None:
    """The owner's workflow lets a launch argument name its evaluator; the owner writes an
    evaluator file of her own and names it by a path out of /etc/cairn/evaluators.d. The
    launch is refused before the run exists, and her command never runs."""
    source = MEASURED_WORKFLOW.replace(
        "    goal: str = Field(min_length=1)\n",
        "    goal: str = Field(min_length=1)\n    evaluator: str\n",
    ).replace('flow.measure_proposal("escape-score", ', "flow.measure_proposal(args.evaluator, ")
    booted.exec(["tee", "/home/alice/chosen.py"], user="alice", input=source.encode())
    booted.exec(["tee", "/home/alice/evil.toml"], user="alice", input=(
        b'argv = ["/bin/sh", "-c", "touch /tmp/evaluator-escaped"]\ntimeout_sec = 5\n'
    ))
    script = {"steps": [], "output": {"summary": "none"}, "handoff": "none"}
    booted.exec(["tee", "/home/alice/no-change.json"], user="alice",
                input=json.dumps(script).encode())
    review = cairn(booted, "workflow", "review", "/home/alice/chosen.py")
    assert "measures with the host evaluator named by the argument 'evaluator'" in review
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = fresh_project(booted, "alice")
    before = json.loads(cairn(booted, "list", "--json"))
    for name in ("../../../home/alice/evil", "/home/alice/evil"):
        proc = booted.exec(
            ["cairn", "launch", "/home/alice/chosen.py", "--confirm", review_hash,
             "--project", project, "--args", json.dumps({"goal": "g", "evaluator": name}),
             "--scripted", "test:change=/home/alice/no-change.json"],
            user="alice", check=False)
        assert proc.returncode != 0
        assert f"names evaluator {name!r}, which is not configured" in proc.stderr.decode()
    assert json.loads(cairn(booted, "list", "--json")) == before
    assert booted.exec(["test", "-e", "/tmp/evaluator-escaped"], check=False).returncode != 0


# A host check that runs the project's own script: the agent wrote that script, so the
# check unit runs the agent's code, as the owner, over a writable copy of F.
AGENT_CHECK_SCRIPT = r"""#!/bin/sh
try() {
    name=$1; shift
    if "$@" >/dev/null 2>&1; then echo "ESCAPED $name"; else echo "held $name"; fi
}
try home touch /home/alice/escaped-by-check
try shadow cat /etc/shadow
try parent touch ../escaped-parent
try pool ls /var/lib/cairn/pool/runs
try journal_db ls /var/lib/cairn/journal
try inet python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM)'
try user_bus python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect("/run/user/1001/bus")'
btrfs subvolume create nested-by-check >/dev/null 2>&1 && echo "made nested"
setsid sleep 617 </dev/null >/dev/null 2>&1 &
echo "check done"
"""
RUN_AGENT_CHECK = """\
argv = ["/bin/sh", "check.sh"]
timeout_sec = 60
[match]
projects = ["{project}"]
"""


def test_a_proposal_check_running_the_agents_script_reaches_nothing(booted: Machine) -> None:
    """The verifier runs a script the agent wrote: it cannot write outside its copy, read
    what the owner may not, reach the network or the owner's bus, leave a process
    behind, or leave a subvolume that keeps the copy from being deleted."""
    project = fresh_project(booted, "alice")
    booted.exec(["mkdir", "-p", "/etc/cairn/verifiers.d"])
    booted.exec(["tee", "/etc/cairn/verifiers.d/agent-script.toml"],
                input=RUN_AGENT_CHECK.format(project=project).encode())
    try:
        steps = [{"action": "write", "path": "check.sh", "content": AGENT_CHECK_SCRIPT}]
        _, run_id, data = run_script(booted, steps, "a check of my own", project=project)
    finally:
        booted.exec(["rm", "-f", "/etc/cairn/verifiers.d/agent-script.toml"])
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    (check,) = data["settlement"]["verification"]["checks"]
    output = check["output"]
    assert check["passed"] is True and "check done" in output, output
    assert "ESCAPED" not in output, output
    for name in ("home", "shadow", "parent", "pool", "journal_db", "inet", "user_bus"):
        assert f"held {name}" in output, output
    for path in ("/home/alice/escaped-by-check", f"{project}/escaped-parent",
                 f"/var/lib/cairn/pool/runs/{run_id}/verify"):
        assert booted.exec(["test", "-e", path], check=False).returncode != 0, path
    assert "sleep 617" not in booted.exec(["ps", "-eo", "args"]).stdout.decode()
    assert booted.exec(["test", "-e", f"{project}/nested-by-check"], check=False).returncode != 0
    assert b"try()" in booted.exec(["cat", f"{project}/check.sh"]).stdout


def test_a_reviewer_that_writes_changes_nothing_in_the_live_project(booted: Machine) -> None:
    """builtin:review has read-only agents only; a reviewer that writes anyway (into its own
    workspace, if it can write at all) reaches nothing: the run has no settlement and the
    live project is byte for byte as it was."""
    project = fresh_project(booted, "alice")
    before = tree(booted, project)
    steps = [{"action": "write", "path": "CHANGELOG.md", "content": "rewritten\n"},
             {"action": "write", "path": "planted.txt", "content": "{title}\n"}]
    script = {"steps": steps, "handoff": "wrote",
              "output": {"verdict": "approve", "summary": "fine", "findings": []}}
    booted.exec(["tee", "/home/alice/writing-reviewer.json"], user="alice",
                input=json.dumps(script).encode())
    out = cairn(booted, "launch", "builtin:review", "--project", project,
                "--args", json.dumps({"focus": "anything", "reviewers": 2}),
                "--scripted", "builtin:reviewer=/home/alice/writing-reviewer.json")
    data = wait_for(booted, out.strip().splitlines()[-1], finished)
    assert data["run"]["state"] in ("succeeded", "failed")
    assert data["settlement"] is None
    assert tree(booted, project) == before
