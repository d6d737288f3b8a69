"""Every human renderer of the CLI and the MCP server's text, fed cairnd replies whose every
free-text field (names, paths, summaries, questions, prompts, notes, log and diff lines,
errors) carries terminal control sequences: nothing but line ends (and tabs in diff and log
bodies) comes out raw, and ``--json`` keeps the exact strings.

The system test (tests/system/test_hostile_text.py) drives the same commands on a real run;
this one reaches what a real run cannot cheaply produce (a schedule's inbox, experiments,
a replay divergence, integrity issues, storage listings)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn.cli import artifacts as cli_artifacts
from cairn.cli import doctor, logs, main, options, people, runs, schedule, storage, watchview
from cairn.cli.commands import app
from cairn.cli.watchview import EventPrinter
from cairn.errors import CairnError
from cairn.mcp import server as mcp_server
from cairn.mcp.tools import Session

# OSC title, OSC 52 (the clipboard), CSI clear screen, a C1 CSI, DEL, a bidi override, a
# line separator, a newline and a lone surrogate: all in one name.
EVIL = "evil\x1b]0;pwned\x07\x1b]52;c;aGk=\x07\x1b[2J\x9b31m\x7f\u202e\u2028\nname\udc80.txt"
RUN = "flow_" + "3fa9" * 8
AT = 1_700_000_000.0


def raw_controls(text: str, *, tabs: bool = False) -> list[str]:
    """Control characters (and the other escaped ones) in ``text`` but line ends."""
    allowed = "\n\t" if tabs else "\n"
    return [
        c for c in text
        if (ord(c) < 0x20 and c not in allowed) or 0x7F <= ord(c) < 0xA0
        or c in "\u202e\u2028" or 0xD800 <= ord(c) < 0xE000
    ]


def strings(value: Any) -> set[str]:
    """Every string in decoded JSON, keys included."""
    if isinstance(value, dict):
        return set(value) | {s for v in value.values() for s in strings(v)}
    if isinstance(value, list):
        return {s for v in value for s in strings(v)}
    return {value} if isinstance(value, str) else set()


# A typed reply holds no lone surrogate (pydantic refuses one: the CLI then says the reply is
# unreadable, tests/unit/test_cli_artifacts.py); everything else of EVIL it carries as is.
TYPED_EVIL = EVIL.replace("\udc80", "")
ARTIFACTS = {"files": [{"name": TYPED_EVIL, "size": 3, "sha256": "a" * 64}],
             "refused": [{"name": TYPED_EVIL, "reason": TYPED_EVIL}], "refused_total": 2}


def show_view() -> dict[str, Any]:
    op = {"op_id": "root-1", "kind": "agent", "state": "committed", "attempt": 1,
          "location": EVIL, "checkpoint": {"s": {"path": EVIL, "uuid": "u"}},
          "output": {"summary": EVIL}, "imported_from": None, "artifacts": ARTIFACTS}
    imported = {**op, "op_id": "root-2", "imported_from": {"run_id": RUN, "op_id": EVIL}}
    side = {"kind": EVIL, "location": EVIL, "predecessor": None, "request": {"p": EVIL}}
    return {
        "run": {"run_id": RUN, "state": "failed", "definition": EVIL, "project": EVIL,
                "error": EVIL, "output": {"x": EVIL}, "run_key": EVIL},
        "replayed_from": {"run_id": RUN, "through": EVIL, "imported": 1},
        "storage": {"deleted": True, "deleted_at": AT, "subvolumes": 2},
        "integrity": {"ok": False, "issues": [{"code": "x", "op_id": None, "message": EVIL}]},
        "operations": [op, imported],
        "worklists": [{"title": EVIL, "revision": 1, "complete": False, "done": 0,
                       "items": [EVIL], "states": ["active"]}],
        "experiments": [{"scope": EVIL, "metric": EVIL, "gain": 0.1,
                         "baseline": {"value": 1.0, "measurement": EVIL},
                         "best": {"value": 2.0, "measurement": EVIL},
                         "guardrails": {EVIL: 0.1},
                         "candidates": [{"disposition": "rejected", "measurement": EVIL,
                                         "value": 1.0, "reason": EVIL}]}],
        "question": {"kind": "question", "op_id": EVIL, "question": EVIL, "challenge": EVIL,
                     "also_waiting": 1},
        "divergence": {"op_id": EVIL, "fields": [EVIL], "journal": side, "replay": side},
        "settlement": {"status": "conflict",
                       "apply": {"applied": [EVIL], "already_applied": [EVIL],
                                 "conflicts": [{"path": EVIL, "reason": EVIL}]},
                       "candidate": {"refused": [{"path": EVIL, "reason": EVIL}],
                                     "ignored": [EVIL]}},
        "settlement_summary": SUMMARY,
        "model": None,
        "progress": {"import": {"phase": EVIL, "done": 1, "total": 2, "at": AT}},
        "units": [EVIL],
        "latest_event": {"cursor": 9, "event": EVIL, "op_id": EVIL},
        "events_shown": "9 events",
    }


INBOX: list[dict[str, Any]] = [
    {"kind": "question", "run_state": "waiting", "definition": EVIL, "run_id": RUN,
     "op_id": EVIL, "challenge": EVIL, "question": EVIL, "schema_name": EVIL,
     "json_schema": {}, "state": "waiting", "answer": None, "actor_uid": None,
     "created_at": AT, "decided_at": None,
     "commands": [f"cairn answer {RUN} --challenge {EVIL} VALUE"]},
    {"kind": "approval", "run_state": "waiting", "definition": EVIL, "run_id": RUN,
     "request_id": EVIL, "op_id": EVIL, "attempt": 1,
     "prepared": {"run_id": RUN, "op_id": EVIL, "definition": EVIL, "review_hash": "sha256:0",
                  "descriptor": EVIL, "profile": None, "prompt": EVIL, "title": EVIL,
                  "limits": {}, "capabilities": [EVIL],
                  "agent": {"profile": EVIL, "access": EVIL, "network": EVIL}},
     "fingerprint": EVIL,
     "evaluation": {"decision": "require_approval",
                    "capabilities": {EVIL: "require_approval"}},
     "deadline": AT, "state": "waiting", "actor_uid": None, "reason": None, "created_at": AT,
     "decided_at": None, "commands": [f"cairn reject {RUN} {EVIL} --reason …"]},
    {"kind": "approval", "run_state": "waiting", "definition": EVIL, "run_id": RUN,
     "request_id": "apply", "op_id": "settlement", "attempt": 1,
     "prepared": {"kind": "apply", "run_id": RUN, "project": EVIL, "accepted": [EVIL],
                  "refused": 0, "f": "u", "diff_sha256": "0" * 64},
     "fingerprint": "f",
     "evaluation": {"decision": "ask", "reasons": ["launched with --apply ask"]},
     "deadline": AT, "state": "waiting", "actor_uid": None, "reason": None, "created_at": AT,
     "decided_at": None, "commands": [f"cairn apply {RUN}"]},
]
DIFF: dict[str, Any] = {"run_id": RUN, "status": "conflict",
                        "summary": {"status": "conflict", "label": EVIL, "complete": False,
                                    "accepted": 1, "applied": 0, "already_applied": 0,
                                    "refused": 1, "ignored": 1, "conflicts": 1,
                                    "reverted": False},
                        "accepted": [EVIL],
                        # the settlement record's: its reason as bounded (no lone surrogate)
                        "apply": {"status": "conflict", "applied": [], "already_applied": [],
                                  "conflicts": [{"path": EVIL, "reason": TYPED_EVIL}]},
                        "refused": [{"path": EVIL, "reason": EVIL}], "ignored": [EVIL],
                        "diff": f"--- a/{EVIL}\n+++ b/{EVIL}\n@@ -1 +1 @@\n-\told\n+{EVIL}\n"}
DOCTOR = {"host": [{"check": EVIL, "status": "fail", "detail": EVIL, "fix": EVIL}],
          "credentials": {},
          "runs": [{"run_id": RUN, "state": "failed", "problems": [EVIL], "warnings": [EVIL],
                    "notes": [EVIL], "applied": {"as_applied": 1, "reverted": 0,
                                                 "changed": 1}}],
          "problems": 1}
CHECKPOINTS = {"run_id": RUN, "state": "failed",
               "storage": {"deleted": False, "deleted_at": None, "subvolumes": 0},
               "checkpoints": [{"op_id": EVIL, "kind": EVIL, "scope": EVIL, "attempt": 1,
                                "op_state": "committed", "at": AT, "path": EVIL, "uuid": "u",
                                "subvol_id": 261, "exclusive": None, "deleted": False,
                                "reminted": False}]}
DF = {"pool": {"root": EVIL, "size": 1, "used": 1, "free": 1, "reserve": 1, "quotas": False},
      "runs": [{"run_id": RUN, "owner_uid": 1000, "state": "failed", "finished_at": AT,
                "exclusive": None, "held": EVIL}]}
SUMMARY = {"status": "conflict", "label": EVIL, "complete": False, "accepted": 1, "applied": 0,
           "already_applied": 0, "refused": 0, "ignored": 0, "conflicts": 1, "reverted": False}
PRUNE = {"rule": {"older_than": None, "keep": None}, "dry_run": True,
         "delete": [{"run_id": RUN, "reason": EVIL}], "deleted": [],
         "failed": [{"run_id": RUN, "error": EVIL}], "kept": [], "reclaim_pending": 0,
         "free_bytes": None}
OCCURRENCE = {"key": EVIL, "trigger": "timer", "nominal": EVIL, "revision": 1,
              "state": "failed", "reason": EVIL, "run_id": RUN, "run_state": "failed",
              "at": EVIL}
SCHEDULE = {"schedule_id": "0123456789ab", "name": EVIL, "status": "blocked", "revision": 1,
            "confirmed_revision": 1, "awaiting_confirmation": False, "definition": EVIL,
            "project": EVIL, "calendar": EVIL, "timezone": EVIL, "catch_up": "none",
            "overlap": "skip", "min_spacing_sec": 0, "max_runs": 2, "runs_used": 1,
            "valid_until": EVIL, "launch_failures": 3, "blocked_reason": EVIL,
            "timer_unit": EVIL, "timer": None, "last_occurrence": OCCURRENCE}
SCHEDULE_DETAIL = {**SCHEDULE, "review_hash": "sha256:0", "args": {"a": EVIL},
                   "profiles": [EVIL], "challenge": None, "next_elapses": [EVIL],
                   "occurrences": [OCCURRENCE], "occurrences_omitted": False}
SCHEDULE_INBOX = [{"item_id": 1, "schedule_id": "0123456789ab", "name": EVIL, "kind": "failed",
                   "ref": RUN, "message": EVIL, "at": EVIL}]
LOG_TEXT = f"2026-01-01T00:00:00+0000 host agent[1]: {EVIL}\tcol\n"

# command line -> (the module whose request is faked, cairnd's reply)
COMMANDS: dict[str, tuple[Any, Any]] = {
    "show": (runs, show_view()),
    "diff": (runs, DIFF),
    "doctor": (doctor, DOCTOR),
    "list": (runs, [{"run_id": RUN, "state": "running", "position": None, "definition": EVIL,
                     "project": EVIL, "owner_uid": 1000, "created_at": AT, "run_key": EVIL,
                     "current_op": {"op_id": EVIL, "kind": EVIL, "state": "running"},
                     "settlement_summary": SUMMARY}]),
    "revert": (runs, {"run_id": RUN, "unit": EVIL, "status": "conflict", "applied": [],
                      "already_applied": [], "xattrs_not_kept": [], "links_not_kept": [],
                      "conflicts": [{"path": EVIL, "reason": EVIL}]}),
    "replay": (runs, {"run_id": RUN, "source_run": RUN, "through": EVIL, "imported": [],
                      "review_hash": "sha256:0", "launch_hash": "sha256:1",
                      "state": "pending"}),
    "inbox": (people, INBOX),
    "artifacts": (cli_artifacts, {"run_id": RUN, "operations": [{"op_id": "root-1",
                                                                  **ARTIFACTS}]}),
    "checkpoints": (storage, CHECKPOINTS),
    "storage df": (storage, DF),
    "prune": (storage, PRUNE),
    "schedule list": (schedule, [SCHEDULE]),
    "schedule show": (schedule, SCHEDULE_DETAIL),
    "schedule inbox": (schedule, SCHEDULE_INBOX),
}
ARGS = {"show": [RUN], "diff": [RUN], "doctor": [RUN], "revert": [RUN, "--yes"], "prune": ["--yes"],
        "replay": [RUN, "--through", "root-1"], "checkpoints": [RUN], "artifacts": [RUN],
        "schedule show": ["0123456789ab"]}


def fake(reply: Any) -> Callable[..., Any]:
    return lambda body, **_kwargs: reply


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_human_output_shows_every_control_escaped(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    module, reply = COMMANDS[command]
    monkeypatch.setattr(module, "request", fake(reply))
    argv = [*command.split(), *ARGS.get(command, [])]
    result = CliRunner().invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    out = result.stdout + result.stderr
    assert "\\x1b]0;pwned\\x07" in out, out  # shown, as text
    assert raw_controls(out, tabs=command == "diff") == [], out
    shown = CliRunner().invoke(app, [*argv, "--json"])
    if command in ("prune",):  # --json exits 1 on a failed deletion, after printing
        assert shown.stdout
    exact = TYPED_EVIL if command == "artifacts" else EVIL
    assert exact in strings(json.loads(shown.stdout))  # exact


def test_a_diff_keeps_its_tabs_and_a_piped_patch_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "request", fake(DIFF))
    shown = CliRunner().invoke(app, ["diff", RUN]).stdout
    assert "-\told\n" in shown
    assert f"--- a/{EVIL}" not in shown and "--- a/evil\\x1b]0;pwned\\x07" in shown
    patch = CliRunner().invoke(app, ["diff", RUN, "--patch"]).stdout
    exact = DIFF["diff"].encode("utf-8", "replace").decode()  # the lone surrogate as ?
    assert patch == exact  # not a terminal: for 'git apply', byte for byte


def test_logs_escape_every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "request", fake({"text": LOG_TEXT, "cursor": None,
                                               "run_id": RUN, "state": "succeeded",
                                               "finished": True}))
    out = CliRunner().invoke(app, ["logs", RUN]).stdout
    assert raw_controls(out, tabs=True) == [] and "\tcol\n" in out and "\\x1b[2J" in out


def test_watch_escapes_events_notes_progress_waiting_and_the_end() -> None:
    out = io.StringIO()
    printer = EventPrinter(out, tty=True, render=watchview.render_event)
    printer.event({"event": "progress", "at": AT, "data": {"phase": EVIL, "done": 1,
                                                           "total": 2}})
    printer.event({"event": "agent-note", "at": AT, "op_id": EVIL, "data": {"text": EVIL}})
    printer.event({"event": EVIL, "at": AT, "op_id": EVIL, "data": {EVIL: EVIL}})
    for item in INBOX[:2]:
        printer.line(options.render_waiting(RUN, item))
    printer.line(watchview.completion_line({"run_id": RUN, "state": "failed", "error": EVIL}))
    text = out.getvalue().replace("\r\x1b[K", "")  # the bar cairn itself redraws
    assert raw_controls(text) == [], text


def test_watch_command_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    reply = {"run_id": RUN, "cursor": 3, "more": False, "finished": True, "state": "failed",
             "error": EVIL, "output": None, "waiting": INBOX[:1],
             "events": [{"event": "agent-note", "at": AT, "op_id": "root-1",
                         "data": {"text": EVIL}},
                        {"event": "op-failed", "at": AT, "op_id": EVIL,
                         "data": {"error": EVIL}}]}
    monkeypatch.setattr(watchview, "request", fake(reply))
    result = CliRunner().invoke(app, ["watch", RUN])
    assert result.exit_code == 1 and raw_controls(result.stdout) == [], result.stdout
    assert result.stdout.count("\\x1b]0;pwned") >= 4


def test_an_error_quoting_a_name_is_one_escaped_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(body: Any, **_kwargs: Any) -> Any:
        raise CairnError(f"no such path {EVIL}", hint=f"see {EVIL}")

    monkeypatch.setattr(runs, "request", refuse)
    monkeypatch.setattr(sys, "argv", ["cairn", "show", RUN])
    with pytest.raises(SystemExit):
        main()
    err = capsys.readouterr().err
    assert raw_controls(err) == [] and len(err.splitlines()) == 2, err
    assert err.startswith("cairn: no such path evil\\x1b]0;pwned\\x07")


def test_fail_escapes_what_it_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = {"schedule_id": "0123456789ab", "trigger": "run-now", "key": "run-now:1.0",
               "nominal": EVIL, "outcome": "refused", "reason": EVIL}
    shown = {**SCHEDULE_DETAIL, "project": "/", "definition": "builtin:implement"}
    monkeypatch.setattr(schedule, "request", lambda body, **_kwargs: (
        shown if body.op == "schedule-inspect" else refused))
    monkeypatch.setattr(schedule, "_open_project", lambda _path: None)
    result = CliRunner().invoke(app, ["schedule", "run-now", "0123456789ab"])
    assert result.exit_code == 1 and raw_controls(result.stderr) == [], result.stderr
    assert "run-now refused: evil\\x1b]0;pwned" in result.stderr


def test_the_mcp_servers_text_escapes_what_an_agent_wrote() -> None:
    def request(body: Any, **_kwargs: Any) -> Any:
        if body.op == "watch":
            return {"run_id": RUN, "cursor": 1, "more": False, "finished": True,
                    "state": "failed", "error": EVIL, "output": None, "waiting": [],
                    "events": [{"event": EVIL, "at": AT, "op_id": EVIL, "data": {}}]}
        if body.op == "inbox":
            return INBOX
        raise CairnError(f"no run {EVIL}", hint=EVIL)

    out = io.BytesIO()
    session = Session(request=request, cwd=Path("/"),
                      clock=lambda: 0.0, pause=lambda _s: None)
    server = mcp_server.Server(out, session, "test")
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "cairn_show", "arguments": {"run": RUN}}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "cairn_inbox", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "cairn_watch", "arguments": {"run": RUN, "timeout": 1},
                    "_meta": {"progressToken": "t"}}},
        {"jsonrpc": "2.0", "id": 4, "method": EVIL},
    ]
    server.serve(json.dumps(line).encode() for line in lines)
    wire = out.getvalue()
    assert all(b < 0x80 and (b >= 0x20 or b == 0x0A) for b in wire)  # the lines themselves
    texts: list[str] = []
    for raw in wire.splitlines():
        message = json.loads(raw)
        result = message.get("result") or {}
        texts += [c["text"] for c in result.get("content", [])]
        texts += [message.get("error", {}).get("message", "")]
        texts += [message.get("params", {}).get("message", "")]
        if "structuredContent" in result:  # the data itself keeps the exact strings
            assert EVIL in strings(result["structuredContent"])
    assert len([t for t in texts if "pwned" in t]) >= 4, texts
    for text in texts:
        assert raw_controls(text) == [], text
        assert text.startswith("{") or "\n" not in text, text  # JSON, or one line
