"""Schedules on a real systemd: alice's user manager (linger on) runs the timers, cairnd
admits occurrences, and the runs are ordinary runs on real Btrfs.

Needs a package that installs units/user/ into /usr/lib/systemd/user (with
cairn-schedule-reconcile.service enabled for every user manager).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

REPO = Path(__file__).resolve().parents[2]
SCRIPT = json.loads((REPO / "docs" / "examples" / "changelog-agent.json").read_text())
PROJECT = "/home/alice/demo"
UNIT_DIR = "/home/alice/.config/systemd/user"

# Timers fire on calendar times: these tests wait for minutes that the CPU cannot shorten.
pytestmark = pytest.mark.clock


def cairn(machine: Machine, *argv: str, check: bool = True) -> str:
    proc = machine.exec(["cairn", *argv], user="alice", check=False, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"cairn {' '.join(argv)} failed ({proc.returncode}): "
                    f"{proc.stderr.decode(errors='replace').strip()}\ncairnd's log:\n"
                    f"{machine.journal('cairn.service')[-4000:]}")
    return proc.stdout.decode()


def user_systemctl(machine: Machine, *argv: str, check: bool = True) -> str:
    proc = machine.exec(["systemctl", "--user", *argv], user="alice", check=check, timeout=60)
    return proc.stdout.decode()


def prepare(machine: Machine, sleep: float = 0) -> str:
    machine.enable_user_manager("alice")
    machine.exec(["mkdir", "-p", PROJECT], user="alice")
    machine.exec(["tee", f"{PROJECT}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    script = dict(SCRIPT)
    if sleep:
        script["steps"] = [{"action": "sleep", "seconds": sleep}, *SCRIPT["steps"]]
    path = "/home/alice/agent.json"
    machine.exec(["tee", path], user="alice", input=json.dumps(script).encode())
    return path


def create(
    machine: Machine, name: str, script: str, definition: str = "builtin:implement", **options: str
) -> dict[str, Any]:
    argv = [
        "schedule", "create", name, definition, "--project", PROJECT,
        "--args", json.dumps({"objective": f"entry from {name}"}),
        "--timezone", "UTC", "--scripted", f"builtin:implementer={script}", "--json",
    ]  # fmt: skip
    for option, value in options.items():
        argv += [f"--{option.replace('_', '-')}", value]
    return json.loads(cairn(machine, *argv))  # type: ignore[no-any-return]


def enable(
    machine: Machine, name: str, script: str, definition: str = "builtin:implement", **options: str
) -> str:
    created = create(machine, name, script, definition, **options)
    assert created["status"] == "paused" and created["awaiting_confirmation"]
    cairn(machine, "schedule", "confirm", created["action"], created["challenge"])
    cairn(machine, "schedule", "resume", created["schedule_id"])
    return str(created["schedule_id"])


def inspect(machine: Machine, schedule_id: str) -> dict[str, Any]:
    return json.loads(cairn(machine, "schedule", "show", schedule_id, "--json"))  # type: ignore[no-any-return]


def run_state(machine: Machine, run_id: str) -> str:
    return str(json.loads(cairn(machine, "show", run_id, "--json"))["run"]["state"])


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 150) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1)


def launch_description(machine: Machine, run_id: str) -> dict[str, Any]:
    code = (
        "import sqlite3, sys; db = sqlite3.connect('file:/var/lib/cairn/journal/journal.db"
        "?mode=ro', uri=True); print(db.execute('SELECT launch FROM runs WHERE run_id=?',"
        " (sys.argv[1],)).fetchone()[0])"
    )
    return json.loads(machine.exec(["python3", "-c", code, run_id]).stdout)  # type: ignore[no-any-return]


def occurrences(machine: Machine, schedule_id: str) -> list[dict[str, Any]]:
    return list(reversed(inspect(machine, schedule_id)["occurrences"]))


def test_timer_fires_and_admission_enforces_the_lease(machine: Machine) -> None:
    # Longer than the timer's 1 min accuracy window, so a trigger surely lands on the run.
    script = prepare(machine, sleep=70)

    past = machine.exec(
        ["cairn", "schedule", "create", "late", "builtin:implement", "--project", PROJECT,
         "--args", '{"objective": "x"}', "--scripted", f"builtin:implementer={script}",
         "--calendar", "*:*:00/10", "--timezone", "UTC", "--catch-up", "none",
         "--max-runs", "2", "--valid-until", "2020-01-01T00:00:00Z"],
        user="alice", check=False,
    )  # fmt: skip
    assert past.returncode == 2
    assert "valid-until 2020-01-01T00:00:00Z is in the past" in past.stderr.decode()

    sid = enable(
        machine, "every-ten", script,
        calendar="*:*:00/10", catch_up="none", max_runs="2", valid_until="2099-01-01T00:00:00Z",
    )  # fmt: skip
    timers = user_systemctl(machine, "list-timers", "--all")
    assert f"cairn-schedule@{sid}.timer" in timers
    assert f"cairn-schedule@{sid}.service" in timers
    timer = machine.exec(["cat", f"{UNIT_DIR}/cairn-schedule@{sid}.timer"]).stdout.decode()
    assert "OnCalendar=*-*-* *:*:00/10 UTC\nPersistent=false\nAccuracySec=1min\n" in timer
    assert PROJECT not in timer and "objective" not in timer

    # The timer fires and its occurrence becomes an ordinary run recording the revision.
    first = wait_until(
        "the first timer occurrence",
        lambda: [o for o in occurrences(machine, sid) if o["state"] == "launched"],
    )[0]
    run1 = first["run_id"]
    assert first["trigger"] == "timer" and first["revision"] == 1
    desc = launch_description(machine, run1)
    assert desc["schedule"]["id"] == sid
    assert desc["schedule"]["revision"] == 1
    assert desc["schedule"]["occurrence"] == first["key"]
    assert desc["definition"] == "builtin:implement"

    # run-now while the run is active: refused by the same overlap rule, and recorded.
    busy = machine.exec(["cairn", "schedule", "run-now", sid], user="alice", check=False)
    assert busy.returncode == 1
    assert f"run-now refused: overlaps active run {run1}" in busy.stderr.decode()
    # A timer trigger during the run is refused and recorded as well.
    overlapped = wait_until(
        "a timer trigger refused for overlap",
        lambda: [
            o for o in occurrences(machine, sid)
            if o["trigger"] == "timer" and o["reason"].startswith("overlaps active run")
        ],
    )  # fmt: skip
    assert overlapped[0]["state"] == "refused"

    # After the run, the timer admits a second one; then max-runs 2 refuses every trigger.
    # Up to: the rest of the first run (70 s), a trigger (AccuracySec=1min), the second
    # run (70 s, longer on a loaded machine), another trigger: 360 s, not the 130 s usual.
    exhausted = wait_until(
        "a timer trigger refused by max-runs",
        lambda: [
            o for o in occurrences(machine, sid)
            if o["trigger"] == "timer" and o["reason"] == "max-runs 2 reached"
        ],
        timeout=360,
    )  # fmt: skip
    assert exhausted[0]["state"] == "refused"
    launched = [o for o in occurrences(machine, sid) if o["state"] == "launched"]
    assert len(launched) == 2 and launched[0]["run_id"] == run1
    refused = machine.exec(["cairn", "schedule", "run-now", sid], user="alice", check=False)
    assert refused.returncode == 1
    assert "run-now refused: max-runs 2 reached" in refused.stderr.decode()
    runs = json.loads(cairn(machine, "ps", "--json"))
    assert sorted(r["run_id"] for r in runs) == sorted(o["run_id"] for o in launched)
    listed = json.loads(cairn(machine, "schedule", "list", "--json"))
    assert [(s["schedule_id"], s["runs_used"], s["max_runs"]) for s in listed] == [(sid, 2, 2)]

    # The first run finishes as an ordinary run; the inbox holds nothing for it.
    wait_until("the first run to finish", lambda: run_state(machine, run1) == "succeeded")
    assert json.loads(cairn(machine, "schedule", "inbox", "--json")) == []

    # Delete: future launches only; the timer goes away, the runs stay.
    cairn(machine, "schedule", "rm", "--yes", sid)
    assert f"cairn-schedule@{sid}.timer" not in user_systemctl(machine, "list-timers", "--all")
    assert len(json.loads(cairn(machine, "ps", "--json"))) == 2


def _three_elapses_ahead(seconds: float) -> tuple[str, int]:
    """A calendar with three elapses in one minute that starts at least ``seconds`` from
    now, and the last of them (epoch seconds)."""
    minute = math.ceil((time.time() + seconds) / 60) * 60
    day = datetime.fromtimestamp(minute, UTC).strftime("%Y-%m-%d %H:%M")
    return f"{day}:00,05,10", minute + 10


def test_catch_up_once_runs_one_missed_occurrence_and_none_runs_none(machine: Machine) -> None:
    script = prepare(machine)
    calendar, last_elapse = _three_elapses_ahead(40)
    common = {"calendar": calendar, "max_runs": "5", "valid_until": "2099-01-01T00:00:00Z"}
    once = enable(machine, "catch-up-once", script, catch_up="once", **common)
    none = enable(machine, "catch-up-none", script, catch_up="none", **common)

    # The user manager is down across all three elapses.
    assert time.time() < last_elapse - 15, "setup took too long for the chosen calendar"
    machine.exec(["systemctl", "stop", "user@1001.service"])
    time.sleep(max(0.0, last_elapse - time.time()) + 2)
    machine.exec(["systemctl", "start", "user@1001.service"])

    caught = wait_until("the catch-up occurrence", lambda: occurrences(machine, once), 120)
    time.sleep(15)  # leave room for any further (wrong) trigger
    caught = occurrences(machine, once)
    assert [(o["trigger"], o["key"], o["state"]) for o in caught] == [
        ("timer", f"calendar:{last_elapse}", "launched")
    ]
    assert occurrences(machine, none) == []
    desc = launch_description(machine, caught[0]["run_id"])
    assert desc["schedule"]["id"] == once


def test_doctor_reports_a_deleted_timer_and_the_reconciler_restores_it(
    machine: Machine,
) -> None:
    script = prepare(machine)
    sid = enable(
        machine, "daily", script,
        calendar="*-*-* 03:00:00", catch_up="once", max_runs="30",
        valid_until="2099-01-01T00:00:00Z",
    )  # fmt: skip
    healthy = json.loads(cairn(machine, "schedule", "doctor", "--json"))
    assert healthy["problems"] == [] and healthy["linger"] is True
    (entry,) = healthy["schedules"]
    assert entry["timer_matches"] is True and entry["active"] == "active"
    assert entry["next_elapse"] and "03:00:00" in entry["next_elapse"]
    timer_file = f"{UNIT_DIR}/cairn-schedule@{sid}.timer"
    expected = machine.exec(["cat", timer_file]).stdout

    machine.exec(["rm", timer_file], user="alice")
    broken = machine.exec(["cairn", "schedule", "doctor"], user="alice", check=False)
    assert broken.returncode == 1
    assert f"{sid}: timer file {timer_file} is missing" in broken.stdout.decode()

    # At the next start of the user manager, the reconciler puts it back.
    machine.exec(["systemctl", "stop", "user@1001.service"])
    machine.exec(["systemctl", "start", "user@1001.service"])
    wait_until(
        "the reconciler to restore the timer",
        lambda: (
            machine.exec(["cairn", "schedule", "doctor"], user="alice", check=False).returncode == 0
        ),
        timeout=60,
    )
    assert machine.exec(["cat", timer_file]).stdout == expected
    assert f"cairn-schedule@{sid}.timer" in user_systemctl(machine, "list-timers")
    reconcile_log = machine.exec(
        ["journalctl", "--user", "-u", "cairn-schedule-reconcile.service", "--no-pager",
         "--output=cat"],
        user="alice",
    ).stdout.decode()  # fmt: skip
    assert f"cairn-schedule@{sid}.timer: installed" in reconcile_log

    # Pausing removes the timer; doctor stays clean.
    cairn(machine, "schedule", "pause", sid)
    assert machine.exec(["test", "-e", timer_file], check=False).returncode == 1
    assert json.loads(cairn(machine, "schedule", "doctor", "--json"))["problems"] == []


def install_release(machine: Machine, source: str, *extra: str) -> str:
    """Install ``source`` as alice's user:release the way she would: review, then confirm."""
    machine.exec(["mkdir", "-p", "/home/alice/wf"], user="alice")
    machine.exec(["tee", "/home/alice/wf/release.py"], user="alice", input=source.encode())
    review = cairn(machine, "workflow", "review", "/home/alice/wf/release.py")
    confirmed = review.strip().splitlines()[-1].split()[1]
    cairn(machine, "workflow", "install", "/home/alice/wf/release.py", "--confirm", confirmed,
          *extra)  # fmt: skip
    return confirmed


def test_timer_fires_a_user_definition_as_pinned_and_a_reinstall_blocks_it(
    machine: Machine,
) -> None:
    """The timer's worker (sandboxed, home read-only) reads alice's installed user:release
    and sends it; cairnd launches it only at the review hash the schedule pinned."""
    script = prepare(machine)
    source = (REPO / "cairn" / "builtin" / "workflows" / "implement.py").read_text()
    pinned = install_release(machine, source)
    sid = enable(
        machine, "weekday-release", script, "user:release",
        calendar="*:*:00/10", catch_up="none", max_runs="1", valid_until="2099-01-01T00:00:00Z",
    )  # fmt: skip
    assert inspect(machine, sid)["review_hash"] == pinned

    launched = wait_until(
        "the timer to launch user:release",
        lambda: [o for o in occurrences(machine, sid) if o["state"] == "launched"],
    )[0]
    assert launched["trigger"] == "timer"
    desc = launch_description(machine, launched["run_id"])
    assert (desc["definition"], desc["review_hash"]) == ("user:release", pinned)
    assert desc["source"] == source and desc["schedule"]["id"] == sid
    wait_until(
        "the scheduled run to finish",
        lambda: run_state(machine, launched["run_id"]) == "succeeded",
    )
    changelog = machine.exec(["cat", f"{PROJECT}/CHANGELOG.md"]).stdout.decode()
    assert "entry from weekday-release" in changelog

    # alice installs another version: the next trigger is refused and blocks the schedule.
    changed = install_release(machine, source.replace("max_length=4_000", "max_length=5_000"),
                              "--replace")  # fmt: skip
    reason = (
        f"definition user:release changed since the schedule was reviewed (review hash now "
        f"{changed}, the schedule pins {pinned})"
    )
    blocked = wait_until(
        "the timer to find user:release changed",
        lambda: inspect(machine, sid)["status"] == "blocked" and inspect(machine, sid),
    )
    assert blocked["blocked_reason"] == reason
    refused = [o for o in occurrences(machine, sid) if o["state"] == "refused"]
    assert refused[-1]["trigger"] == "timer" and refused[-1]["reason"] == reason
    inbox = json.loads(cairn(machine, "schedule", "inbox", "--json"))
    assert ("blocked", reason) in [(i["kind"], i["message"]) for i in inbox]
    log = machine.exec(
        ["journalctl", "--user", "-u", f"cairn-schedule@{sid}.service", "--no-pager",
         "--output=cat"],
        user="alice",
    ).stdout.decode()  # fmt: skip
    assert f"refused: {reason}" in log
    again = machine.exec(["cairn", "schedule", "resume", sid], user="alice", check=False)
    assert again.returncode != 0
    first_line = again.stderr.decode().splitlines()[0]
    assert first_line.startswith(f"cairn: schedule {sid} cannot resume: ")
    assert first_line.endswith(reason)  # after "max-runs 1 reached; "
    assert [o["run_id"] for o in occurrences(machine, sid) if o["run_id"]] == [launched["run_id"]]
