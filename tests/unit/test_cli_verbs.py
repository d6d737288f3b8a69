"""One vocabulary for runs and schedules (``list``, ``show``, ``repair``), and the names of
the previous release still working: ``ps`` as the short name of ``list``, the schedules'
``inspect`` and ``reconcile`` saying what they are called now."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cairn.cli import runs, schedule
from cairn.cli.commands import app

REPO = Path(__file__).resolve().parents[2]
RUN = {"run_id": "flow_" + "3fa9" * 8, "state": "running", "definition": "builtin:implement",
       "current_op": None, "settlement_summary": None, "created_at": 0.0}
SCHEDULE_ID = "0123456789ab"


def runner() -> CliRunner:
    return CliRunner(mix_stderr=False)


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
            raise schedule.UsageError("stop here")
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


def test_the_user_manager_runs_the_new_name() -> None:
    unit = (REPO / "units/user/cairn-schedule-reconcile.service").read_text()
    assert "ExecStart=/usr/bin/cairn schedule repair\n" in unit
