"""Notification hooks: the event a hook reads, which files may run as hooks, how they are
started (the user's own manager, never as root), the shipped examples, and cairnd's
answer to the notifier (only the caller's runs, by cursor).

Runs as root (files of other owners); the cases that need root skip otherwise.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import cast

import pytest
from pydantic import ValidationError
from test_interactions import (
    OWNER,
    RUN,
    ask_and_exit,
    create_run,
    incarnation,
    journal_of,
    root,
    wait_for_approval,
)

from cairn import proc
from cairn.daemon import server
from cairn.daemon.notifications import notifications
from cairn.errors import UsageError
from cairn.notify import (
    HookDir,
    cursor_path,
    deliver,
    discover_hooks,
    hook_unit_properties,
    load_cursor,
    run_hooks,
    save_cursor,
)
from cairn.protocol.daemon import NotificationsRequest, daemon_request, request_line
from cairn.protocol.notify import NotifyBatch, NotifyEvent
from cairn.systemd import Prop

__all__ = ["root"]  # the fixture, shared with test_interactions
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples" / "notify.d"
ME = os.geteuid()
NOBODY = 65534


def event(kind: str = "waiting", **update: object) -> NotifyEvent:
    data: dict[str, object] = {
        "event": kind, "cursor": 7, "at": 1.0, "run_id": RUN, "definition": "user:x",
        "state": "waiting", "summary": "s",
        "waiting": [{"kind": "question", "op_id": "root-1", "question": "Ship it?",
                     "command": f"cairn answer {RUN} --challenge sha256:00 VALUE"}],
    }
    return NotifyEvent.model_validate({**data, **update})


def test_the_event_model_is_closed_and_versioned() -> None:
    sample = event()
    assert json.loads(sample.model_dump_json())["version"] == 1
    for bad in ({"event": "started"}, {"extra": 1}, {"summary": "x" * 501}, {"cursor": 0}):
        with pytest.raises(ValidationError):
            event(**bad)


def hook(folder: Path, name: str, mode: int = 0o755, body: str = "#!/bin/sh\n") -> Path:
    path = folder / name
    path.write_text(body)
    os.chmod(path, mode)
    return path


@pytest.fixture
def hooks_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "notify.d"
    folder.mkdir(mode=0o755)
    return folder


def test_only_safe_executables_are_hooks(hooks_dir: Path, tmp_path: Path) -> None:
    if ME != 0:
        pytest.skip("needs root to make files of another owner")
    good_b, good_a = hook(hooks_dir, "b-good"), hook(hooks_dir, "a-good", 0o700)
    hook(hooks_dir, ".hidden")
    hook(hooks_dir, "backup~")
    hook(hooks_dir, "group-writable", 0o775)
    hook(hooks_dir, "world-writable", 0o757)
    hook(hooks_dir, "not-executable", 0o644)
    os.chown(hook(hooks_dir, "someone-elses"), NOBODY, NOBODY)
    target = hook(tmp_path, "elsewhere")
    (hooks_dir / "link").symlink_to(target)
    (hooks_dir / "subdir").mkdir()
    found = discover_hooks([HookDir(path=hooks_dir, owner=ME)])
    assert found.run == [good_a, good_b]
    reasons = {r.path.name: r.reason for r in found.refused}
    assert reasons == {
        "group-writable": "writable by its group or others (chmod go-w)",
        "world-writable": "writable by its group or others (chmod go-w)",
        "not-executable": "not executable (chmod u+x)",
        "someone-elses": f"owned by uid {NOBODY}, not {ME}",
        "link": "a symbolic link (put the file itself here)",
        "subdir": "not a regular file",
    }


def test_notify_list_prints_the_hooks_and_the_refusals_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clirunner import CliRunner

    from cairn.cli.commands import app

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path / "host"))
    mine = tmp_path / "config" / "cairn" / "notify.d"
    mine.mkdir(parents=True, mode=0o755)
    good = hook(mine, "record")
    hook(mine, "loose", 0o777)
    result = CliRunner().invoke(app, ["notify", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "run": [str(good)],
        "refused": [{"path": str(mine / "loose"),
                     "reason": "writable by its group or others (chmod go-w)"}],
    }


def test_an_unsafe_directory_runs_nothing(hooks_dir: Path, tmp_path: Path) -> None:
    hook(hooks_dir, "good")
    os.chmod(hooks_dir, 0o777)
    found = discover_hooks([HookDir(path=hooks_dir, owner=ME)])
    assert found.run == [] and [r.path for r in found.refused] == [hooks_dir]
    os.chmod(hooks_dir, 0o755)
    assert discover_hooks([HookDir(path=hooks_dir, owner=ME + 1)]).run == []
    link = tmp_path / "linked.d"
    link.symlink_to(hooks_dir)
    found = discover_hooks([HookDir(path=link, owner=ME)])
    assert found.run == [] and found.refused[0].reason.startswith("a symbolic link")
    assert discover_hooks([HookDir(path=tmp_path / "missing", owner=ME)]).run == []


def test_user_hooks_come_before_the_hosts(tmp_path: Path) -> None:
    mine, host = tmp_path / "mine", tmp_path / "host"
    for folder in (mine, host):
        folder.mkdir()
    z, a = hook(mine, "z"), hook(host, "a")
    found = discover_hooks([HookDir(path=mine, owner=ME), HookDir(path=host, owner=ME)])
    assert found.run == [z, a]


def test_a_hook_is_a_user_unit_with_the_event_on_stdin() -> None:
    sample = event()
    path = "/home/a/.config/cairn/notify.d/x"
    props = {name: value for name, _sig, value in hook_unit_properties(Path(path), sample)}
    assert props["ExecStart"] == [(path, [path], False)]
    assert props["StandardInput"] == "data"
    assert NotifyEvent.model_validate_json(cast(bytes, props["StandardInputData"])) == sample
    assert props["RuntimeMaxUSec"] == 120_000_000
    assert props["Environment"] == ["CAIRN_NOTIFY_EVENT=waiting", f"CAIRN_RUN={RUN}"]
    # no user, group or privilege property: the user's own manager runs it as the user
    assert not {"User", "Group", "DynamicUser", "AmbientCapabilities"} & set(props)


class Started:
    """Stands in for the user manager: the units it was asked to start."""

    def __init__(self) -> None:
        self.units: list[tuple[str, list[Prop]]] = []

    def __call__(self, name: str, props: list[Prop]) -> None:
        self.units.append((name, props))

    def hooks(self) -> list[str]:
        starts = [{n: v for n, _s, v in props}["ExecStart"] for _u, props in self.units]
        return [cast("list[tuple[str, list[str], bool]]", start)[0][0] for start in starts]


def test_hooks_never_run_as_root(hooks_dir: Path) -> None:
    started = Started()
    with pytest.raises(UsageError, match="never run as root"):
        run_hooks(event(), [hook(hooks_dir, "h")], started, euid=0)
    assert started.units == []
    units = run_hooks(event(), [hook(hooks_dir, "h")], started, euid=1000)
    assert len(units) == 1 and units[0].startswith("cairn-notify-7-0-")
    assert started.units[0][0] == units[0] and started.hooks() == [str(hooks_dir / "h")]


def test_deliver_runs_each_safe_hook_and_skips_the_rest(
    hooks_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    hook(hooks_dir, "a")
    hook(hooks_dir, "b", 0o777)
    started = Started()
    units = deliver(event(), [HookDir(path=hooks_dir, owner=ME)], started)
    assert len(units) == 1 and started.hooks() == [str(hooks_dir / "a")]


def test_the_cursor_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = cursor_path(ME)
    assert path == tmp_path / "cairn" / "notify-cursor" and load_cursor(path) is None
    save_cursor(path, 0)  # a journal without events yet
    assert load_cursor(path) == 0
    save_cursor(path, 42)
    assert load_cursor(path) == 42
    path.write_text("junk")
    assert load_cursor(path) is None


def stand_in(bin_dir: Path, name: str) -> Path:
    """An executable ``name`` that records its argv (one per line) and its stdin."""
    log = bin_dir / f"{name}.log"
    hook(bin_dir, name, body=f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\ncat > {log}.stdin\n')
    return log


def run_example(name: str, tmp_path: Path, sample: NotifyEvent) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = "curl" if name == "webhook" else "notify-send"
    log = stand_in(bin_dir, tool)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc.run([str(EXAMPLES / name)], input=sample.model_dump_json().encode(), env=env, timeout=30)
    return log


def test_the_examples_are_executable_hooks() -> None:
    for name in ("notify-send", "webhook"):
        assert stat.S_IMODE((EXAMPLES / name).stat().st_mode) == 0o755


def test_the_notify_send_example(tmp_path: Path) -> None:
    log = run_example("notify-send", tmp_path, event(summary=f"{RUN} waits for you: Ship it?"))
    assert log.read_text().splitlines() == [
        "--app-name=cairn", "--urgency=critical", "--",
        f"Cairn: {RUN} waiting", f"{RUN} waits for you: Ship it?",
    ]


def test_the_webhook_example(tmp_path: Path) -> None:
    config = tmp_path / "config" / "cairn"
    config.mkdir(parents=True)
    (config / "webhook-url").write_text("http://127.0.0.1:9/hook\n")
    sample = event("succeeded", state="succeeded", waiting=[])
    log = run_example("webhook", tmp_path, sample)
    argv = log.read_text().splitlines()
    assert argv[-2:] == ["--", "http://127.0.0.1:9/hook"]
    assert "--data-binary" in argv and "Content-Type: application/json" in argv
    assert NotifyEvent.model_validate_json(Path(f"{log}.stdin").read_bytes()) == sample


def test_the_webhook_example_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no URL in"):
        run_example("webhook", tmp_path, event())


def test_cairnd_notifies_only_the_callers_runs_from_the_cursor(root: Path) -> None:
    with journal_of(root) as journal:
        start = NotifyBatch.model_validate(
            notifications(journal, NotificationsRequest(cursor=-1), OWNER)
        )
        assert start.events == [] and start.cursor == 0  # no events at all yet
    ask_and_exit(root)  # the run asks and waits: event run-waiting
    other = "flow_" + "0" * 31 + "b"
    create_run(root, other)
    with journal_of(root) as journal:
        batch = NotifyBatch.model_validate(
            notifications(journal, NotificationsRequest(cursor=start.cursor), OWNER)
        )
        (waiting,) = batch.events
        assert waiting.event == "waiting" and waiting.run_id == RUN
        assert waiting.waiting[0].question == "Which colour for the shed?"
        assert waiting.waiting[0].command.startswith(f"cairn answer {RUN} --challenge sha256:")
        assert waiting.summary == (
            f"{RUN} waits for you: Which colour for the shed?; next: {waiting.waiting[0].command}"
        )
        # another user sees nothing of alice's run
        theirs = notifications(journal, NotificationsRequest(cursor=start.cursor), OWNER + 1)
        assert theirs["events"] == [] and theirs["cursor"] == batch.cursor
        # nothing new after the cursor the notifier got
        again = notifications(journal, NotificationsRequest(cursor=batch.cursor), OWNER)
        assert again["events"] == [] and again["cursor"] == batch.cursor
        coord = incarnation(other)
        coord.journal.set_run_state(other, "failed", token=coord.token, error="broker down")
        (failed,) = NotifyBatch.model_validate(
            notifications(journal, NotificationsRequest(cursor=batch.cursor), OWNER)
        ).events
        assert failed.event == "failed" and failed.error == "broker down"
        assert failed.summary == f"{other} failed: broker down"


def test_the_request_goes_on_the_socket_with_its_cursor() -> None:
    assert daemon_request("notifications", cursor=5) == NotificationsRequest(cursor=5)
    line = request_line(NotificationsRequest())
    assert server.parse(line) == NotificationsRequest(cursor=-1)


def test_follow_starts_from_now_then_runs_hooks_for_each_new_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clirunner import CliRunner

    from cairn.cli import notify as cli_notify
    from cairn.cli.commands import app

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    hooks = tmp_path / "config" / "cairn" / "notify.d"
    hooks.mkdir(parents=True)
    hook(hooks, "h")
    asked: list[int] = []
    answers = {
        -1: NotifyBatch(events=[], cursor=6),
        6: NotifyBatch(events=[event()], cursor=9),
        9: NotifyBatch(events=[], cursor=9),
    }

    def fake_request(body: NotificationsRequest) -> object:
        asked.append(body.cursor)
        return answers[body.cursor].model_dump(mode="json")

    started = Started()
    monkeypatch.setattr(cli_notify, "request", fake_request)
    monkeypatch.setattr(cli_notify, "start_user_unit", started)
    runner = CliRunner()
    first = runner.invoke(app, ["notify", "follow", "--once"])
    assert first.exit_code == 0, first.output
    assert asked == [-1, 6] and "waiting " + RUN + ": 1 hooks started" in first.output
    assert started.hooks() == [str(hooks / "h")]
    second = runner.invoke(app, ["notify", "follow", "--once"])
    assert second.exit_code == 0 and asked[2:] == [9] and len(started.units) == 1


def test_an_approval_request_notifies_waiting_with_its_command(root: Path) -> None:
    with journal_of(root) as journal:
        start = journal.last_event_cursor()
    _coord, request_id, fingerprint = wait_for_approval(root, 'default = "require_approval"\n')
    with journal_of(root) as journal:
        batch = NotifyBatch.model_validate(
            notifications(journal, NotificationsRequest(cursor=start), OWNER)
        )
    question, approval = batch.events  # one for the question, one for the approval
    assert question.event == approval.event == "waiting"
    (item,) = approval.waiting
    assert item.kind == "approval" and item.request_id == request_id
    assert item.command == f"cairn approve {RUN} {request_id} --fingerprint {fingerprint}"
    assert approval.summary == f"{RUN} waits for you: approval {request_id}; next: {item.command}"
    assert item.commands == [item.command, f"cairn reject {RUN} {request_id} --reason …"]
