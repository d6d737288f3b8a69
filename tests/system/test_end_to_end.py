"""End to end on real systemd and real Btrfs, driven only through cairn, systemctl and
journalctl inside a throwaway machine, as a user would."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "docs" / "examples" / "changelog-agent.json").read_text()


def cairn(machine: Machine, *argv: str, user: str = "alice", check: bool = True) -> str:
    proc = machine.exec(["cairn", *argv], user=user, check=check, timeout=120)
    return proc.stdout.decode()


def make_project(machine: Machine, user: str = "alice") -> str:
    project = f"/home/{user}/demo"
    machine.exec(["mkdir", "-p", f"{project}/src", f"{project}/empty"], user=user)
    machine.exec(["tee", f"{project}/CHANGELOG.md"], user=user, input=b"# Changelog\n")
    machine.exec(["tee", f"{project}/src/app.py"], user=user, input=b"print('hi')\n")
    return project


def write_script(machine: Machine, script: dict[str, Any] | str, user: str = "alice") -> str:
    path = f"/home/{user}/agent.json"
    text = script if isinstance(script, str) else json.dumps(script)
    machine.exec(["tee", path], user=user, input=text.encode())
    return path


def launch(machine: Machine, project: str, script: str, objective: str) -> str:
    out = cairn(
        machine,
        "launch",
        "builtin:implement",
        "--project",
        project,
        "--args",
        json.dumps({"objective": objective}),
        "--scripted",
        f"builtin:implementer={script}",
    )
    return out.strip().splitlines()[-1]


def show(machine: Machine, run_id: str, user: str = "alice") -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json", user=user))
    return data


def wait_for(machine: Machine, run_id: str, predicate: Any, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data = show(machine, run_id)
        if predicate(data):
            return data
        if time.monotonic() > deadline:
            journal = machine.journal(run_id=run_id)[-4000:]
            broker = machine.journal(unit="cairn-broker.service")[-3000:]
            pytest.fail(f"run {run_id} stuck at {data['run']['state']}:\n{journal}\n{broker}")
        time.sleep(0.5)


def finished(data: dict[str, Any]) -> bool:
    return data["run"]["state"] in ("succeeded", "failed", "cancelled")


def test_run_applies_change_to_live_project(machine: Machine) -> None:
    project = make_project(machine)
    script = write_script(machine, SCRIPT)
    run_id = launch(machine, project, script, "add a CHANGELOG entry")
    assert run_id.startswith("flow_")

    data = wait_for(machine, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    changelog = machine.exec(["cat", f"{project}/CHANGELOG.md"]).stdout.decode()
    assert changelog == "# Changelog\n- add a CHANGELOG entry\n"
    (op,) = data["operations"]
    assert op["state"] == "committed"
    assert op["output"] == {"summary": "Added a CHANGELOG entry: add a CHANGELOG entry"}
    assert data["settlement"]["status"] == "applied"
    assert data["settlement"]["apply"]["applied"] == ["CHANGELOG.md"]

    # The checkpoint is a read-only Btrfs snapshot holding the agent's result.
    checkpoint = op["checkpoint"]["s"]["path"]
    assert machine.exec(["btrfs", "property", "get", checkpoint, "ro"]).stdout.strip() == b"ro=true"
    assert b"- add a CHANGELOG entry" in machine.exec(["cat", f"{checkpoint}/CHANGELOG.md"]).stdout

    ps = json.loads(cairn(machine, "ps", "--json"))
    assert [r["run_id"] for r in ps] == [run_id]
    diff = cairn(machine, "diff", run_id)
    assert "+- add a CHANGELOG entry" in diff

    # The run's units are visible in the journal by run ID, and through cairn logs.
    units = data["units"]
    assert units[0] == f"cairn-coordinator@{run_id}.service"
    assert f"cairn-import-{run_id}.service" in units
    assert f"cairn-agent-{run_id}-root-1-1.service" in units
    assert units[-1] == f"cairn-apply-{run_id}-1.service"
    logs = cairn(machine, "logs", run_id)
    for identifier in ("cairn-agent[", "cairn-helper["):
        assert identifier in logs, logs[-2000:]
    assert f"{run_id}: boundary-committed root-1" in machine.journal(run_id=run_id)
    # P descends from Q by snapshots: the change set came from root's tree search, not send.
    candidate = machine.journal(unit=f"cairn-candidate-{run_id}.service")
    assert "changes from a tree search" in candidate, candidate[-2000:]
    status = machine.exec(
        ["systemctl", "show", "-p", "Result", f"cairn-coordinator@{run_id}.service"]
    ).stdout.decode()
    assert "Result=success" in status

    # A run without a model provider starts no egress process: PID 1 skipped the unit (on
    # the broker's flag), so nothing of it started, logged or was waited for.
    egress = machine.journal(unit=f"cairn-egress@{run_id}.service")
    assert f"unmet condition check ConditionPathExists=!/run/cairn/egress-skipped/{run_id}" \
        in egress, egress
    assert "Started cairn-egress@" not in egress and "nothing to serve" not in egress, egress
    # The flag is root's, kept until the run is deleted, and deleting the run takes it.
    flag = f"/run/cairn/egress-skipped/{run_id}"
    made = machine.exec(["stat", "-c", "%F %a %U:%G", flag]).stdout.decode().strip()
    assert made == "regular empty file 644 root:root"
    deleted = machine.exec(["cairn", "rm", "--yes", run_id], user="alice").stdout.decode()
    assert deleted.startswith(f"deleted {run_id} ("), deleted
    assert machine.exec(["test", "-e", flag], check=False).returncode != 0


def test_person_edit_during_run_is_never_overwritten(machine: Machine) -> None:
    project = make_project(machine)
    script = json.loads(SCRIPT)
    script["steps"].insert(0, {"action": "sleep", "seconds": 6})
    run_id = launch(machine, project, write_script(machine, script), "add an entry")

    wait_for(machine, run_id, lambda d: any(o["state"] == "started" for o in d["operations"]))
    machine.exec(["tee", f"{project}/CHANGELOG.md"], user="alice", input=b"# Mine\n")

    data = wait_for(machine, run_id, finished)
    assert data["run"]["state"] == "failed"
    assert data["settlement"]["status"] == "conflict"
    assert [c["path"] for c in data["settlement"]["apply"]["conflicts"]] == ["CHANGELOG.md"]
    assert "CHANGELOG.md" in data["run"]["error"]
    assert machine.exec(["cat", f"{project}/CHANGELOG.md"]).stdout == b"# Mine\n"


def test_other_user_cannot_see_or_act_on_run(machine: Machine) -> None:
    project = make_project(machine)
    run_id = launch(machine, project, write_script(machine, SCRIPT), "x")
    for argv in (["show", run_id], ["logs", run_id], ["diff", run_id]):
        proc = machine.exec(["cairn", *argv], user="bob", check=False)
        assert proc.returncode != 0
        assert f"no run {run_id}" in proc.stderr.decode()
    assert json.loads(cairn(machine, "ps", "--json", user="bob")) == []
    # bob cannot launch on alice's project either
    bob_script = write_script(machine, SCRIPT, user="bob")
    proc = machine.exec(
        [
            "cairn",
            "launch",
            "builtin:implement",
            "--project",
            project,
            "--args",
            '{"objective": "x"}',
            "--scripted",
            f"builtin:implementer={bob_script}",
        ],
        user="bob",
        check=False,
    )
    assert proc.returncode != 0
    wait_for(machine, run_id, finished)


def test_bad_input_gets_one_line_errors(machine: Machine) -> None:
    project = make_project(machine)
    script = write_script(machine, SCRIPT)
    cases = {
        ("builtin:nope", '{"objective": "x"}', project): "unknown definition",
        ("builtin:implement", '{"objective": ""}', project): "arguments do not match",
        ("builtin:implement", '{"objective": "x"}', "/home/alice/missing"): "not found",
        ("builtin:implement", "{oops", project): "--args is not JSON",
    }
    for (definition, args, proj), expected in cases.items():
        proc = machine.exec(
            [
                "cairn",
                "launch",
                definition,
                "--project",
                proj,
                "--args",
                args,
                "--scripted",
                f"builtin:implementer={script}",
            ],
            user="alice",
            check=False,
        )
        err = proc.stderr.decode()
        assert proc.returncode != 0
        assert expected in err, err
        assert "Traceback" not in err
        assert err.splitlines()[0].startswith("cairn: ")


def test_broker_refuses_anything_but_verb_and_run_id(machine: Machine) -> None:
    probe = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX); s.connect('/run/cairn/broker.sock')\n"
        "s.sendall(sys.argv[1].encode()); print(s.recv(4096).decode())\n"
    )
    for request in (
        "launch-v1 flow_123\n",
        "launch-v1 ../../etc\n",
        "rm -rf /\n",
        "storage-v1 flow_" + "a" * 32 + " extra\n",
        "launch-v1 flow_" + "A" * 32 + "\n",
    ):
        out = machine.exec(["python3", "-c", probe, request]).stdout.decode()
        reply = json.loads(out)
        assert reply["ok"] is False and reply["code"] == "usage", (request, reply)
    # an ordinary user cannot even connect (socket is root:cairn 0660)
    proc = machine.exec(
        ["python3", "-c", probe, "launch-v1 flow_" + "a" * 32 + "\n"], user="alice", check=False
    )
    assert proc.returncode != 0 and "Permission denied" in proc.stderr.decode()


COMMAND_PROFILE = """\
kind = "command"
argv = ["/usr/bin/python3", "-c", '''
import json, os, pathlib
pathlib.Path("NOTES.md").write_text("objective: " + os.environ["CAIRN_PROMPT"] + "\\n")
print(json.dumps({"output": {"summary": "wrote NOTES.md"}, "handoff": "one new file"}))
''']
"""


def test_command_profile_from_host_config(machine: Machine) -> None:
    machine.exec(["mkdir", "-p", "/etc/cairn/profiles.d"])
    machine.exec(["tee", "/etc/cairn/profiles.d/builtin-implementer.toml"],
                 input=COMMAND_PROFILE.encode())
    project = make_project(machine)
    out = cairn(machine, "launch", "builtin:implement", "--project", project,
                "--args", '{"objective": "take notes"}')
    run_id = out.strip().splitlines()[-1]
    data = wait_for(machine, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "wrote NOTES.md"}
    assert data["operations"][0]["handoff"] == "one new file"
    notes = machine.exec(["cat", f"{project}/NOTES.md"]).stdout.decode()
    assert notes == "objective: take notes\n"
    # a caller cannot smuggle a command profile in place of a scripted one
    script = write_script(machine, {"kind": "command", "argv": ["/bin/true"]})
    proc = machine.exec(
        ["cairn", "launch", "builtin:implement", "--project", project, "--args",
         '{"objective": "x"}', "--scripted", f"builtin:implementer={script}"],
        user="alice", check=False,
    )
    assert proc.returncode != 0


def test_storage_init_makes_a_pool_that_survives_reboot_config(deb: Path) -> None:
    with Machine(deb, bind_loop_devices=True) as machine:
        proc = machine.exec(["cairn", "storage", "init", "--loop", "1G"], user="alice",
                            check=False)
        assert proc.returncode != 0 and "needs root" in proc.stderr.decode()
        machine.exec(["cairn", "storage", "init", "--loop", "1G"])
        fstype = machine.exec(["stat", "-f", "-c", "%T", "/var/lib/cairn/pool"]).stdout
        assert fstype.strip() == b"btrfs"
        enabled = machine.exec(["systemctl", "is-enabled", "var-lib-cairn-pool.mount"])
        assert enabled.stdout.strip() == b"enabled"
        options = machine.exec(["findmnt", "-no", "OPTIONS", "/var/lib/cairn/pool"]).stdout
        assert b"noatime" in options.split(b","), options  # now and after every boot:
        unit = machine.exec(["systemctl", "cat", "var-lib-cairn-pool.mount"]).stdout
        assert b"Options=loop,noatime" in unit
        again = machine.exec(["cairn", "storage", "init", "--loop", "1G"], check=False)
        assert again.returncode != 0 and "Traceback" not in again.stderr.decode()
        project = make_project(machine)
        run_id = launch(machine, project, write_script(machine, SCRIPT), "on a fresh pool")
        assert wait_for(machine, run_id, finished)["run"]["state"] == "succeeded"
