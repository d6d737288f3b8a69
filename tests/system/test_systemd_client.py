"""cairn.systemd and cairn.unitprops against a real systemd PID 1 (Debian 13, systemd 257).

One machine (the harness in ``machine.py``, package installed) serves the whole module.
Each test runs a short Python program inside it, using the installed ``cairn`` package as
root, and checks the JSON it prints.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import TEST_USERS, Machine

RUN = "flow_" + "5a" * 16

PRELUDE = """
import json, os, socket, sys, time
from jeepney import DBusAddress, HeaderFields, new_signal
from jeepney.io.blocking import open_dbus_connection
from cairn.errors import NotFound, SystemdError
from cairn.systemd import Systemd, cgroup_is_empty
from cairn.unitprops import AgentUnitSpec, agent_unit_name, agent_unit_properties

def shell_props(script, kind="exec", collect="inactive-or-failed"):
    return [
        ("Type", "s", kind),
        ("ExecStart", "a(sasb)", [("/bin/sh", ["/bin/sh", "-c", script], False)]),
        ("CollectMode", "s", collect),
    ]

def unit_processes(sd, name):
    # GetUnitProcesses: (cgroup, pid, command line) of each process; root never asks it
    (procs,) = sd._manager_call("GetUnitProcesses", "s", (name,))
    return procs

out = {}
"""


@pytest.fixture(scope="module")
def machine(deb: Path) -> Iterator[Machine]:
    with Machine(deb) as booted:
        yield booted


def inside(machine: Machine, body: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``body`` (after PRELUDE, with ``args`` in sys.argv[1:]) in the machine as root;
    return the ``out`` dict it prints."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    result = machine.exec(["python3", "-I", "-c", code, *args], timeout=timeout, check=False)
    if result.returncode != 0:
        pytest.fail(f"script failed in the machine:\n{result.stderr.decode(errors='replace')}")
    parsed: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return parsed


def test_success_result_and_cgroup_emptiness(machine: Machine) -> None:
    out = inside(
        machine,
        """
        name = "cairn-test-ok.service"
        with Systemd() as sd:
            job = sd.start_transient_service(
                name, shell_props("echo written > /var/tmp/ok.txt; sleep 1"))
            started = sd.wait_started(job)
            out["started"] = started.model_dump()
            running = sd.unit_state(name)
            out["running"] = running.model_dump()
            out["empty_while_running"] = cgroup_is_empty(running.control_group)
            out["procs_while_running"] = len(unit_processes(sd, name))
            final = sd.wait_inactive(name, 30)
            out["final"] = final.model_dump()
            out["empty_after"] = cgroup_is_empty(final.control_group)
            out["procs_after"] = unit_processes(sd, name)
            out["file"] = open("/var/tmp/ok.txt").read()
            sd.unref(name)
            deadline = time.monotonic() + 10
            while sd.unit_state(name) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            out["after_unref"] = sd.unit_state(name)
    """,
    )
    running, final = out["running"], out["final"]
    # wait_started returns the state it read for the outcome: the unit, running
    assert out["started"] == running and running["active_state"] == "active"
    assert running["load_state"] == "loaded"
    assert running["main_pid"] > 0
    assert len(running["invocation_id"]) == 32
    assert running["control_group"].endswith("/cairn-test-ok.service")
    assert out["empty_while_running"] is False
    assert out["procs_while_running"] >= 1
    assert final["active_state"] == "inactive"
    assert final["result"] == "success"
    assert (final["exec_main_code"], final["exec_main_status"]) == (1, 0)  # CLD_EXITED, 0
    assert final["invocation_id"] == running["invocation_id"]
    assert final["control_group"] == running["control_group"]
    assert out["empty_after"] is True
    assert out["procs_after"] == []
    assert out["file"] == "written\n"
    assert out["after_unref"] is None  # collected once the pin is gone


def test_failing_service_reports_exit_code(machine: Machine) -> None:
    out = inside(
        machine,
        """
        name = "cairn-test-fail.service"
        with Systemd() as sd:
            sd.wait_started(sd.start_transient_service(name, shell_props("exit 7")))
            out["final"] = sd.wait_inactive(name, 30).model_dump()
            sd.unref(name)
    """,
    )
    assert out["final"]["active_state"] == "failed"
    assert out["final"]["result"] == "exit-code"
    assert out["final"]["exec_main_status"] == 7


def test_missing_binary_fails_the_start_job(machine: Machine) -> None:
    out = inside(
        machine,
        """
        name = "cairn-test-missing.service"
        props = [("Type", "s", "exec"),
                 ("ExecStart", "a(sasb)", [("/nonexistent/bin", ["/nonexistent/bin"], False)])]
        with Systemd() as sd:
            job = sd.start_transient_service(name, props)
            try:
                sd.wait_started(job)
                out["error"] = None
            except SystemdError as e:
                out["error"] = str(e)
            out["state"] = sd.unit_state(name).model_dump()
            sd.unref(name)
    """,
    )
    assert out["error"] is not None
    assert "cairn-test-missing.service" in out["error"]
    assert "'failed'" in out["error"]
    assert "203" in out["error"]  # EXIT_EXEC
    assert out["state"]["result"] == "exit-code"
    assert "\n" not in out["error"]


def test_reused_name_is_refused_with_unit_exists(machine: Machine) -> None:
    out = inside(
        machine,
        """
        name = "cairn-test-reuse.service"
        with Systemd() as sd:
            sd.wait_started(sd.start_transient_service(name, shell_props("sleep 0.2")))
            try:
                sd.start_transient_service(name, shell_props("true"))
                out["error"] = None
            except SystemdError as e:
                out["error"] = str(e)
            sd.wait_inactive(name, 30)
            sd.unref(name)
    """,
    )
    assert out["error"] is not None
    assert "org.freedesktop.systemd1.UnitExists" in out["error"]
    assert "new unit name" in out["error"]


def test_bad_property_is_refused_and_leaves_no_unit(machine: Machine) -> None:
    out = inside(
        machine,
        """
        name = "cairn-test-badprop.service"
        with Systemd() as sd:
            try:
                props = shell_props("true") + [("NoSuchSetting", "b", True)]
                sd.start_transient_service(name, props)
                out["error"] = None
            except SystemdError as e:
                out["error"] = str(e)
            out["state"] = sd.unit_state(name)
    """,
    )
    assert out["error"] is not None and "NoSuchSetting" in out["error"]
    assert out["state"] is None


def test_unknown_unit_reads_as_none_without_loading_a_stub(machine: Machine) -> None:
    out = inside(
        machine,
        """
        with Systemd() as sd:
            out["state"] = sd.unit_state("cairn-never-existed.service")
            try:
                sd.wait_inactive("cairn-never-existed.service", 5)
                out["wait"] = "returned"
            except NotFound as e:
                out["wait"] = str(e)
    """,
    )
    assert out["state"] is None
    assert "not loaded" in out["wait"]
    listed = machine.exec(["systemctl", "list-units", "--all", "--no-legend", "cairn-never*"])
    assert listed.stdout.decode().strip() == ""


def test_forged_signals_are_ignored(machine: Machine) -> None:
    """A JobRemoved sent straight to the client by another connection changes nothing."""
    out = inside(
        machine,
        """
        name = "cairn-test-forged.service"
        with Systemd() as sd:
            # oneshot: the start job ends only when the process exits, a second from now
            job = sd.start_transient_service(name, shell_props("sleep 1", kind="oneshot"))
            forger = open_dbus_connection(bus="SYSTEM")
            emitter = DBusAddress("/org/freedesktop/systemd1",
                                  interface="org.freedesktop.systemd1.Manager")
            forged = new_signal(emitter, "JobRemoved", "uoss", (1, job, name, "failed"))
            forged.header.fields[HeaderFields.destination] = sd._conn.unique_name
            forger.send(forged)
            forger.close()
            started = time.monotonic()
            try:
                sd.wait_started(job)
                out["error"] = None
            except SystemdError as e:
                out["error"] = str(e)
            out["waited"] = time.monotonic() - started
            out["final"] = sd.wait_inactive(name, 30).model_dump()
            sd.unref(name)
    """,
    )
    assert out["error"] is None
    assert out["waited"] > 0.5  # it waited for the real job, not the forged one
    assert out["final"]["result"] == "success"


WATCHER = """
import json, sys
from cairn.systemd import Systemd
with Systemd() as sd:
    print(json.dumps(sd.wait_inactive(sys.argv[1], 30).model_dump()))
"""


def test_unprivileged_watcher_reads_the_result(machine: Machine) -> None:
    """The coordinator's use: a non-root process waits for a unit the root side pinned."""
    out = inside(machine, f'''
        import subprocess
        name = "cairn-test-watched.service"
        with Systemd() as sd:
            sd.wait_started(sd.start_transient_service(name, shell_props("sleep 1; exit 4")))
            watcher = subprocess.run(
                ["setpriv", "--reuid={TEST_USERS["alice"]}", "--regid={TEST_USERS["alice"]}",
                 "--clear-groups", "python3", "-I", "-c", sys.argv[1], name],
                capture_output=True, text=True, timeout=60)
            out["returncode"] = watcher.returncode
            out["stderr"] = watcher.stderr
            out["seen"] = json.loads(watcher.stdout) if watcher.returncode == 0 else None
            sd.unref(name)
    ''', WATCHER)
    assert out["returncode"] == 0, out["stderr"]
    assert out["seen"]["active_state"] == "failed"
    assert out["seen"]["exec_main_status"] == 4


def test_stop_timeout_and_reset_failed(machine: Machine) -> None:
    out = inside(
        machine,
        """
        name = "cairn-test-stop.service"
        failed = "cairn-test-keep.service"
        with Systemd() as sd:
            sd.wait_started(sd.start_transient_service(name, shell_props("sleep 60")))
            try:
                sd.wait_inactive(name, 0.5)
                out["timeout"] = None
            except SystemdError as e:
                out["timeout"] = str(e)
            cg = sd.unit_state(name).control_group
            sd.stop_unit(name)
            out["stopped"] = sd.wait_inactive(name, 30).model_dump()
            out["empty"] = cgroup_is_empty(cg)
            sd.unref(name)
            sd.stop_unit("cairn-never-existed.service")  # already stopped: no error

            # default CollectMode keeps a failed unit loaded until reset-failed
            sd.wait_started(sd.start_transient_service(
                failed, shell_props("exit 3", collect="inactive")))
            sd.wait_inactive(failed, 30)
            sd.unref(failed)
            time.sleep(0.3)
            out["kept"] = sd.unit_state(failed).active_state
            sd.reset_failed(failed)
            deadline = time.monotonic() + 10
            while sd.unit_state(failed) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            out["after_reset"] = sd.unit_state(failed)
            sd.reset_failed(failed)  # gone: nothing to reset, no error
    """,
    )
    assert out["timeout"] is not None and "still active" in out["timeout"]
    assert out["stopped"]["active_state"] == "inactive"
    assert out["stopped"]["exec_main_code"] == 2  # CLD_KILLED by the stop's SIGTERM
    assert out["stopped"]["exec_main_status"] == 15
    assert out["empty"] is True
    assert out["kept"] == "failed"
    assert out["after_reset"] is None


AGENT_SCRIPT = r"""
r=/outputs/report
{
echo "uid=$(id -u)"
echo "gid=$(id -g)"
echo "pwd=$(pwd)"
echo x > /workspace/written && echo "workspace_writable=yes"
echo "varlib=$(ls -A /var/lib/cairn | wc -l)"
ls -A /home >/dev/null 2>&1 && echo "home=listable" || echo "home=denied"
ls /etc/cairn >/dev/null 2>&1 && echo "etc_cairn=listable" || echo "etc_cairn=denied"
echo "netns=$(readlink /proc/self/ns/net)"
echo "netdevs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ,)"
echo "incoming=$(cat /evidence/incoming/b1/workspace/old.txt)"
touch /evidence/new 2>/dev/null && echo "evidence=writable" || echo "evidence=read-only"
echo "index=$(cat /evidence/index.json)"
python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect("/run/cairn/agent/agent.sock")' \
  && echo "relay=connected"
python3 -c 'import socket; socket.socket(socket.AF_INET)' 2>/dev/null \
  && echo "inet=allowed" || echo "inet=refused"
echo "home_env=$HOME"
echo "extra=$CAIRN_TEST_VALUE"
} > $r 2>&1
echo "agent finished for the journal"
"""


def test_agent_property_set_runs_sandboxed(machine: Machine) -> None:
    uid = TEST_USERS["alice"]
    out = inside(
        machine,
        f'''
        RUN = "{RUN}"
        uid = {uid}
        base = f"/var/lib/cairn/pool/runs/{{RUN}}"
        for d in ("W", "evidence/incoming/b1/workspace", "outputs", "state", "S"):
            os.makedirs(f"{{base}}/{{d}}", exist_ok=True)
            os.chown(f"{{base}}/{{d}}", uid, uid)
        with open(f"{{base}}/S/old.txt", "w") as f:
            f.write("from-checkpoint")
        with open(f"{{base}}/evidence/index.json", "w") as f:
            f.write("{{}}")
        os.makedirs("/etc/cairn", exist_ok=True)
        sockdir = f"/run/cairn/agents/{{RUN}}/op1"
        os.makedirs(sockdir, exist_ok=True)
        relay = socket.socket(socket.AF_UNIX)
        relay.bind(f"{{sockdir}}/agent.sock")
        os.chmod(f"{{sockdir}}/agent.sock", 0o666)
        relay.listen()
        spec = AgentUnitSpec(
            run_id=RUN, op_id="op1", uid=uid, gid=uid,
            exec_argv=["/bin/sh", "-c", sys.argv[1]],
            workspace=f"{{base}}/W", evidence_dir=f"{{base}}/evidence",
            incoming=[("b1", f"{{base}}/S")], outputs=f"{{base}}/outputs",
            state=f"{{base}}/state", channel_dir=sockdir, capsule=None,
            memory_max=512 << 20, tasks_max=64, cpu_quota_percent=150, runtime_max_sec=60,
            io_weight=50, network="none", environment={{"CAIRN_TEST_VALUE": "v1"}},
            log_fields={{"CAIRN_RUN": RUN, "CAIRN_OP": "op1"}},
        )
        name = agent_unit_name(RUN, "op1", 1)
        with Systemd() as sd:
            sd.wait_started(sd.start_transient_service(name, agent_unit_properties(spec)))
            final = sd.wait_inactive(name, 60)
            out["final"] = final.model_dump()
            out["empty"] = cgroup_is_empty(final.control_group)
            sd.unref(name)
        out["report"] = open(f"{{base}}/outputs/report").read()
        out["written_owner"] = os.stat(f"{{base}}/W/written").st_uid
        out["host_netns"] = os.readlink("/proc/self/ns/net")
    ''',
        AGENT_SCRIPT,
    )
    final = out["final"]
    assert final["result"] == "success", out
    assert final["control_group"].startswith("/cairn.slice/cairn-agents.slice/")
    assert out["empty"] is True
    report = dict(line.split("=", 1) for line in out["report"].splitlines() if "=" in line)
    assert report["uid"] == str(uid), report
    assert report["gid"] == str(uid)
    assert report["pwd"] == "/workspace"
    assert report["workspace_writable"] == "yes"
    assert out["written_owner"] == uid
    assert report["varlib"] == "0"
    assert report["home"] == "denied"
    assert report["etc_cairn"] == "denied"
    assert report["netns"].startswith("net:[")
    assert report["netns"] != out["host_netns"]  # a private network namespace
    assert report["netdevs"] == "lo,"
    assert report["incoming"] == "from-checkpoint"
    assert report["evidence"] == "read-only"
    assert report["index"] == "{}"
    assert report["relay"] == "connected"
    assert report["inet"] == "refused"
    assert report["home_env"] == "/state"
    assert report["extra"] == "v1"
    journal = machine.journal(run_id=RUN)
    assert "agent finished for the journal" in journal
