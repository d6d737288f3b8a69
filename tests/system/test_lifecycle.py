"""The package's life on a booted machine: fresh install, upgrade while a run is in
progress, remove, purge, and the sealed release the broker verifies before every agent.

The machines have no network, so packages are installed with ``dpkg -i``; removal and
purge go through ``apt-get``, which needs no network for them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import SCRIPT, cairn, finished, launch, make_project, wait_for, write_script

from cairn.journal.store import SCHEMA_VERSION
from cairn.proc import run

REPO = Path(__file__).resolve().parents[2]
CURRENT = "/usr/lib/cairn/releases/current"
MAINTAINER_SCRIPTS = ("preinst", "postinst", "prerm", "postrm")
LIBEXEC = ("cairnd", "cairn-broker", "cairn-coordinator", "cairn-egress", "cairn-worker")


@pytest.fixture(scope="module")
def upgrade_deb(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tree built again as a newer version."""
    version = run(["dpkg-deb", "-f", deb, "Version"]).stdout.decode().strip()
    out = tmp_path_factory.mktemp("upgrade")
    built = run(
        [REPO / "packaging" / "build-deb.sh", "--version", f"{version}+upgrade1", "--out", out],
        timeout=900,
    )
    return Path(built.stdout.decode().strip().splitlines()[-1])


@pytest.fixture
def plain_machine(deb: Path) -> Iterator[Machine]:
    with Machine(deb) as booted:
        yield booted


def sh(machine: Machine, *argv: str, check: bool = True) -> str:
    return machine.exec(list(argv), check=check, timeout=180).stdout.decode().strip()


def exists(machine: Machine, path: str) -> bool:
    return machine.exec(["test", "-e", path], check=False).returncode == 0


def unit_state(machine: Machine, unit: str) -> str:
    return sh(machine, "systemctl", "is-active", unit, check=False)


def unit_property(machine: Machine, unit: str, prop: str) -> str:
    return sh(machine, "systemctl", "show", "--value", "-p", prop, unit)


def launch_record(machine: Machine, run_id: str) -> dict[str, Any]:
    """The run's frozen launch description, read from the journal as root."""
    code = (
        "import json, sqlite3, sys\n"
        "db = sqlite3.connect('/var/lib/cairn/journal/journal.db')\n"
        "print(db.execute('SELECT launch FROM runs WHERE run_id=?', (sys.argv[1],)).fetchone()[0])"
    )
    record: dict[str, Any] = json.loads(sh(machine, "python3", "-I", "-c", code, run_id))
    return record


def agent_receipt(machine: Machine, run_id: str) -> dict[str, Any]:
    code = (
        "import json, sqlite3, sys\n"
        "db = sqlite3.connect('/var/lib/cairn/broker/receipts.db')\n"
        "rows = db.execute(\"SELECT body FROM receipts WHERE run_id=? AND kind='start-agent'\","
        " (sys.argv[1],)).fetchall()\n"
        "print(json.dumps([json.loads(r[0]) for r in rows]))"
    )
    (receipt,) = json.loads(sh(machine, "python3", "-I", "-c", code, run_id))
    data: dict[str, Any] = receipt["data"]
    return data


def sleeping_script(machine: Machine, seconds: int) -> str:
    script = json.loads(SCRIPT)
    script["steps"].insert(0, {"action": "sleep", "seconds": seconds})
    return write_script(machine, script)


def agent_running(data: dict[str, Any]) -> bool:
    return any(o["state"] == "started" for o in data["operations"])


def wait_active(machine: Machine, unit: str, timeout: float = 60) -> str:
    """The unit's state once it is active, or the last state seen at the deadline (an
    operation is ``started`` while its unit's start job may still run)."""
    deadline = time.monotonic() + timeout
    while (state := unit_state(machine, unit)) != "active" and time.monotonic() < deadline:
        time.sleep(0.2)
    return state


def install(machine: Machine, deb: Path) -> None:
    staged = machine.merged / "root" / deb.name
    staged.write_bytes(deb.read_bytes())
    try:
        machine.exec(["dpkg", "-i", f"/root/{deb.name}"], timeout=300)
    finally:
        staged.unlink()


def test_fresh_install_enables_sockets_and_serves_a_user(plain_machine: Machine) -> None:
    m = plain_machine
    for socket in ("cairn.socket", "cairn-broker.socket"):
        assert sh(m, "systemctl", "is-enabled", socket) == "enabled"
        assert unit_state(m, socket) == "active"
    # cairnd and the broker start at boot (the reconciler; no launch waits for the
    # broker's start), enabled but never started by dpkg.
    assert sh(m, "systemctl", "is-enabled", "cairn.service") == "enabled"
    assert sh(m, "systemctl", "is-enabled", "cairn-broker.service") == "enabled"
    # The retention timer (docs/storage.md) is enabled and waiting; its service runs only
    # when it fires.
    assert sh(m, "systemctl", "is-enabled", "cairn-retention.timer") == "enabled"
    assert unit_state(m, "cairn-retention.timer") == "active"
    assert sh(m, "systemctl", "is-enabled", "cairn-retention.service") == "static"
    # Every user manager gets the schedule repair and the notify path, enabled in /etc by
    # postinst, so an administrator can turn either off; the notifier itself only starts
    # from its path unit, never at every login.
    for unit in ("cairn-schedule-reconcile.service", "cairn-notify.path"):
        assert sh(m, "systemctl", "--global", "is-enabled", unit) == "enabled"
    notifier = m.exec(["systemctl", "--global", "is-enabled", "cairn-notify.service"],
                      check=False)
    assert notifier.stdout.decode().strip() == "disabled"
    sh(m, "systemctl", "--global", "disable", "cairn-notify.path")
    gone = m.exec(["systemctl", "--global", "is-enabled", "cairn-notify.path"], check=False)
    assert gone.stdout.decode().strip() == "disabled"
    sh(m, "systemctl", "--global", "enable", "cairn-notify.path")

    assert json.loads(cairn(m, "ps", "--json")) == []
    assert unit_state(m, "cairn.service") == "active"
    # The journal is made by cairnd as its own user (postinst never touches it, see
    # test_maintainer_scripts_never_touch_the_journal), at the current schema version.
    assert sh(m, "stat", "-c", "%U", "/var/lib/cairn/journal/journal.db") == "cairn"
    version = sh(
        m,
        "python3",
        "-I",
        "-c",
        "import sqlite3; print(sqlite3.connect('/var/lib/cairn/journal/journal.db')"
        ".execute('PRAGMA user_version').fetchone()[0])",
    )
    assert version == str(SCHEMA_VERSION)

    # Only `cairn` is on PATH; the units start the internal programs from /usr/libexec/cairn.
    assert sh(m, "sh", "-c", "command -v cairn") == "/usr/bin/cairn"
    for program in LIBEXEC:
        assert sh(m, "sh", "-c", f"command -v {program} || echo absent") == "absent", program
        assert sh(m, "stat", "-c", "%U %a", f"/usr/libexec/cairn/{program}") == "root 755"
    main_pid = unit_property(m, "cairn.service", "MainPID")
    assert "/usr/libexec/cairn/cairnd" in sh(m, "cat", f"/proc/{main_pid}/cmdline")
    assert exists(m, "/usr/share/doc/cairn/examples/changelog-agent.json")
    assert exists(m, "/usr/share/doc/cairn/examples/profiles.d/claude.toml")
    for page in (
        "man1/cairn.1.gz",
        "man5/cairn-providers.toml.5.gz",
        "man5/cairn-policy.toml.5.gz",
        "man5/cairn-profiles.5.gz",
        "man5/cairn-schedules.toml.5.gz",
        "man5/cairn-notify.5.gz",
        "man7/cairn-workflow.7.gz",
        "man8/cairnd.8.gz",
        "man8/cairn-broker.8.gz",
    ):
        assert exists(m, f"/usr/share/man/{page}"), page
    verified = sh(m, "python3", "-I", "-m", "cairn.broker.capsule", "verify")
    assert f"capsule {sh(m, 'readlink', CURRENT)} verified" in verified
    assert sh(m, "stat", "-c", "%U %a", f"{CURRENT}/lib/cairn/worker/__main__.py") == "root 644"


def test_maintainer_scripts_never_touch_the_journal(deb: Path, tmp_path: Path) -> None:
    run(["dpkg-deb", "-e", deb, tmp_path])
    scripts = {name: tmp_path / name for name in MAINTAINER_SCRIPTS if (tmp_path / name).exists()}
    assert "postinst" in scripts and "prerm" in scripts and "postrm" in scripts
    for name, path in scripts.items():
        text = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        for word in ("sqlite", "journal.db", "migrat", "user_version"):
            assert word not in text, f"{name} mentions {word}"
    # Templates and transient units are stopped on remove only, never on upgrade.
    prerm = scripts["prerm"].read_text()
    assert 'if [ "$1" = remove ]' in prerm and "cairn-coordinator@*.service" in prerm


def test_upgrade_during_a_run_keeps_the_run(deb: Path, upgrade_deb: Path) -> None:
    with Machine(deb, with_pool=True) as m:
        old_capsule = sh(m, "readlink", CURRENT)
        project = make_project(m)
        run_id = launch(m, project, sleeping_script(m, 12), "survive an upgrade")
        wait_for(m, run_id, agent_running)
        coordinator = f"cairn-coordinator@{run_id}.service"
        invocation = unit_property(m, coordinator, "InvocationID")
        agent = f"cairn-agent-{run_id}-root-1-1.service"
        assert "/runtime/capsule/cairn-worker" in unit_property(m, agent, "ExecStart")
        assert launch_record(m, run_id)["capsule_hash"] == old_capsule

        install(m, upgrade_deb)

        new_version = run(["dpkg-deb", "-f", upgrade_deb, "Version"]).stdout.decode().strip()
        assert sh(m, "dpkg-query", "-W", "-f", "${Version}", "cairn") == new_version
        assert sh(m, "dpkg", "--audit") == ""
        # The template is skipped by dh_installsystemd: the upgrade left the run alone.
        assert unit_property(m, coordinator, "InvocationID") == invocation
        new_capsule = sh(m, "readlink", CURRENT)
        assert new_capsule != old_capsule
        assert not exists(m, f"/usr/lib/cairn/releases/{old_capsule}")

        data = wait_for(m, run_id, finished)
        assert data["run"]["state"] == "succeeded", data["run"]["error"]
        assert data["settlement"]["apply"]["applied"] == ["CHANGELOG.md"]
        changelog = sh(m, "cat", f"{project}/CHANGELOG.md")
        assert changelog == "# Changelog\n- survive an upgrade"
        assert agent_receipt(m, run_id)["capsule"] == old_capsule

        # The upgraded daemon serves the old run and launches new ones on the new capsule.
        assert [r["run_id"] for r in json.loads(cairn(m, "ps", "--json"))] == [run_id]
        second = launch(m, project, write_script(m, SCRIPT), "after the upgrade")
        assert wait_for(m, second, finished)["run"]["state"] == "succeeded"
        assert launch_record(m, second)["capsule_hash"] == new_capsule
        assert agent_receipt(m, second)["capsule"] == new_capsule


def test_remove_stops_runs_and_keeps_data_purge_keeps_the_pool(deb: Path) -> None:
    with Machine(deb, with_pool=True) as m:
        project = make_project(m)
        run_id = launch(m, project, sleeping_script(m, 300), "interrupted by removal")
        wait_for(m, run_id, agent_running)
        coordinator = f"cairn-coordinator@{run_id}.service"
        agent = f"cairn-agent-{run_id}-root-1-1.service"
        assert unit_state(m, coordinator) == "active"
        assert wait_active(m, agent) == "active"

        sh(m, "apt-get", "remove", "-y", "-q", "cairn")

        assert sh(m, "dpkg-query", "-W", "-f", "${Status}", "cairn") == (
            "deinstall ok config-files"
        )
        for unit in (coordinator, agent, "cairn.socket", "cairn-broker.socket"):
            assert unit_state(m, unit) != "active", unit
        for path in (
            "/var/lib/cairn/journal/journal.db",
            f"/var/lib/cairn/runs/{run_id}",
            "/var/lib/cairn/broker/receipts.db",
            f"/var/lib/cairn/pool/runs/{run_id}/Q",
        ):
            assert exists(m, path), f"remove deleted {path}"
        assert sh(m, "getent", "passwd", "cairn").startswith("cairn:")

        sh(m, "apt-get", "purge", "-y", "-q", "cairn")

        assert sh(m, "dpkg-query", "-W", "-f", "${Status}", "cairn", check=False) != (
            "deinstall ok config-files"
        )
        for path in (
            "/var/lib/cairn/journal",
            "/var/lib/cairn/runs",
            "/var/lib/cairn/broker",
            "/etc/cairn",
        ):
            assert not exists(m, path), f"purge left {path}"
        # The pool's Btrfs data survives purge: the subvolumes are still on the filesystem.
        subvolumes = sh(m, "btrfs", "subvolume", "list", "-o", "/var/lib/cairn/pool")
        assert f"runs/{run_id}/Q" in subvolumes
        assert (m.pool_mount / "runs" / run_id / "Q" / "CHANGELOG.md").read_text() == (
            "# Changelog\n"
        )


def test_broker_refuses_a_capsule_with_one_changed_byte(machine: Machine) -> None:
    release = sh(machine, "readlink", "-f", CURRENT)
    target = f"{release}/lib/cairn/worker/profiles.py"
    original = machine.exec(["cat", target]).stdout
    changed = bytearray(original)
    changed[200] ^= 0x20
    machine.exec(["tee", target], input=bytes(changed))

    project = make_project(machine)
    run_id = launch(machine, project, write_script(machine, SCRIPT), "must not run")
    data = wait_for(machine, run_id, finished)

    assert data["run"]["state"] == "failed"
    message = "lib/cairn/worker/profiles.py does not match its SHA-256"
    assert "sealed release refused" in data["run"]["error"]
    assert message in data["run"]["error"]
    broker_log = machine.journal(unit="cairn-broker.service")
    assert message in broker_log
    assert "sealed release refused" in broker_log
    # No agent unit was ever started, and the project is untouched.
    assert f"cairn-agent-{run_id}" not in sh(machine, "systemctl", "list-units", "--all")
    assert sh(machine, "cat", f"{project}/CHANGELOG.md") == "# Changelog"


def test_an_error_cairnd_logs_is_stored_at_priority_err(machine: Machine) -> None:
    """cairnd's reconciler cannot reach a masked broker: its ERROR record is a journal
    entry at priority 3 (``journalctl -p err``) with the code that logged it."""
    project = make_project(machine)
    run_id = launch(machine, project, sleeping_script(machine, 300), "coordinator lost")
    wait_for(machine, run_id, agent_running)
    # A stopped (not failed) coordinator is not restarted by systemd: the run is left for
    # the reconciler, which runs when cairnd starts and needs the broker.
    sh(machine, "systemctl", "stop", f"cairn-coordinator@{run_id}.service")
    sh(machine, "systemctl", "mask", "--runtime", "--now", "cairn-broker.socket",
       "cairn-broker.service")
    sh(machine, "systemctl", "restart", "cairn.service")

    expected = f"could not restart the coordinator of {run_id}"
    deadline = time.monotonic() + 120
    while True:
        errors = sh(machine, "journalctl", "--no-pager", "-o", "json", "-p", "err",
                    "-u", "cairn.service")
        entries = [json.loads(line) for line in errors.splitlines() if line.strip()]
        found = [e for e in entries if expected in e.get("MESSAGE", "")]
        if found:
            break
        assert time.monotonic() < deadline, errors[-2000:]
        time.sleep(1)
    entry = found[0]
    assert entry["PRIORITY"] == "3"
    assert entry["SYSLOG_IDENTIFIER"] == "cairnd"
    assert entry["CODE_FILE"].endswith("/cairn/daemon/reconcile.py")
    assert entry["CODE_FUNC"] == "reconcile"
    assert entry["LOGGER"] == "cairn.daemon.reconcile"
    # Info records stay below err: "cairnd ready" is in the unit's journal, not in -p err.
    assert "cairnd ready" in machine.journal(unit="cairn.service")
    assert not any("cairnd ready" in e.get("MESSAGE", "") for e in entries)
