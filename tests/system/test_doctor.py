"""``cairn doctor`` and ``cairn config check`` on a booted machine: the host's checks with
no runs at all, a broken host reported line by line with the fix, credentials looked up
by name (as root only), and every configuration problem at once."""

from __future__ import annotations

import json
from typing import Any

from machine import Machine
from test_end_to_end import SCRIPT, make_project, write_script


def doctor(machine: Machine, *argv: str, user: str | None = "alice") -> tuple[int, str]:
    proc = machine.exec(["cairn", "doctor", *argv], user=user, check=False, timeout=180)
    return proc.returncode, proc.stdout.decode()


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report["host"]}


def test_doctor_checks_a_healthy_host_with_no_runs(machine: Machine) -> None:
    code, out = doctor(machine, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["runs"] == [] and report["problems"] == 0
    status = statuses(report)
    for check in ("cairn.socket", "cairn-broker.socket", "pool", "release", "config",
                  "providers", "linger", "file times"):
        assert status[check] == "ok", (check, report["host"])
    assert status["free space"] in ("ok", "warn")  # the test pool is 2G
    code, text = doctor(machine)
    assert code == 0
    lines = text.splitlines()
    assert lines and all(line.split()[0] in ("ok", "warn") for line in lines), text
    assert "ok    pool: /var/lib/cairn/pool on Btrfs" in lines


def test_a_broken_host_is_reported_with_the_fixes(machine: Machine) -> None:
    machine.exec(["systemctl", "stop", "cairn-broker.socket"])
    machine.exec(["tee", "/etc/cairn/policy.toml"], input=b'default = "allw"\n')
    machine.exec(["mkdir", "-p", "/etc/cairn/profiles.d"])
    machine.exec(["tee", "/etc/cairn/profiles.d/tool.toml"], input=b'kind = "command"\n'
                 b'argv = ["/bin/true"]\nmax_steps = "many"\n')
    code, text = doctor(machine)
    assert code == 1
    lines = text.splitlines()
    assert ("fail  cairn-broker.socket: inactive; fix: sudo systemctl enable --now "
            "cairn-broker.socket") in lines
    (config,) = [line for line in lines if line.startswith("fail  config: ")]
    assert config.startswith("fail  config: 2 problem(s), the first: /etc/cairn/policy.toml: "
                             "default: ")
    assert config.endswith("fix: run 'cairn config check' for all of them")

    checked = machine.exec(["cairn", "config", "check"], user="alice", check=False)
    assert checked.returncode == 1
    out = checked.stdout.decode().splitlines()
    assert out[0].startswith("/etc/cairn/policy.toml: default: Input should be 'allow'")
    assert out[2] == ("/etc/cairn/profiles.d/tool.toml: max_steps: Input should be a valid "
                      "integer (got 'many')")
    assert out[-1] == "2 errors in 2 config files"
    # cairnd answers a launch under that config with the config's own error, not "internal"
    project, script = make_project(machine), write_script(machine, SCRIPT)
    launch = machine.exec(
        ["cairn", "launch", "builtin:implement", "--project", project,
         "--args", json.dumps({"objective": "x"}), "--scripted", f"builtin:implementer={script}"],
        user="alice", check=False, timeout=180,
    )
    assert launch.returncode == 1
    stderr = launch.stderr.decode()
    assert stderr.startswith("cairn: /etc/cairn/policy.toml: default: "), stderr
    assert "internal" not in stderr


def test_credentials_are_looked_up_by_name_as_root_only(machine: Machine) -> None:
    machine.exec(["tee", "/etc/cairn/providers.toml"], input=(
        b'default = "local"\n[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\n'
        b'model = "m"\ncredential = "cairn-provider-local"\n'))
    machine.exec(["install", "-d", "-m", "0700", "/etc/credstore"])
    code, text = doctor(machine, user=None)
    assert code == 1
    assert "fail  credential of local: cairn-provider-local is in no credential store" in text
    assert ("ok    providers: local (default); not contacted ('sudo cairn doctor --providers' "
            "asks each)") in text.splitlines()

    machine.exec(["install", "-m", "0600", "/dev/null", "/etc/credstore/cairn-provider-local"])
    code, text = doctor(machine, user=None)
    assert code == 0, text
    assert "ok    credential of local: /etc/credstore/cairn-provider-local" in text.splitlines()
    # a user cannot look into root's credential store: a warning that says how to check
    code, text = doctor(machine)
    assert code == 0, text
    assert ("warn  credential of local: cairn-provider-local: only root can look into the "
            "credential stores; fix: run 'sudo cairn doctor'") in text.splitlines()
