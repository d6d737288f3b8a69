"""One vocabulary for runs and schedules (``list``, ``show``, ``repair``), and the names of
the previous release still working: ``ps`` as the short name of ``list``, the schedules'
``inspect`` and ``reconcile`` saying what they are called now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import runs, schedule
from cairn.cli.commands import app
from cairn.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
# a run as cairnd lists it (cairn.protocol.daemon.RunListing)
RUN: dict[str, Any] = {"run_id": "flow_" + "3fa9" * 8, "state": "running", "position": None,
                       "definition": "builtin:implement", "project": "/srv/app",
                       "owner_uid": 1000, "created_at": 0.0, "run_key": None,
                       "current_op": None, "settlement_summary": None}
APPLIED = {"status": "applied", "label": "applied 2 paths", "complete": True, "accepted": 2,
           "applied": 2, "already_applied": 0, "refused": 0, "ignored": 0, "conflicts": 0,
           "reverted": False}
SCHEDULE_ID = "0123456789ab"


def runner() -> CliRunner:
    return CliRunner()


def test_list_and_ps_are_the_same_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body)
        return [RUN]

    monkeypatch.setattr(runs, "request", request)
    listed = runner().invoke(app, ["list", "--json"])
    short = runner().invoke(app, ["ps", "--json"])
    assert listed.exit_code == short.exit_code == 0, listed.output + short.output
    assert listed.stdout == short.stdout and RUN["run_id"] in listed.stdout
    assert short.stderr == ""
    assert [b.op for b in sent] == ["ps", "ps"]


@pytest.mark.parametrize(("old", "new"), [("inspect", "show"), ("reconcile", "repair")])
def test_old_schedule_names_work_and_say_the_new_one(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    sent: list[Any] = []

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body.op)
        if body.op == "schedule-inspect":
            raise UsageError("stop here")
        return {"schedules": [], "repaired": 0, "queued": []}

    monkeypatch.setattr(schedule, "request", request)
    monkeypatch.setattr(schedule, "apply_timers", lambda _schedules: ["timers checked"])
    args = [SCHEDULE_ID] if new == "show" else []
    now = runner().invoke(app, ["schedule", new, *args])
    before = runner().invoke(app, ["schedule", old, *args])
    assert sent[0] == sent[1] and len(sent) == 2
    assert (now.exit_code, now.stdout) == (before.exit_code, before.stdout)
    assert now.stderr == ""
    assert before.stderr == (
        f"cairn: 'schedule {old}' is now 'schedule {new}'; "
        "the old name goes in a later release\n"
    )


def test_help_lists_the_new_names_only() -> None:
    top = runner().invoke(app, ["--help"], terminal_width=120).stdout
    assert " list " in top and " ps " not in top
    schedules = runner().invoke(app, ["schedule", "--help"], terminal_width=120).stdout
    for name in ("list", "show", "doctor", "repair"):
        assert f" {name} " in schedules, name
    assert " inspect " not in schedules and " reconcile " not in schedules
    # one removal verb everywhere; the other words people type still work, unlisted
    for group, others in (("schedule", ("delete",)), ("workflow", ("remove",)),
                          ("provider", ("remove", "delete"))):
        shown = runner().invoke(app, [group, "--help"], terminal_width=120).stdout
        assert " rm " in shown, group
        for other in others:
            assert f" {other} " not in shown, (group, other)
            works = runner().invoke(app, [group, other, "--help"], terminal_width=120)
            assert works.exit_code == 0 and f"Usage: cairn {group} {other} " in works.stdout


def test_the_user_manager_runs_the_new_name() -> None:
    unit = (REPO / "units/user/cairn-schedule-reconcile.service").read_text()
    assert "ExecStart=/usr/bin/cairn schedule repair\n" in unit


def _listing(monkeypatch: pytest.MonkeyPatch, home: Path) -> list[dict[str, Any]]:
    monkeypatch.setenv("HOME", str(home))
    listed = [
        {**RUN, "run_id": "flow_3fa9c0d1" + "0" * 24, "state": "failed",
         "project": f"{home}/src/demo", "created_at": 2.0, "run_key": None,
         "current_op": {"op_id": "root-1", "kind": "agent", "state": "failed"}},
        {**RUN, "run_id": "flow_3fa9c0d2" + "0" * 24, "state": "succeeded",
         "project": "/srv/app", "created_at": 1.0, "run_key": None,
         "settlement_summary": APPLIED},
        {**RUN, "run_id": "flow_7b21" + "e" * 28, "state": "queued", "position": 3,
         "project": "/srv/other\x1b[2J", "created_at": 0.0, "run_key": None},
    ]
    monkeypatch.setattr(runs, "request", lambda body, **_: listed)
    return listed


def test_list_shows_short_ids_the_project_and_escapes_what_it_quotes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _listing(monkeypatch, tmp_path)
    out = runner().invoke(app, ["list"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATE", "DEFINITION", "PROJECT", "CURRENT", "SETTLEMENT",
                                "STARTED"]
    assert [line.split()[:2] for line in lines[1:]] == [
        ["3fa9c0d1", "failed"], ["3fa9c0d2", "succeeded"], ["7b21eeee", "queued#3"]]
    assert "~/src/demo" in lines[1] and "root-1 failed" in lines[1]
    assert "applied 2 paths" in lines[2]
    assert "/srv/other\\x1b[2J" in lines[3] and "\x1b" not in out.stdout
    assert max(len(line) for line in lines) < 120


def test_list_filters_by_state_limits_and_prints_ids_or_a_template(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    listed = _listing(monkeypatch, tmp_path)
    ids = [r["run_id"] for r in listed]
    quiet = runner().invoke(app, ["list", "-q", "--state", "failed", "-s", "queued"])
    assert quiet.stdout.splitlines() == [ids[0], ids[2]]
    assert runner().invoke(app, ["list", "-q", "-n", "1"]).stdout.splitlines() == ids[:1]
    formatted = runner().invoke(app, ["list", "--format", "{state}:{run_key}:{project}"])
    assert formatted.stdout.splitlines() == [
        f"failed:-:{tmp_path}/src/demo", "succeeded:-:/srv/app", "queued:-:/srv/other\\x1b[2J"]


def test_list_json_takes_the_fields_to_keep_as_gh_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    listed = _listing(monkeypatch, tmp_path)
    whole = runner().invoke(app, ["list", "--json", "--state", "failed"])
    assert json.loads(whole.stdout) == [listed[0]]
    cut = runner().invoke(app, ["list", "--json", "state,run_id", "-n", "2"])
    assert cut.exit_code == 0, cut.output
    assert json.loads(cut.stdout) == [{"state": r["state"], "run_id": r["run_id"]}
                                      for r in listed[:2]]


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--state", "done"], "'done' is not a run state"),
     (["--format", "{nope}"], "--format names 'nope', which no run has"),
     (["--format", "{state"], "is not a template"),
     (["-q", "--json"], "give one"),
     (["--json", "state,nope"], "--json names 'nope', which no run has"),
     (["--limit", "0"], "--limit")],
)
def test_list_refuses_a_bad_option_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], says: str
) -> None:
    _listing(monkeypatch, tmp_path)
    out = runner().invoke(app, ["list", *args])
    assert out.exit_code == 2
    assert says in out.stderr
    assert out.stdout == ""
