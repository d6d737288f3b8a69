"""Schedules: calendar handling through the real systemd-analyze, the admission rules, and
cairnd's schedule store on real SQLite with the real journal.

Launches here fail before any broker is involved (the owner has no account on this host),
which is exactly what exercises the launch-failure path; successful launches, overlap and
lease limits with real runs are in tests/system/test_schedules.py.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cairn.daemon import schedules as daemon_schedules
from cairn.errors import NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import DaemonRequest, daemon_request
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.schedules import (
    AdmissionFacts,
    ScheduleSpec,
    decide,
    elapses_after,
    latest_elapse,
    normalize_calendar,
    parse_instant,
    parse_timespan,
    render_timer,
    review_challenge,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docs" / "examples" / "changelog-agent.json"
OWNER = 54321  # no account: every launch fails before reaching a broker

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (package systemd)"
)


def spec(**changes: Any) -> ScheduleSpec:
    base: dict[str, Any] = {
        "name": "nightly",
        "owner_uid": 1001,
        "definition": "builtin:implement",
        "review_hash": "sha256:" + "a" * 64,
        "args": {"objective": "x"},
        "project": "/home/alice/demo",
        "project_dev": 1,
        "project_ino": 2,
        "calendar": "*-*-* 09:00:00 UTC",
        "timezone": "UTC",
        "catch_up": "once",
        "max_runs": 2,
        "valid_until": 2_000_000_000.0,
        "min_spacing_sec": 60,
        "overlap": "skip",
        "profiles": {},
    }
    return ScheduleSpec.model_validate({**base, **changes})


def facts(**changes: Any) -> AdmissionFacts:
    base: dict[str, Any] = {
        "now": 1_900_000_000.0,
        "status": "enabled",
        "confirmed": True,
        "definition_review_hash": "sha256:" + "a" * 64,
        "project_matches": True,
        "duplicate": False,
        "used_in_revision": 0,
        "own_active_runs": [],
        "own_queued": 0,
        "last_launch_at": None,
        "machine_active": 0,
        "machine_limit": 4,
    }
    return AdmissionFacts.model_validate({**base, **changes})


# --- admission rules ----------------------------------------------------------------------


def test_admits_when_every_rule_holds() -> None:
    assert decide(spec(), facts()).outcome == "admit"


@pytest.mark.parametrize(
    ("change", "outcome", "reason"),
    [
        ({"duplicate": True}, "duplicate", "already decided"),
        ({"status": "paused"}, "refuse", "schedule is paused"),
        ({"status": "blocked", "blocked_reason": "3 failures"}, "refuse", "blocked: 3 failures"),
        ({"confirmed": False}, "refuse", "not confirmed"),
        ({"definition_review_hash": "sha256:" + "b" * 64}, "refuse", "changed since"),
        ({"definition_review_hash": None}, "refuse", "changed since"),
        ({"project_matches": False}, "refuse", "not the reviewed directory"),
        ({"now": 2_000_000_000.0}, "refuse", "valid-until 2033-05-18T03:33:20Z has passed"),
        ({"used_in_revision": 2}, "refuse", "max-runs 2 reached"),
        ({"own_active_runs": ["flow_x"]}, "refuse", "overlaps active run flow_x"),
        ({"last_launch_at": 1_900_000_000.0 - 59}, "refuse", "min-spacing 60s"),
        ({"machine_active": 4}, "refuse", "machine-wide limit of 4"),
    ],
)
def test_each_rule_refuses(change: dict[str, Any], outcome: str, reason: str) -> None:
    decision = decide(spec(), facts(**change))
    assert decision.outcome == outcome
    assert reason in decision.reason


def test_spacing_allows_exactly_at_the_limit() -> None:
    assert decide(spec(), facts(last_launch_at=1_900_000_000.0 - 60)).outcome == "admit"


def test_queue_one_keeps_one_occurrence_behind_the_active_run() -> None:
    queue_one = spec(overlap="queue-one")
    first = decide(queue_one, facts(own_active_runs=["flow_x"]))
    assert (first.outcome, first.reason) == ("queue", "queued behind active run flow_x")
    second = decide(queue_one, facts(own_active_runs=["flow_x"], own_queued=1))
    assert second.outcome == "refuse"
    assert "already queued" in second.reason


# --- calendar, spans, instants, challenge, timer ------------------------------------------


def test_calendar_is_normalized_with_its_timezone() -> None:
    assert normalize_calendar("*-*-* 9:00", "UTC") == "*-*-* 09:00:00 UTC"
    assert normalize_calendar("Mon..Fri 18:00", "Europe/Berlin") == (
        "Mon..Fri *-*-* 18:00:00 Europe/Berlin"
    )


@pytest.mark.parametrize(
    ("calendar", "timezone", "message"),
    [
        ("garbage", "UTC", "invalid calendar 'garbage'"),
        ("*-*-* 09:00 UTC", "UTC", "does not combine with timezone"),
        ("*-*-* 09:00", "Nowhere/City", "does not combine with timezone"),
        ("*-*-* 09:00", "UTC\nExecStart=/bin/sh", "invalid timezone"),
        ("*-*-* 09:00\n[Service]", "UTC", "one line"),
    ],
)
def test_bad_calendars_are_refused(calendar: str, timezone: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("*", r"\*")):
        normalize_calendar(calendar, timezone)


def test_elapses_and_latest_elapse() -> None:
    base = datetime(2030, 1, 1, 8, 0, tzinfo=UTC).timestamp()
    day = 86400.0
    assert elapses_after("*-*-* 09:00:00 UTC", base, 2) == [base + 3600, base + 3600 + day]
    # Strictly after the base: an elapse at the base itself is not repeated.
    assert elapses_after("*-*-* 09:00:00 UTC", base + 3600, 1) == [base + 3600 + day]
    calendar = "*-*-* 09:00:00 UTC"
    assert latest_elapse(calendar, base, base + 3599) is None
    assert latest_elapse(calendar, base, base + 3600) == base + 3600
    # Three missed elapses stand for one occurrence: the latest.
    assert latest_elapse(calendar, base, base + 3 * day) == base + 3600 + 2 * day
    # A dense calendar over a long gap still finds its latest elapse.
    assert latest_elapse("*:*:*", base, base + 2 * day + 0.5) == base + 2 * day


def test_timespans_and_instants() -> None:
    assert parse_timespan("0") == 0
    assert parse_timespan("90s") == 90
    assert parse_timespan("1h 30min") == 5400
    with pytest.raises(UsageError):
        parse_timespan("soon")
    assert parse_instant("2028-01-01T00:00:00Z") == datetime(2028, 1, 1, tzinfo=UTC).timestamp()
    with pytest.raises(UsageError, match="no UTC offset"):
        parse_instant("2028-01-01T00:00:00")


def test_challenge_covers_action_revision_and_every_field() -> None:
    one = review_challenge("0123456789ab", 1, "create", spec())
    assert one.startswith("sha256:") and len(one) == 71
    assert review_challenge("0123456789ab", 1, "create", spec()) == one
    others = {
        review_challenge("0123456789ab", 1, "replace", spec()),
        review_challenge("0123456789ab", 2, "create", spec()),
        review_challenge("0123456789ac", 1, "create", spec()),
        review_challenge("0123456789ab", 1, "create", spec(max_runs=3)),
        review_challenge("0123456789ab", 1, "create", spec(args={"objective": "y"})),
        review_challenge("0123456789ab", 1, "create", spec(catch_up="none")),
    }
    assert one not in others and len(others) == 6


def test_timer_holds_only_the_schedule_id_and_calendar() -> None:
    text = render_timer("0123456789ab", 3, spec(catch_up="once"))
    timer = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and "#" not in line
    )
    assert timer == {
        "Description": "Cairn schedule nightly (0123456789ab, revision 3)",
        "OnCalendar": "*-*-* 09:00:00 UTC",
        "Persistent": "true",
        "AccuracySec": "1min",
        "RandomizedDelaySec": "0",
        "WakeSystem": "no",
        "Unit": "cairn-schedule@0123456789ab.service",
        "WantedBy": "timers.target",
    }
    assert "Persistent=false" in render_timer("0123456789ab", 3, spec(catch_up="none"))
    assert "/home/alice" not in text and "objective" not in text


# --- cairnd's store and admission on real SQLite ------------------------------------------


class Clock:
    """Time that moves only when a test says so, and by a millisecond on every reading
    (so two occurrences decided one after the other are still at distinct instants)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        self.now += 0.001
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A host layout under tmp_path with a project owned by OWNER and open as a fd."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the project directory to another uid")
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    project = tmp_path / "home" / "demo"
    project.mkdir(parents=True)
    os.chown(project, OWNER, OWNER)
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    clock = Clock(time.time())
    journal = Journal(tmp_path / "journal.db", create=True, clock=clock)
    store = daemon_schedules.Store(daemon_schedules.store_path(), clock=clock)
    try:
        yield {
            "fd": fd,
            "project": str(project),
            "journal": journal,
            "store": store,
            "clock": clock,
        }
    finally:
        store.close()
        journal.close()
        os.close(fd)


def _request(op: str, **fields: Any) -> DaemonRequest:
    return daemon_request(op, **fields)


def _create(host: dict[str, Any], **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "nightly",
        "definition": "builtin:implement",
        "args": {"objective": "add an entry"},
        "calendar": "*-*-* 03:00:00",
        "timezone": "UTC",
        "catch_up": "once",
        "max_runs": 5,
        "valid_until": "2099-01-01T00:00:00Z",
        "scripted": {
            "builtin:implementer": {"name": "x", "kind": "scripted", **_script()},
        },
        **changes,
    }
    request = _request("schedule-create", project=host["project"], schedule=body)
    return daemon_schedules.dispatch(  # type: ignore[no-any-return]
        host["journal"], request, OWNER, host["fd"], clock=host["clock"]
    )


def _script() -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads(SCRIPT.read_text())
    return data


def _call(host: dict[str, Any], op: str, **fields: Any) -> Any:
    fd = host["fd"] if op in ("schedule-resume", "schedule-fire", "schedule-run-now") else None
    return daemon_schedules.dispatch(
        host["journal"], _request(op, **fields), OWNER, fd, clock=host["clock"]
    )


def _enable(host: dict[str, Any], **changes: Any) -> str:
    created = _create(host, **changes)
    action, challenge = created["action"], created["challenge"]
    _call(host, "schedule-confirm", challenge=challenge, schedule={"action": action})
    _call(host, "schedule-resume", schedule_id=created["schedule_id"])
    return str(created["schedule_id"])


def test_create_stores_paused_with_challenge_and_refuses_the_past(host: dict[str, Any]) -> None:
    created = _create(host)
    assert created["status"] == "paused" and created["awaiting_confirmation"]
    assert created["calendar"] == "*-*-* 03:00:00 UTC"
    assert created["timer"] is None
    with pytest.raises(UsageError, match="in the past"):
        _create(host, name="late", valid_until="2001-01-01T00:00:00Z")
    with pytest.raises(UsageError, match="exists"):
        _create(host)
    # Resume before confirmation is refused and names the challenge to confirm.
    with pytest.raises(UsageError, match=created["challenge"]):
        _call(host, "schedule-resume", schedule_id=created["schedule_id"])


def test_confirm_binds_action_and_latest_revision(host: dict[str, Any]) -> None:
    first = _create(host)
    with pytest.raises(UsageError, match="confirms a create"):
        _call(
            host, "schedule-confirm", challenge=first["challenge"], schedule={"action": "replace"}
        )
    second = _create(host, replace=True, max_runs=7)
    assert (second["schedule_id"], second["revision"], second["action"]) == (
        first["schedule_id"],
        2,
        "replace",
    )
    with pytest.raises(UsageError, match="stale challenge"):
        _call(host, "schedule-confirm", challenge=first["challenge"], schedule={"action": "create"})
    confirmed = _call(
        host, "schedule-confirm", challenge=second["challenge"], schedule={"action": "replace"}
    )
    assert confirmed["confirmed_revision"] == 2 and confirmed["status"] == "paused"
    resumed = _call(host, "schedule-resume", schedule_id=first["schedule_id"])
    assert resumed["status"] == "enabled"
    assert "OnCalendar=*-*-* 03:00:00 UTC" in resumed["timer"]
    assert resumed["max_runs"] == 7
    # Another user sees nothing.
    with pytest.raises(NotFound):
        daemon_schedules.dispatch(
            host["journal"],
            _request("schedule-inspect", schedule_id=first["schedule_id"]),
            OWNER + 1,
            None,
            clock=host["clock"],
        )


def test_launch_failures_are_counted_then_block_the_schedule(host: dict[str, Any]) -> None:
    sid = _enable(host, min_spacing="0")
    outcomes = [_call(host, "schedule-run-now", schedule_id=sid) for _ in range(4)]
    assert [o["outcome"] for o in outcomes] == ["launch-failed"] * 3 + ["refused"]
    assert "blocked: 3 consecutive launch failures" in outcomes[3]["reason"]
    listed = _call(host, "schedule-list")
    assert listed[0]["status"] == "blocked" and listed[0]["runs_used"] == 0
    kinds = [item["kind"] for item in _call(host, "schedule-inbox")]
    assert kinds.count("launch-failed") == 3 and kinds.count("blocked") == 1
    # A person resumes: the counter resets and the schedule is enabled again.
    assert _call(host, "schedule-resume", schedule_id=sid)["launch_failures"] == 0


def test_repeated_timer_trigger_for_one_elapse_is_a_noop(host: dict[str, Any]) -> None:
    clock = host["clock"]
    at = datetime.fromtimestamp(clock.now + 2, UTC).strftime("%Y-%m-%d %H:%M:%S")
    sid = _enable(host, calendar=at)
    assert _call(host, "schedule-fire", schedule_id=sid)["outcome"] == "duplicate"
    clock.advance(max(0.0, parse_instant(at + "Z") - clock.now) + 0.2)
    first = _call(host, "schedule-fire", schedule_id=sid)
    assert first["outcome"] == "launch-failed"
    assert first["key"] == f"calendar:{int(parse_instant(at + 'Z'))}"
    again = _call(host, "schedule-fire", schedule_id=sid)
    assert again["outcome"] == "duplicate"
    occurrences = _call(host, "schedule-inspect", schedule_id=sid)["occurrences"]
    assert [o["key"] for o in occurrences] == [first["key"]]


def test_paused_and_expired_schedules_refuse_and_record(host: dict[str, Any]) -> None:
    sid = _enable(host)
    _call(host, "schedule-pause", schedule_id=sid)
    refused = _call(host, "schedule-run-now", schedule_id=sid)
    assert (refused["outcome"], refused["reason"]) == ("refused", "schedule is paused")
    short = _enable(
        host,
        name="short",
        valid_until=datetime.fromtimestamp(host["clock"].now + 1.5, UTC).isoformat(),
    )
    host["clock"].advance(1.6)
    expired = _call(host, "schedule-run-now", schedule_id=short)
    assert expired["outcome"] == "refused" and "has passed" in expired["reason"]
    states = [o["state"] for o in _call(host, "schedule-inspect", schedule_id=short)["occurrences"]]
    assert states == ["refused"]
    with pytest.raises(UsageError, match="has passed"):
        _call(host, "schedule-resume", schedule_id=short)


def _insert_preparing(host: dict[str, Any], sid: str, run_id: str) -> None:
    now = host["clock"]()
    with host["store"].transaction() as db:
        db.execute(
            "INSERT INTO occurrences (schedule_id, key, trigger, nominal, revision, state,"
            " reason, run_id, launched_at, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                sid,
                f"run-now:{now}",
                "run-now",
                now,
                1,
                "preparing",
                "admitted",
                run_id,
                now,
                now,
                now,
            ),
        )


def test_half_prepared_occurrences_are_repaired(host: dict[str, Any]) -> None:
    """A cairnd that died mid-launch leaves 'preparing': launched if its run exists (and
    then it overlaps the next trigger), a launch failure if not."""
    sid = _enable(host)
    lost = "flow_" + "1" * 32
    _insert_preparing(host, sid, lost)
    created = "flow_" + "2" * 32
    host["journal"].create_run(
        LaunchDescription(
            run_id=created,
            owner_uid=OWNER,
            owner_gid=OWNER,
            owner_name="x",
            definition="builtin:implement",
            source="",
            source_filename="implement.py",
            review_hash="sha256:" + "a" * 64,
            review={},
            args={},
            project=ProjectSpec(root=host["project"], owner_uid=OWNER, on_pool_fs=False),
            profiles={},
            cairn_version="0",
            created_at=host["clock"](),
        ),
        intents=[],
    )
    host["clock"].advance(0.01)
    _insert_preparing(host, sid, created)
    result = daemon_schedules.dispatch(
        host["journal"], _request("schedule-reconcile"), OWNER, None, clock=host["clock"]
    )
    assert result["repaired"] == 2
    by_run = {
        o["run_id"]: o for o in _call(host, "schedule-inspect", schedule_id=sid)["occurrences"]
    }
    assert by_run[lost]["state"] == "launch-failed"
    assert "interrupted" in by_run[lost]["reason"]
    assert by_run[created]["state"] == "launched"
    refused = _call(host, "schedule-run-now", schedule_id=sid)
    assert refused["outcome"] == "refused"
    assert refused["reason"] == f"overlaps active run {created}"
