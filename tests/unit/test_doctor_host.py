"""``cairn doctor`` checks the host: one line per check, ok / warn / fail with the fix,
exit 1 on a failure, host checks printed even with no runs. The checks run on real files
(a real signed capsule built from this tree, real config files, real credential stores
in a temporary root); systemd and the pool's filesystem are what the unit tier fakes."""

from __future__ import annotations

import copy
import json
import os
import pwd
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn import hostcheck, paths
from cairn.cli import doctor as cli_doctor
from cairn.cli.commands import app
from cairn.daemon import doctor
from cairn.errors import SystemdError, Unavailable
from cairn.journal.readwrite import Journal
from cairn.proc import run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "etc/cairn/profiles.d").mkdir(parents=True)
    return tmp_path


@pytest.fixture(scope="module")
def built_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``usr/lib/cairn`` of a root holding a capsule built and signed from this tree."""
    out = tmp_path_factory.mktemp("release")
    run([sys.executable, REPO / "sealed-release" / "build.py", "--out", out], timeout=120)
    return out


def install_release(built: Path, root: Path) -> Path:
    target = root / "usr/lib/cairn"
    shutil.copytree(built, target, symlinks=True)  # releases/current stays a link
    return target


# --- one check at a time ------------------------------------------------------------------


def test_sockets_are_checked_by_their_systemd_state() -> None:
    states = {"cairn.socket": "active", "cairn-broker.socket": "inactive"}
    ok, down = hostcheck.socket_checks(states.get)
    assert ok.line() == "ok    cairn.socket: active"
    assert down.line() == (
        "fail  cairn-broker.socket: inactive; fix: sudo systemctl enable --now "
        "cairn-broker.socket"
    )
    (missing, _) = hostcheck.socket_checks(lambda unit: None)
    assert missing.status == "fail" and missing.detail == "not loaded"


def test_a_pool_that_is_missing_or_not_btrfs_fails_with_the_fix(host: Path) -> None:
    (missing,) = hostcheck.pool_checks(host / "nowhere")
    assert missing.status == "fail" and "does not exist" in missing.detail
    assert "cairn storage init" in missing.fix
    (not_btrfs,) = hostcheck.pool_checks(Path("/proc"))  # never Btrfs
    assert not_btrfs.line().startswith("fail  pool: storage pool /proc is not on Btrfs")
    # on Btrfs: tests/btrfs/test_doctor_pool.py


def test_the_sealed_release_is_verified_and_tampering_fails(
    built_release: Path, host: Path
) -> None:
    lib = install_release(built_release, host)
    check = hostcheck.release_check(paths.release_dir(), hostcheck.release_key())
    assert check.status == "ok" and "verified" in check.detail
    current = lib / "releases" / os.readlink(lib / "releases/current")
    (current / "cairn-worker").chmod(0o644)
    (current / "cairn-worker").write_text("#!/bin/sh\nexit 0\n")
    bad = hostcheck.release_check(paths.release_dir(), hostcheck.release_key())
    assert bad.status == "fail" and "does not match its SHA-256" in bad.detail
    assert "reinstall" in bad.fix


def test_no_release_installed_fails(host: Path) -> None:
    check = hostcheck.release_check(paths.release_dir(), hostcheck.release_key())
    assert check.line().startswith("fail  release: no sealed release installed")


def test_config_problems_fail_with_a_pointer_to_config_check(host: Path) -> None:
    assert hostcheck.config_check().status == "ok"
    (host / "etc/cairn/policy.toml").write_text('default = "allw"\n')
    (host / "etc/cairn/schedules.toml").write_text("max_active_scheduled_runs = -1\n")
    check = hostcheck.config_check()
    assert check.status == "fail"
    assert check.detail.startswith(f"2 problem(s), the first: {host / 'etc/cairn/policy.toml'}")
    assert check.fix == "run 'cairn config check' for all of them"


def test_providers_by_name_only_and_the_credentials_they_need(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (host / "etc/cairn/providers.toml").write_text(
        'default = "openai"\n'
        '[providers.openai]\nbase_url = "https://api.openai.com/v1"\nmodel = "m"\n'
        'credential = "cairn-provider-openai"\n'
        '[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        '[providers.odd]\nbase_url = "https://odd.example/v1"\nmodel = "m"\n'
        'credential = "odd-key"\n'
    )

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a provider was contacted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    checks, needed = hostcheck.provider_checks()
    assert [c.line() for c in checks] == [
        "ok    providers: local, odd, openai (default); not contacted "
        "('sudo cairn doctor --providers' asks each)",
        "fail  credential of odd: odd-key never reaches the coordinator, which imports only "
        'cairn-provider-*; fix: set credential = "cairn-provider-odd" in providers.toml',
    ]
    assert needed == {"openai": "cairn-provider-openai"}


def test_credentials_are_looked_up_by_name_in_the_stores(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = hostcheck.credential_stores()
    assert stores[0] == host / "etc/credstore" and stores[1] == host / "etc/credstore.encrypted"
    stores[1].mkdir(parents=True)
    (stores[1] / "cairn-provider-a").write_bytes(b"sealed")
    found, missing = hostcheck.credential_checks(
        {"a": "cairn-provider-a", "b": "cairn-provider-b"}, stores
    )
    assert found.line() == f"ok    credential of a: {stores[1] / 'cairn-provider-a'}"
    assert missing.status == "fail" and missing.detail.startswith("cairn-provider-b is in no")
    assert "systemd-creds encrypt --name=cairn-provider-b" in missing.fix

    real_stat = os.stat

    def as_a_user(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path).startswith(str(stores[0])):  # /etc/credstore is root's, mode 0700
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", as_a_user)
    (unseen,) = hostcheck.credential_checks({"b": "cairn-provider-b"}, stores)
    assert unseen.status == "warn" and unseen.fix == "run 'sudo cairn doctor'"


def test_linger_is_needed_only_with_schedules(host: Path) -> None:
    user = pwd.getpwuid(os.getuid()).pw_name
    assert hostcheck.linger_check(0).line() == f"ok    linger: {user} has no schedules"
    lacking = hostcheck.linger_check(2)
    assert lacking.status == "fail" and lacking.fix == f"sudo loginctl enable-linger {user}"
    hostcheck.linger_file(user).parent.mkdir(parents=True)
    hostcheck.linger_file(user).touch()
    assert hostcheck.linger_check(2).status == "ok"


# --- cairnd's report and the command ---------------------------------------------------------


def test_cairnd_reports_the_host_with_no_runs(
    built_release: Path, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_release(built_release, host)
    (host / "var/lib/cairn/journal").mkdir(parents=True)
    monkeypatch.setattr(doctor, "Systemd", FakeSystemd)
    with Journal(paths.journal_path(), create=True) as journal:
        report = doctor.doctor(journal, None, os.getuid())
    assert report["runs"] == []
    checks = {c["check"]: c["status"] for c in report["host"]}
    assert checks["cairn.socket"] == "ok" and checks["cairn-broker.socket"] == "ok"
    assert checks["release"] == "ok" and checks["config"] == "ok"
    assert checks["pool"] == "fail"  # no pool under the temporary root
    assert report["problems"] == 1


class FakeSystemd:
    def __enter__(self) -> FakeSystemd:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def unit_state(self, name: str) -> Any:
        class State:
            active_state = "active"

        return State()


def test_the_command_prints_every_host_check_and_fails_on_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = {
        "host": [
            hostcheck.HostCheck(check="cairn.socket", status="ok", detail="active").model_dump(),
            hostcheck.HostCheck(check="release", status="fail", detail="no sealed release",
                                fix="reinstall").model_dump(),
        ],
        "credentials": {},
        "runs": [],
        "problems": 1,
    }
    answers = {"doctor": report, "schedule-list": []}
    monkeypatch.setattr(cli_doctor, "request", lambda body: copy.deepcopy(answers[body.op]))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert result.output.splitlines()[:2] == [
        "ok    cairn.socket: active",
        "fail  release: no sealed release; fix: reinstall",
    ]
    assert result.output.splitlines()[2].startswith("ok    linger: ")
    as_json = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).output)
    assert [c["check"] for c in as_json["host"]] == ["cairn.socket", "release", "linger"]


def test_without_cairnd_the_command_says_so_as_a_failed_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def down(body: Any) -> Any:
        raise Unavailable("cannot reach cairnd at /run/cairn/cairnd.sock: No such file")

    monkeypatch.setattr(cli_doctor, "request", down)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert result.output == (
        "fail  cairnd: cannot reach cairnd at /run/cairn/cairnd.sock: No such file; "
        "fix: sudo systemctl enable --now cairn.socket\n"
    )


def test_without_systemd_the_other_host_checks_still_run(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_bus() -> Any:
        raise SystemdError("cannot connect to the system bus")

    monkeypatch.setattr(doctor, "Systemd", no_bus)
    checks, _ = doctor.host_checks()
    assert checks[0].line().startswith("fail  systemd: cannot ask systemd: cannot connect")
    assert [c.check for c in checks[1:3]] == ["pool", "release"]
