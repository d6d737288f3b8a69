"""The replies typed last (:mod:`cairn.protocol.run_replies`: ``ping``, ``launch``,
``upgrade``, ``watch``; :class:`~cairn.protocol.replies.OccurrenceDecision` of
``schedule-fire`` and ``schedule-run-now`` and
:class:`~cairn.protocol.replies.ScheduleReconcileReply`): what the CLI prints from each
(``--json``: the reply as cairnd sent it), a reply that does not fit is a CairnError, and
cairnd's ``ping`` is its model. ``watch`` and ``schedule-reconcile`` replies that do not
fit are in test_cli_typed_replies.py; the daemon's launch, upgrade, watch and admission
replies are built through their models in test_admission.py, test_upgrade.py,
test_interactions.py and test_schedule_definitions.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner
from test_cli_typed_replies import SCHEDULE, schedule_detail

from cairn.cli import launching, people, runs, schedule, schedulepins
from cairn.cli.commands import app
from cairn.daemon import server, views
from cairn.errors import CairnError
from cairn.protocol.daemon import PingRequest
from cairn.protocol.replies import OccurrenceDecision, ScheduleReconcileReply, ScheduleView
from cairn.protocol.run_replies import LaunchReply, PingReply, UpgradeReply

RUN = "flow_" + "3fa9" * 8
HASH = "sha256:" + "a" * 64


def wire(reply: Any) -> Any:
    """``reply`` as cairnd sends it: a key it never set left out."""
    return reply.model_dump(mode="json", exclude_unset=True)


# --- launch ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "said"), [
    (LaunchReply(run_id=RUN, review_hash=HASH, launch_hash=HASH, state="pending"), ""),
    (LaunchReply(run_id=RUN, review_hash=HASH, launch_hash=HASH, state="queued", position=2),
     f"queued (position 2): the machine runs as many runs as its limit allows; {RUN} starts"),
    (LaunchReply(run_id=RUN, review_hash=HASH, launch_hash=HASH, state="running",
                 launched_before=True),
     f"run key k names run {RUN} (running), launched before: not launched again"),
])
def test_a_launch_reads_its_reply_as_the_model_has_it(
    reply: LaunchReply, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(launching, "request", lambda body, **_: wire(reply))
    assert launching.launch("builtin:goal", project=tmp_path, run_key="k") == RUN
    out, err = capsys.readouterr()
    assert out == f"{RUN}\n" and err.startswith(said)
    launching.launch("builtin:goal", project=tmp_path, run_key="k", json_out=True)
    assert json.loads(capsys.readouterr().out) == wire(reply)


# --- upgrade --------------------------------------------------------------------------------


def upgrade_reply(**changes: Any) -> UpgradeReply:
    return UpgradeReply.model_validate({
        "run_id": RUN, "from_hash": HASH, "to_hash": "sha256:" + "b" * 64, "checked": 3,
        "committed": 3, "divergence": None, "locations": {"root-1": "wf.py:3"}, **changes})


@pytest.mark.parametrize(("reply", "printed", "code"), [
    (upgrade_reply(), [f"{RUN}: the new source reproduces all 3 committed operation(s)"], 0),
    (upgrade_reply(upgraded=True), [
        f"{RUN}: the new source reproduces all 3 committed operation(s)",
        f"moved to sha256:{'b' * 64} (was {HASH})"], 0),
    (upgrade_reply(divergence={"op_id": "root-2", "field": "request", "expected": {"a": 1},
                               "actual": "\x1b[2J"}),
     [f"{RUN}: diverges at root-2 (request)", '  expected: {"a": 1}',
      '  actual:   "\\u001b[2J"'], 1),
])
def test_upgrade_prints_its_typed_reply_and_json_is_what_cairnd_sent(
    reply: UpgradeReply, printed: list[str], code: int, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = tmp_path / "wf.py"
    source.write_text("pass\n")
    monkeypatch.setattr(runs, "request", lambda body, **_: wire(reply))
    argv = ["upgrade", RUN, "--to", str(source)]
    result = CliRunner().invoke(app, argv)
    assert (result.exit_code, result.stdout.splitlines()) == (code, printed)
    result = CliRunner().invoke(app, [*argv, "--json"])
    assert json.loads(result.stdout) == wire(reply)
    assert ("upgraded" in json.loads(result.stdout)) == reply.upgraded


def test_an_upgrade_reply_that_does_not_fit_is_a_cairn_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "wf.py"
    source.write_text("pass\n")
    monkeypatch.setattr(runs, "request", lambda body, **_: {"run_id": RUN, "checked": "all"})
    result = CliRunner().invoke(app, ["upgrade", RUN, "--to", str(source)])
    assert isinstance(result.exception, CairnError), result
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"


# --- schedules ------------------------------------------------------------------------------


@pytest.fixture
def scheduled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A schedule of builtin:implement on ``tmp_path``, unpinned, as schedule-inspect
    answers it; the replies of the other ops are set by the test."""
    monkeypatch.setattr(schedulepins, "pinned", lambda _schedule_id: None)
    replies: dict[str, Any] = {"schedule-inspect": schedule_detail(tmp_path, "active", HASH)}
    monkeypatch.setattr(schedule, "request", lambda body, **_: replies[body.op])
    return replies


LAUNCHED = OccurrenceDecision(
    schedule_id=SCHEDULE, trigger="run-now", key="run-now:1.000000",
    nominal="2026-12-07T02:00:00Z", outcome="launched", reason="admitted", run_id=RUN,
    revision=1, launch_hash=HASH)
REFUSED = OccurrenceDecision(
    schedule_id=SCHEDULE, trigger="timer", key="calendar:1", nominal="2026-12-07T02:00:00Z",
    blocked=True, outcome="refused", reason="the definition changed")
DUPLICATE = OccurrenceDecision(
    schedule_id=SCHEDULE, trigger="timer", outcome="duplicate",
    reason="no calendar elapse since the last decided occurrence")


def test_run_now_prints_the_run_and_json_is_what_cairnd_sent(
    scheduled: dict[str, Any],
) -> None:
    scheduled["schedule-run-now"] = wire(LAUNCHED)
    result = CliRunner().invoke(app, ["schedule", "run-now", SCHEDULE])
    assert (result.exit_code, result.stdout) == (0, f"{RUN}\n")
    result = CliRunner().invoke(app, ["schedule", "run-now", SCHEDULE, "--json"])
    assert json.loads(result.stdout) == wire(LAUNCHED)
    scheduled["schedule-run-now"] = wire(REFUSED)
    result = CliRunner().invoke(app, ["schedule", "run-now", SCHEDULE])
    assert result.exit_code == 1
    assert "run-now refused: the definition changed" in result.stderr


@pytest.mark.parametrize(("decided", "line", "code"), [
    (LAUNCHED, f"{SCHEDULE} run-now:1.000000: launched: admitted: {RUN}", 0),
    (REFUSED, f"{SCHEDULE} calendar:1: refused: the definition changed", 1),
    (DUPLICATE, f"{SCHEDULE} -: duplicate: no calendar elapse since the last decided "
                "occurrence", 0),
])
def test_fire_reports_the_decision_in_one_line(
    scheduled: dict[str, Any], decided: OccurrenceDecision, line: str, code: int
) -> None:
    scheduled["schedule-fire"] = wire(decided)
    result = CliRunner().invoke(app, ["schedule", "fire", SCHEDULE])
    assert (result.exit_code, result.stdout) == (code, f"{line}\n")


def test_repair_retries_each_queued_occurrence_once(
    scheduled: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    views: list[Any] = []

    def apply_timers(given: Any) -> list[str]:
        views.extend(given)
        return []

    monkeypatch.setattr(schedule, "apply_timers", apply_timers)
    detail = {k: v for k, v in scheduled["schedule-inspect"].items()
              if k in ScheduleView.model_fields}
    scheduled["schedule-reconcile"] = ScheduleReconcileReply.model_validate({
        "schedules": [detail], "repaired": 2,
        "queued": [{"schedule_id": SCHEDULE, "key": "calendar:1"}]}).model_dump(mode="json")
    scheduled["schedule-fire"] = wire(REFUSED)
    result = CliRunner().invoke(app, ["schedule", "repair"])
    assert result.stdout.splitlines() == [
        "repaired 2 half-prepared occurrence(s)",
        f"{SCHEDULE} calendar:1: refused: the definition changed"]
    assert views == [detail]


def test_an_occurrence_decision_that_does_not_fit_is_a_cairn_error(
    scheduled: dict[str, Any],
) -> None:
    scheduled["schedule-run-now"] = {"schedule_id": SCHEDULE, "outcome": 1}
    result = CliRunner().invoke(app, ["schedule", "run-now", SCHEDULE])
    assert isinstance(result.exception, CairnError), result
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"


# --- cancel --dry-run, ping -----------------------------------------------------------------


def test_a_cancel_dry_run_reads_the_show_reply_through_its_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(people, "request", lambda body, **_: {"run": {"run_id": RUN}})
    result = CliRunner().invoke(app, ["cancel", RUN, "--dry-run"])
    assert isinstance(result.exception, CairnError), result
    assert result.exception.message == "cairnd sent a reply this CLI cannot read"


def test_ping_answers_with_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "is_admin", lambda uid: uid == 0)
    _model, handler = server.ROUTES["ping"]
    answer = handler(None, PingRequest(), 1000, None)  # type: ignore[arg-type]
    assert PingReply.model_validate(answer) == PingReply(uid=1000, admin=False)
    assert answer == {"uid": 1000, "admin": False}
