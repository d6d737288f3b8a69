"""Schedules of ``user:`` and ``project:`` definitions: the person's CLI reads the source as
installed or trusted (cairnd never reads the person's files), cairnd pins its review hash
at create and checks every fire's sent source against the pin; a changed source is refused
with one line and blocks the schedule. cairnd's side runs on the real schedule store and
journal (the host fixture of test_schedule_rules); launches fail after admission, as there
(the owner has no account on this host)."""

# ruff: noqa: F811 - ``host`` is test_schedule_rules' fixture, taken as an argument here

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_schedule_rules import OWNER, _call, _request, _script, host  # noqa: F401

from cairn.cli import schedule as cli_schedule
from cairn.daemon import launch as daemon_launch
from cairn.daemon import schedules as daemon_schedules
from cairn.definitions import trust, user
from cairn.errors import PermissionDenied, UsageError
from cairn.protocol.definitions import trust_hash
from cairn.workflow.review import review_source

SOURCE = user.draft_source("release")
CHANGED = SOURCE.replace("max_length=4_000", "max_length=5_000")


def review_hash(source: str, name: str) -> str:
    return review_source(source, filename=f"{name}.py").review_hash


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "cairn"


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every launch request admission makes (then launched as usual)."""
    seen: list[Any] = []
    real = daemon_launch.launch

    def recording(journal: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(request)
        return real(journal, request, *args, **kwargs)

    monkeypatch.setattr(daemon_launch, "launch", recording)
    return seen


def install(tmp_path: Path, source: str, *, replace: bool = False) -> None:
    file = tmp_path / "release.py"
    file.write_text(source)
    user.install(file, review_hash(source, "release"), replace=replace)


def sent(host: dict[str, Any], definition: str) -> dict[str, Any]:
    """What the person's CLI sends with a resume or fire of ``definition`` now."""
    source, source_error = cli_schedule._current_source(definition, host["project"], host["fd"])
    return {"source": source, "source_error": source_error}


def create(
    host: dict[str, Any], definition: str, source: str | None, confirm: str | None
) -> dict[str, Any]:
    """``schedule-create`` of ``definition`` with the source and hash the CLI sends."""
    request = _request(
        "schedule-create",
        project=host["project"],
        source=source,
        confirm=confirm,
        schedule={
            "name": "nightly",
            "definition": definition,
            "args": {"objective": "add an entry"},
            "calendar": "*-*-* 03:00:00",
            "timezone": "UTC",
            "catch_up": "once",
            "max_runs": 5,
            "valid_until": "2099-01-01T00:00:00Z",
            "scripted": {"builtin:implementer": {"name": "x", "kind": "scripted", **_script()}},
        },
    )
    return daemon_schedules.dispatch(  # type: ignore[no-any-return]
        host["journal"], request, OWNER, host["fd"], clock=host["clock"]
    )


def enable(host: dict[str, Any], definition: str) -> dict[str, Any]:
    source, pinned = cli_schedule._pinned_source(definition, host["fd"], host["project"])
    created = create(host, definition, source, pinned)
    _call(
        host,
        "schedule-confirm",
        challenge=created["challenge"],
        schedule={"action": created["action"]},
    )
    _call(host, "schedule-resume", schedule_id=created["schedule_id"], **sent(host, definition))
    return created


def test_create_pins_the_installed_review_hash_and_fire_sends_the_source(
    host: dict[str, Any], config: Path, tmp_path: Path, launches: list[Any]
) -> None:
    install(tmp_path, SOURCE)
    created = enable(host, "user:release")
    assert created["review_hash"] == review_hash(SOURCE, "release")
    sid = created["schedule_id"]
    fired = _call(host, "schedule-run-now", schedule_id=sid, **sent(host, "user:release"))
    # admitted: the launch itself fails only because the owner has no account here
    assert fired["outcome"] == "launch-failed" and "has no account" in fired["reason"]
    assert [(r.definition, r.source, r.confirm) for r in launches] == [
        ("user:release", SOURCE, created["review_hash"])
    ]


def test_create_refuses_a_user_definition_without_its_confirmed_source(
    host: dict[str, Any], config: Path
) -> None:
    with pytest.raises(UsageError) as missing:
        create(host, "user:release", None, None)
    assert missing.value.message == "user:release: its source was not sent"
    with pytest.raises(PermissionDenied) as unconfirmed:
        create(host, "user:release", SOURCE, review_hash(CHANGED, "release"))
    assert unconfirmed.value.message == (
        "user:release does not match its confirmed hash: its review hash is "
        + review_hash(SOURCE, "release")
    )


def test_a_file_is_refused_with_what_to_schedule_instead(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli_schedule._pinned_source("release.py", host["fd"], host["project"])
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "cairn: release.py is a file; schedules take installed definitions",
        "hint: install it with 'cairn workflow install release.py --confirm sha256:…' and "
        "schedule user:NAME",
    ]


def test_a_reinstalled_user_definition_is_refused_and_blocks_the_schedule(
    host: dict[str, Any], config: Path, tmp_path: Path, launches: list[Any]
) -> None:
    install(tmp_path, SOURCE)
    sid = enable(host, "user:release")["schedule_id"]
    install(tmp_path, CHANGED, replace=True)
    fired = _call(host, "schedule-run-now", schedule_id=sid, **sent(host, "user:release"))
    reason = (
        "definition user:release changed since the schedule was reviewed (review hash now "
        f"{review_hash(CHANGED, 'release')}, the schedule pins {review_hash(SOURCE, 'release')})"
    )
    assert (fired["outcome"], fired["reason"], fired["blocked"]) == ("refused", reason, True)
    assert launches == []
    shown = _call(host, "schedule-inspect", schedule_id=sid)
    assert (shown["status"], shown["blocked_reason"]) == ("blocked", reason)
    assert [(i["kind"], i["message"]) for i in _call(host, "schedule-inbox")] == [
        ("blocked", reason)
    ]
    # Resume checks it again: refused with the same reason until it is renewed.
    with pytest.raises(UsageError, match="changed since the schedule was reviewed"):
        _call(host, "schedule-resume", schedule_id=sid, **sent(host, "user:release"))
    # Sending the pinned source is not enough either: the schedule stays blocked.
    again = _call(host, "schedule-run-now", schedule_id=sid, source=SOURCE)
    assert again["reason"] == f"schedule is blocked: {reason}"


def test_an_uninstalled_user_definition_blocks_with_the_cli_reason(
    host: dict[str, Any], config: Path, tmp_path: Path
) -> None:
    install(tmp_path, SOURCE)
    sid = enable(host, "user:release")["schedule_id"]
    user.remove("release")
    fired = _call(host, "schedule-run-now", schedule_id=sid, **sent(host, "user:release"))
    assert fired["outcome"] == "refused" and fired["blocked"]
    assert fired["reason"] == (
        "definition user:release cannot be read: user:release is not installed"
    )


def test_a_project_definition_is_pinned_and_a_change_after_trust_blocks(
    host: dict[str, Any], config: Path, launches: list[Any]
) -> None:
    workflows = Path(host["project"]) / ".cairn" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "tidy.py").write_text(SOURCE)
    trust.trust(host["project"], trust_hash(host["project"], {"tidy": review_hash(SOURCE, "tidy")}))
    created = enable(host, "project:tidy")
    assert created["review_hash"] == review_hash(SOURCE, "tidy")
    sid = created["schedule_id"]
    fired = _call(host, "schedule-run-now", schedule_id=sid, **sent(host, "project:tidy"))
    assert fired["outcome"] == "launch-failed"
    assert [(r.source, r.confirm) for r in launches] == [(SOURCE, created["review_hash"])]
    (workflows / "tidy.py").write_text(CHANGED)
    blocked = _call(host, "schedule-run-now", schedule_id=sid, **sent(host, "project:tidy"))
    assert (blocked["outcome"], blocked["blocked"]) == ("refused", True)
    assert blocked["reason"] == (
        f"definition project:tidy cannot be read: project:tidy changed since {host['project']}"
        f" was trusted (review hash now {review_hash(CHANGED, 'tidy')})"
    )
    assert len(launches) == 1
