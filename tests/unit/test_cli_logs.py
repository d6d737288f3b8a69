"""``cairn logs``: the journalctl command line cairnd builds (trusted fields only, every
value one word), the cursor it follows from, the CLI's checks of -p/-o/--since, and -f
on an injected clock."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn import paths
from cairn.cli import journalview
from cairn.cli import logs as cli_logs
from cairn.cli.commands import app
from cairn.daemon import server, views
from cairn.errors import CairnError, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import LogsRequest, daemon_request, request_line
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.runlogs import (
    FOLLOW_BATCH,
    journalctl_argv,
    log_units,
    operation_units,
    split_cursor,
)
from cairn.workflow.review import review_source

RUN = "flow_" + "3fa9" + "0" * 28
OTHER = "flow_" + "7b21" + "0" * 28
CURSOR = "s=0123abcd;i=1f;b=89ef;m=2a;t=5f00;x=77"
LATER = "s=0123abcd;i=20;b=89ef;m=2b;t=5f01;x=78"
UNITS = [f"cairn-coordinator@{RUN}.service", f"cairn-agent-{RUN}-root-1-1.service"]


def query(**fields: Any) -> LogsRequest:
    return LogsRequest.model_validate({"run_id": RUN, **fields})


# --- the command line ---------------------------------------------------------------


def test_matches_are_the_units_own_entries_or_pid1_about_them() -> None:
    argv = journalctl_argv(UNITS, query(lines=2000))
    assert argv[:5] == ["journalctl", "--no-pager", "--quiet", "--show-cursor",
                        "--output=short-iso"]
    assert "--lines=2000" in argv
    plus = argv.index("+")
    assert argv[plus - 2:] == [
        f"_SYSTEMD_UNIT={UNITS[0]}", f"_SYSTEMD_UNIT={UNITS[1]}", "+",
        "_PID=1", f"UNIT={UNITS[0]}", f"UNIT={UNITS[1]}",
    ]
    # nothing an agent could send selects an entry
    assert not [a for a in argv if a.startswith(("CAIRN_", "MESSAGE", "SYSLOG_IDENTIFIER"))]


def test_every_choice_is_one_option_word_before_the_matches() -> None:
    argv = journalctl_argv(
        UNITS, query(since="--file=/etc/shadow", priority="err..warning", output="json", lines=5)
    )
    assert "--since=--file=/etc/shadow" in argv
    assert "--priority=err..warning" in argv and "--output=json" in argv
    assert "--file=/etc/shadow" not in argv
    assert argv.index("--lines=5") < argv.index(f"_SYSTEMD_UNIT={UNITS[0]}")


def test_grep_until_and_reverse_are_journalctls_own_options_one_word_each() -> None:
    argv = journalctl_argv(UNITS, query(grep="--file=x|error", until="-1h", reverse=True,
                                        lines=20))
    assert "--grep=--file=x|error" in argv and "--until=-1h" in argv and "--reverse" in argv
    assert "--file=x|error" not in argv and "-1h" not in argv
    assert argv.index("--reverse") < argv.index(f"_SYSTEMD_UNIT={UNITS[0]}")
    # following goes forward from the cursor: never reversed, still filtered
    following = journalctl_argv(UNITS, query(grep="error", reverse=True, after_cursor=CURSOR))
    assert "--reverse" not in following and "--grep=error" in following


def test_one_operation_is_its_agent_units_of_every_attempt() -> None:
    units = [*UNITS, f"cairn-agent-{RUN}-root-1-2.service", f"cairn-agent-{RUN}-root-10-1.service",
             f"cairn-import-{RUN}.service"]
    assert operation_units(RUN, "root-1", units) == [
        f"cairn-agent-{RUN}-root-1-1.service", f"cairn-agent-{RUN}-root-1-2.service"]
    assert operation_units(RUN, "root-2", units) == []
    # the name the broker gives an attempt is the one matched here
    from cairn.unitprops import agent_unit_name

    assert operation_units(RUN, "root-1-3", [agent_unit_name(RUN, "root-1-3", 12)]) != []
    assert operation_units(RUN, "root-1", [agent_unit_name(RUN, "root-1-3", 12)]) == []


def test_an_operation_without_an_agent_unit_is_not_found_and_journalctl_is_not_run(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_journalctl(monkeypatch, "")
    with pytest.raises(CairnError, match="operation root-9 of .* started no agent unit"):
        views.logs(journal, query(op_id="root-9"), 1001)
    assert calls == []


def test_following_reads_forward_from_the_cursor_in_batches() -> None:
    argv = journalctl_argv(UNITS, query(after_cursor=CURSOR, since="today", priority="3"))
    assert f"--after-cursor={CURSOR}" in argv and f"--lines={FOLLOW_BATCH}" in argv
    assert "--priority=3" in argv
    # the cursor, not the time, says where to go on
    assert not [a for a in argv if a.startswith("--since")]


def test_without_lines_every_entry_and_none_of_the_old_ones_still_has_a_cursor() -> None:
    assert not [a for a in journalctl_argv(UNITS, query()) if a.startswith("--lines")]
    assert "--lines=1" in journalctl_argv(UNITS, query(lines=0))
    out = f"2026-01-02T10:00:00+0000 host cairn-agent[7]: old\n-- cursor: {CURSOR}\n"
    assert split_cursor(out, query(lines=0)) == ("", CURSOR)


def test_log_units_are_the_runs_own_by_name() -> None:
    receipts: list[dict[str, Any]] = [
        {"data": {"unit": f"cairn-agent-{RUN}-root-1-1.service"}},
        {"data": {"import": {"unit": f"cairn-import-{RUN}.service"}}},
        {"data": {"unit": f"cairn-proxy-{RUN}.socket"}},
        {"data": {"unit": f"cairn-agent-{OTHER}-root-1-1.service"}},
        {"data": {"unit": "sshd.service"}},
    ]
    assert log_units(RUN, receipts) == [
        f"cairn-coordinator@{RUN}.service", f"cairn-egress@{RUN}.service",
        f"cairn-agent-{RUN}-root-1-1.service", f"cairn-import-{RUN}.service",
        f"cairn-proxy-{RUN}.socket", f"cairn-proxy-{RUN}.service",
    ]


# --- the cursor ---------------------------------------------------------------------


def test_the_cursor_is_journalctls_last_line_only() -> None:
    forged = "-- cursor: s=ffff;i=1"
    out = f"a: {forged}\n{forged}\nb: last\n-- cursor: {CURSOR}\n"
    text, cursor = split_cursor(out, query(after_cursor=LATER))
    assert cursor == CURSOR
    assert text == f"a: {forged}\n{forged}\nb: last\n"


@pytest.mark.parametrize("out", ["", "a: line\n", "a: x\n-- cursor: s=1;i=2 --file=/x\n"])
def test_no_cursor_unless_journalctl_printed_a_well_formed_one(out: str) -> None:
    assert split_cursor(out, query()) == (out, None)


# --- what cairnd answers --------------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Journal]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    source = (
        "from cairn.workflow import Model, workflow\n\n"
        "class Goal(Model):\n    goal: str\n\n"
        '@workflow(description="d", input=Goal, output=Goal)\n'
        "async def run(flow, args: Goal) -> Goal:\n    return args\n"
    )
    review = review_source(source, filename="wf.py")
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(
            LaunchDescription(
                run_id=RUN, owner_uid=1001, owner_gid=1001, owner_name="alice",
                definition="builtin:implement", source=source, source_filename="wf.py",
                review_hash=review.review_hash, review=review.model_dump(mode="json"),
                args={"goal": "g"},
                project=ProjectSpec(root="/home/alice/p", owner_uid=1001, on_pool_fs=False),
                profiles={}, cairn_version="0", created_at=1.0,
            ),
            intents=[],
        )
        yield journal


def fake_journalctl(
    monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str = "", returncode: int = 0
) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(argv: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, returncode, stdout.encode(), stderr.encode())

    monkeypatch.setattr(views, "run", run)
    return calls


def test_cairnd_answers_entries_cursor_and_whether_the_run_ended(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_journalctl(monkeypatch, f"x cairn-agent[7]: hello\n-- cursor: {CURSOR}\n")
    request = server.parse(request_line(daemon_request("logs", run_id="3fa9", priority="err")))
    reply = server.dispatch(request, 1001, None)
    assert reply == {"run_id": RUN, "state": "pending", "finished": False,
                     "text": "x cairn-agent[7]: hello\n", "cursor": CURSOR}
    (argv,) = calls
    assert "--priority=err" in argv and f"_SYSTEMD_UNIT=cairn-coordinator@{RUN}.service" in argv


def test_another_users_run_is_never_read(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_journalctl(monkeypatch, "")
    with pytest.raises(CairnError, match=f"no run {RUN}"):
        server.dispatch(daemon_request("logs", run_id=RUN), 1002, None)
    assert calls == []


def test_a_time_journalctl_cannot_read_is_a_usage_error(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_journalctl(monkeypatch, "", 'Failed to parse timestamp: soon-ish\n', returncode=1)
    with pytest.raises(UsageError, match="'soon-ish' is not a time journalctl can read") as err:
        views.logs(journal, query(since="soon-ish"), 1001)
    assert err.value.hint is not None and "1 hour ago" in err.value.hint
    with pytest.raises(UsageError, match="^--until 'soon-ish' is not a time"):
        views.logs(journal, query(since="today", until="soon-ish"), 1001)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("priority", "loud", "is not a syslog level"), ("output", "export", "output"),
     ("after_cursor", "s=1;--x", "after_cursor"), ("lines", 10_001, "lines"),
     ("grep", "a\nb", "--grep takes a pattern"), ("grep", "x" * 257, "--grep takes a pattern"),
     ("until", "", "--until takes a time"), ("op_id", "Root 1", "op_id"),
     ("op_id", "root-1-1.service --x", "op_id")],
)
def test_the_socket_refuses_a_bad_query(field: str, value: Any, message: str) -> None:
    line = json.dumps({"op": "logs", "run_id": RUN, field: value}).encode() + b"\n"
    with pytest.raises(UsageError, match=message):
        server.parse(line)


# --- the CLI --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-p", "loud"], "priority 'loud' is not a syslog level"),
        (["--priority", "8"], "priority '8' is not a syslog level"),
        (["-o", "export"], "'export' is not one of short, short-full"),
        (["--output", "pretty"], "'pretty' is not one of"),
        (["--since", "x\ty"], "--since takes a time of at most 64 printable characters"),
        (["-n", "-3"], "-3 is not in the range"),
        (["--until", ""], "--until takes a time of at most 64 printable characters"),
        (["-g", "a\nb"], "--grep takes a pattern of at most 256 printable characters"),
        (["--op", "Root 1"], "'Root 1' is not an operation ID"),
        (["-r", "-f"], "give one"),
    ],
)
def test_bad_options_are_one_line_usage_errors(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.setattr(cli_logs, "request", lambda *_a, **_k: pytest.fail("asked cairnd"))
    result = CliRunner().invoke(app, ["logs", "3fa9", *argv], terminal_width=200)
    assert result.exit_code == 2
    assert message in plain(result.output)


def test_logs_prints_the_last_entries_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[LogsRequest] = []

    def request(body: LogsRequest, **_kwargs: Any) -> dict[str, Any]:
        sent.append(body)
        return {"run_id": RUN, "state": "succeeded", "text": "one\ntwo\n", "cursor": CURSOR,
                "finished": True}

    monkeypatch.setattr(cli_logs, "request", request)
    result = CliRunner().invoke(app, ["logs", "@last", "-p", "warning", "-o", "cat"])
    assert result.exit_code == 0, result.output
    assert result.output == "one\ntwo\n"
    assert [(b.run_id, b.lines, b.priority, b.output) for b in sent] == [
        ("@last", cli_logs.DEFAULT_LINES, "warning", "cat")
    ]


def plain(output: str) -> str:
    """The CLI's output without the frame the terminal library draws around an error."""
    return " ".join(output.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


class Replies:
    """cairnd's answers in order; records what was asked and every pause."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.asked: list[LogsRequest] = []
        self.pauses: list[float] = []
        self.shown: list[str] = []

    def ask(self, request: LogsRequest) -> dict[str, Any]:
        self.asked.append(request)
        return {"run_id": RUN, "state": "running", "finished": False, **self.replies.pop(0)}


def test_follow_prints_what_comes_after_it_started_and_ends_after_the_run() -> None:
    replies = Replies(
        {"text": "old\n", "cursor": CURSOR},
        {"text": "", "cursor": CURSOR},
        {"text": "new\n", "cursor": LATER},
        {"text": "", "cursor": LATER, "finished": True},
        {"text": "Deactivated\n", "cursor": "s=1;i=30"},
        {"text": "", "cursor": "s=1;i=30", "finished": True},
        {"text": "", "cursor": "s=1;i=30", "finished": True},
    )
    cli_logs.follow_logs(
        query(lines=10, since="today", priority="err"), ask=replies.ask,
        show=replies.shown.append, pause=replies.pauses.append, interval=0.5,
    )
    assert "".join(replies.shown) == "old\nnew\nDeactivated\n"
    assert replies.replies == []
    first, *rest = replies.asked
    assert (first.lines, first.since, first.after_cursor) == (10, "today", None)
    assert [r.after_cursor for r in rest] == [CURSOR, CURSOR, LATER, LATER, "s=1;i=30",
                                              "s=1;i=30"]
    assert all(r.priority == "err" and r.since is None and r.lines is None for r in rest)
    # asked again at once after new entries, after a pause otherwise
    assert replies.pauses == [0.5, 0.5, 0.5]


def test_follow_before_anything_was_logged_asks_for_everything_new() -> None:
    replies = Replies(
        {"text": "", "cursor": None},
        {"text": "first\n", "cursor": CURSOR},
        {"text": "", "cursor": CURSOR, "finished": True},
        {"text": "", "cursor": CURSOR, "finished": True},
    )
    cli_logs.follow_logs(
        query(lines=10), ask=replies.ask, show=replies.shown.append,
        pause=replies.pauses.append,
    )
    assert "".join(replies.shown) == "first\n"
    assert [(r.lines, r.after_cursor) for r in replies.asked] == [
        (10, None), (None, None), (None, CURSOR), (None, CURSOR)
    ]


def test_ctrl_c_while_following_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([{"run_id": RUN, "state": "running", "text": "a\n", "cursor": CURSOR,
                     "finished": False}])

    def request(_body: LogsRequest, **_kwargs: Any) -> dict[str, Any]:
        for answer in answers:
            return answer
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_logs, "request", request)
    result = CliRunner().invoke(app, ["logs", "3fa9", "-f"])
    assert result.exit_code == 130
    assert result.output == "a\n"


def test_following_shows_ten_old_entries_unless_since_asks_for_more() -> None:
    assert cli_logs.default_lines(follow=True, since=None) == cli_logs.FOLLOW_LINES == 10
    assert cli_logs.default_lines(follow=True, since="today") == cli_logs.DEFAULT_LINES
    assert cli_logs.default_lines(follow=False, since=None) == cli_logs.DEFAULT_LINES == 2000


def _entry(message: object, priority: str = "6", **fields: object) -> str:
    return json.dumps({
        "__REALTIME_TIMESTAMP": "1765045244000000", "_HOSTNAME": "host", "_PID": "42",
        "SYSLOG_IDENTIFIER": "cairn-worker", "PRIORITY": priority, "MESSAGE": message, **fields,
    })


def test_on_a_terminal_each_message_is_coloured_by_its_priority() -> None:
    text = "\n".join([
        _entry("boom", "3"), _entry("careful", "4"), _entry("note", "5"), _entry("fine"),
        _entry("chatter", "7"),
    ])
    shown = journalview.render(text, colour=True).splitlines()
    stamp = datetime.fromtimestamp(1765045244, tz=UTC).astimezone().isoformat(timespec="seconds")
    assert shown == [
        f"{stamp} host cairn-worker[42]: \x1b[1;31mboom\x1b[0m",
        f"{stamp} host cairn-worker[42]: \x1b[1;33mcareful\x1b[0m",
        f"{stamp} host cairn-worker[42]: \x1b[1mnote\x1b[0m",
        f"{stamp} host cairn-worker[42]: fine",
        f"{stamp} host cairn-worker[42]: \x1b[38;5;245mchatter\x1b[0m",
    ]


def test_what_an_entry_carries_is_escaped_and_only_cairns_colours_are_written() -> None:
    hostile = _entry("\x1b[2J\x1b]0;owned\x07red?\x1b[31m", "3",
                     SYSLOG_IDENTIFIER="a\x1b[1mgent", _HOSTNAME="h\rst")
    (line,) = journalview.render(hostile, colour=True).splitlines()
    escapes = [i for i, c in enumerate(line) if c == "\x1b"]
    assert len(escapes) == 2  # the red of priority 3 and its reset, nothing else
    assert line.endswith("\x1b[1;31m\\x1b[2J\\x1b]0;owned\\x07red?\\x1b[31m\x1b[0m")
    assert " h\\rst a\\x1b[1mgent[42]: " in line


def test_a_message_of_several_lines_is_indented_and_binary_is_shown_escaped() -> None:
    text = "\n".join([_entry("first\nsecond"), _entry([104, 105, 255, 10, 27]),
                      "-- not json --"])
    shown = journalview.render(text, colour=False).splitlines()
    prefix = shown[0].split("first")[0]
    assert shown[1] == " " * len(prefix) + "second"
    assert shown[2].endswith(": hi\\xff") and shown[3].endswith("\\x1b")
    assert shown[4] == "-- not json --"


def test_logs_colour_a_terminal_and_never_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[LogsRequest] = []

    def request(body: LogsRequest, **_kwargs: Any) -> dict[str, Any]:
        sent.append(body)
        text = _entry("boom", "3") + "\n" if body.output == "json" else "plain line\n"
        return {"run_id": RUN, "state": "succeeded", "text": text, "cursor": CURSOR,
                "finished": True}

    def last_output() -> str:  # each invoke below sends one more request
        return sent[-1].output

    monkeypatch.setattr(cli_logs, "request", request)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(cli_logs, "colour_wanted", lambda: True)
    shown = CliRunner().invoke(app, ["logs", "@last", "--no-pager"])
    assert shown.exit_code == 0, shown.output
    assert last_output() == "json" and "\x1b[1;31mboom\x1b[0m" in shown.output
    # another format is journalctl's own, uncoloured
    assert CliRunner().invoke(app, ["logs", "@last", "-o", "cat"]).output == "plain line\n"
    assert last_output() == "cat"
    monkeypatch.setattr(cli_logs, "colour_wanted", lambda: False)
    assert CliRunner().invoke(app, ["logs", "@last"]).output == "plain line\n"
    assert last_output() == "short-iso"


def test_colour_is_wanted_only_on_a_terminal_without_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli_logs.colour_wanted()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not cli_logs.colour_wanted()
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not cli_logs.colour_wanted()


def test_json_is_journalctls_json_and_excludes_another_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[LogsRequest] = []

    def request(body: LogsRequest, **_kwargs: Any) -> dict[str, Any]:
        sent.append(body)
        return {"run_id": RUN, "state": "succeeded", "text": _entry("x") + "\n", "cursor": CURSOR,
                "finished": True}

    monkeypatch.setattr(cli_logs, "request", request)
    result = CliRunner().invoke(app, ["logs", "@last", "--json"])
    assert result.exit_code == 0 and sent[-1].output == "json"
    assert json.loads(result.output)["MESSAGE"] == "x"
    both = CliRunner().invoke(app, ["logs", "@last", "--json", "-o", "cat"])
    assert both.exit_code == 2 and "--json is -o json" in both.output
