"""Naming a run the short way: a unique prefix of its ID (with or without ``flow_``) or
``@last``, resolved by cairnd once for every op, on a real journal, among the runs the
caller may see; and the CLI passing what the person typed."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn import paths
from cairn.cli import runs, watchview
from cairn.cli.commands import app
from cairn.daemon import runref, server, views
from cairn.errors import NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import (
    MODEL_OF_OP,
    RunRequest,
    daemon_request,
    request_line,
)
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.protocol.requestchecks import RUN_REF_RE
from cairn.workflow.review import review_source

SOURCE = '''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

@workflow(description="nothing at all", input=Goal, output=Goal)
async def run(flow, args: Goal) -> Goal:
    return args
'''
ALICE = 1001
BOB = 1002
ADMIN = 0


def run_id(hex_digits: str) -> str:
    """A run ID that starts with ``hex_digits`` (padded with zeros to 32)."""
    return "flow_" + hex_digits.ljust(32, "0")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    # Whoever runs the tests, ADMIN administers cairn and ALICE and BOB do not.
    for module in (views, runref):
        monkeypatch.setattr(module, "is_admin", lambda uid: uid == ADMIN)
    return tmp_path


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def create_runs(*runs: tuple[str, int, str]) -> None:
    """Record runs (ID, owner, definition) in this order, a minute apart."""
    review = review_source(SOURCE, filename="wf.py")
    clock = Clock()
    with Journal(paths.journal_path(), create=True, clock=clock) as journal:
        for rid, owner, definition in runs:
            clock.now += 60
            desc = LaunchDescription(
                run_id=rid, owner_uid=owner, owner_gid=owner, owner_name=f"u{owner}",
                definition=definition, source=SOURCE, source_filename="wf.py",
                review_hash=review.review_hash, review=review.model_dump(mode="json"),
                args={"goal": "g"},
                project=ProjectSpec(root=f"/home/u{owner}/p", owner_uid=owner, on_pool_fs=False),
                profiles={}, cairn_version="0", created_at=clock.now,
            )
            journal.create_run(desc, intents=[])


def show(ref: str, uid: int) -> str:
    """The run ``cairn show REF`` shows ``uid``, through cairnd's parse and dispatch."""
    request = server.parse(request_line(daemon_request("show", run_id=ref)))
    result: dict[str, Any] = server.dispatch(request, uid, None)
    shown: str = result["run"]["run_id"]
    return shown


def ask(line: bytes) -> dict[str, Any]:
    """One request line over a socket pair, answered by cairnd's connection handler."""
    client, conn = socket.socketpair()
    with client:
        client.sendall(line)
        server.handle(conn)
        reply: dict[str, Any] = json.loads(client.recv(1 << 16))
    return reply


# --- resolving ----------------------------------------------------------------------


def test_a_unique_prefix_resolves_with_or_without_flow(root: Path) -> None:
    mine, other = run_id("3fa9c0"), run_id("7b21")
    create_runs((mine, ALICE, "builtin:implement"), (other, ALICE, "builtin:review"))
    assert show("3fa9", ALICE) == mine
    assert show("flow_3fa9", ALICE) == mine
    assert show("3fa9c", ALICE) == mine
    assert show(mine.removeprefix("flow_"), ALICE) == mine
    assert show("7b21", ALICE) == other


def test_the_full_id_still_works_unchanged(root: Path) -> None:
    mine, bobs = run_id("3fa9"), run_id("3fa9f")
    create_runs((mine, ALICE, "builtin:implement"), (bobs, BOB, "builtin:implement"))
    assert show(mine, ALICE) == mine
    # as before, another user's run by its full ID does not exist for the caller
    with pytest.raises(NotFound) as caught:
        show(bobs, ALICE)
    assert caught.value.message == f"no run {bobs}"
    # a full ID is not looked up by prefix: it is exactly that run
    assert runref.resolve_run(Journal(paths.journal_path()), ALICE, mine) == mine


def test_an_ambiguous_prefix_is_refused_with_its_candidates(root: Path) -> None:
    first, second = run_id("3fa9a"), run_id("3fa9b")
    create_runs((first, ALICE, "builtin:implement"), (second, ALICE, "/home/u1001/wf.py"))
    with pytest.raises(UsageError) as caught:
        show("3fa9", ALICE)
    error = caught.value
    assert error.message == (
        f"run prefix 3fa9 is ambiguous: {first} (builtin:implement, pending), "
        f"{second} (/home/u1001/wf.py, pending)"
    )
    assert error.hint is not None and "more digits" in error.hint and "cairn ps" in error.hint
    assert "\n" not in error.message + error.hint
    # one more digit settles it
    assert show("3fa9b", ALICE) == second


def test_an_ambiguous_prefix_lists_at_most_five(root: Path) -> None:
    ids = [run_id(f"3fa9{n}") for n in range(7)]
    create_runs(*((rid, ALICE, "builtin:implement") for rid in ids))
    with pytest.raises(UsageError) as caught:
        show("flow_3fa9", ALICE)
    message = caught.value.message
    assert message.startswith("run prefix flow_3fa9 is ambiguous: ")
    assert message.endswith(", and more")
    assert [rid for rid in ids if rid in message] == ids[:5]


def test_another_users_run_is_never_found_nor_listed_by_prefix(root: Path) -> None:
    alices, bobs, bobs_only = run_id("3fa9a"), run_id("3fa9b"), run_id("7b21")
    create_runs(
        (alices, ALICE, "builtin:implement"),
        (bobs, BOB, "builtin:secret"),
        (bobs_only, BOB, "builtin:secret"),
    )
    # unique among all runs, but not Alice's: not found, said as for a run that never was
    with pytest.raises(NotFound) as caught:
        show("7b21", ALICE)
    assert caught.value.message == "no run 7b21"
    with pytest.raises(NotFound) as caught:
        show("flow_7b21", ALICE)
    assert caught.value.message == "no run flow_7b21"
    # Bob's run shares Alice's prefix: her prefix is hers alone, never ambiguous
    assert show("3fa9", ALICE) == alices
    assert show("3fa9", BOB) == bobs
    # an administrator sees every run, so to them the prefix is ambiguous
    with pytest.raises(UsageError, match="ambiguous") as ambiguous:
        show("3fa9", ADMIN)
    assert alices in ambiguous.value.message and bobs in ambiguous.value.message
    assert show("7b21", ADMIN) == bobs_only


def test_no_match_is_not_found_with_a_hint(root: Path) -> None:
    create_runs((run_id("3fa9"), ALICE, "builtin:implement"))
    with pytest.raises(NotFound) as caught:
        show("beef", ALICE)
    assert caught.value.message == "no run beef"
    assert caught.value.hint == "list your runs with 'cairn ps'"


def test_at_last_is_the_callers_newest_run(root: Path) -> None:
    older, newer, bobs_newest = run_id("aaaa"), run_id("0bbb"), run_id("cccc")
    create_runs(
        (older, ALICE, "builtin:implement"),
        (newer, ALICE, "builtin:implement"),
        (bobs_newest, BOB, "builtin:implement"),
    )
    assert show("@last", ALICE) == newer
    assert show("@last", BOB) == bobs_newest
    # @last is the caller's own newest, administrator or not
    with pytest.raises(NotFound, match="you have no runs yet"):
        show("@last", ADMIN)


def test_at_last_prefers_the_last_recorded_of_runs_created_at_once(root: Path) -> None:
    review = review_source(SOURCE, filename="wf.py")
    with Journal(paths.journal_path(), create=True, clock=lambda: 5.0) as journal:
        for rid in (run_id("ffff"), run_id("0000")):
            journal.create_run(
                LaunchDescription(
                    run_id=rid, owner_uid=ALICE, owner_gid=ALICE, owner_name="alice",
                    definition="builtin:implement", source=SOURCE, source_filename="wf.py",
                    review_hash=review.review_hash, review=review.model_dump(mode="json"),
                    args={"goal": "g"},
                    project=ProjectSpec(root="/p", owner_uid=ALICE, on_pool_fs=False),
                    profiles={}, cairn_version="0", created_at=5.0,
                ),
                intents=[],
            )
        assert journal.latest_run_id(ALICE) == run_id("0000")
        assert journal.latest_run_id(BOB) is None


def test_every_op_about_a_run_gets_the_resolved_id(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = run_id("3fa9")
    create_runs((full, ALICE, "builtin:implement"))
    seen: dict[str, str | None] = {}

    def record(_journal: Journal, request: Any, _uid: int, _fd: int | None) -> None:
        seen[request.op] = request.run_id

    run_ops = [op for op, model in MODEL_OF_OP.items() if issubclass(model, RunRequest)]
    assert {"show", "logs", "diff", "doctor", "upgrade", "retry", "reconcile", "answer",
            "approve", "reject", "pause", "resume", "stop", "cancel", "watch"} <= set(run_ops)
    for op in run_ops:
        monkeypatch.setitem(server.ROUTES, op, (MODEL_OF_OP[op], record))
        for ref in ("3fa9", "@last"):
            server.dispatch(server.parse(request_line(daemon_request(op, run_id=ref))), ALICE, None)
            assert seen.pop(op) == full, (op, ref)
    # doctor without a run still means every run the caller may see
    server.dispatch(daemon_request("doctor"), ALICE, None)
    assert seen == {"doctor": None}


# --- the shape of a reference -------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    ["3fa9", "flow_3fa9", "@last", run_id("3fa9"), "0123456789abcdef0123456789abcdef"],
)
def test_what_names_a_run(ref: str) -> None:
    assert RUN_REF_RE.fullmatch(ref)
    assert daemon_request("show", run_id=ref).model_dump()["run_id"] == ref


@pytest.mark.parametrize(
    "ref", ["3FA9", "@LAST", "@last ", "flow-3fa9", "3fa9g", "x" * 50, "a" * 33, "'; --"]
)
def test_what_does_not_name_a_run_is_refused_on_the_socket(root: Path, ref: str) -> None:
    reply = ask(json.dumps({"op": "show", "run_id": ref}).encode() + b"\n")
    assert reply["ok"] is False
    assert reply["error"]["code"] == "usage"
    assert "does not name a run" in reply["error"]["message"]
    assert "@last" in reply["error"]["message"]
    assert reply["error"]["hint"] == "list your runs with 'cairn ps'"
    assert "\n" not in reply["error"]["message"]


@pytest.mark.parametrize("ref", ["3fa", "flow_3fa", "flow_", "f"])
def test_a_too_short_prefix_is_refused_clearly(root: Path, ref: str) -> None:
    create_runs((run_id("3fa9"), ALICE, "builtin:implement"))
    reply = ask(json.dumps({"op": "pause", "run_id": ref}).encode() + b"\n")
    assert reply["ok"] is False
    assert reply["error"]["code"] == "usage"
    assert reply["error"]["message"] == (
        f"run prefix {ref!r} is too short: give at least 4 hex digits of the run ID, or @last"
    )
    # even if a caller skips the request model, cairnd's resolution refuses it too
    with pytest.raises(UsageError, match="too short"):
        runref.resolve_run(Journal(paths.journal_path()), ALICE, ref)


def test_the_prefix_lookup_is_a_range_on_the_primary_key(root: Path) -> None:
    with Journal(paths.journal_path(), create=True) as journal:
        for owner in (ALICE, None):
            plan = journal.db.execute(
                "EXPLAIN QUERY PLAN SELECT run_id, owner_uid, definition, state, created_at"
                " FROM runs WHERE run_id >= ? AND run_id < ? AND (? IS NULL OR +owner_uid = ?)"
                " ORDER BY run_id LIMIT ?",
                ("flow_3fa9", "flow_3fa:", owner, owner, 6),
            ).fetchall()
            details = " ".join(str(row["detail"]) for row in plan)
            assert "sqlite_autoindex_runs_1 (run_id>? AND run_id<?)" in details, details
            assert "TEMP B-TREE" not in details, details


def test_the_prefix_range_ends_where_the_prefix_does(root: Path) -> None:
    ids = [run_id("3fa8f"), run_id("3fa9"), run_id("3fa9f"), "flow_3fa9" + "f" * 28, run_id("3faa")]
    create_runs(*((rid, ALICE, "d") for rid in ids))
    with Journal(paths.journal_path()) as journal:
        found = journal.runs_with_prefix("flow_3fa9", owner_uid=ALICE, limit=10)
        assert [m.run_id for m in found] == ids[1:4]
        assert journal.runs_with_prefix("flow_3fa9", owner_uid=BOB, limit=10) == []
        assert len(journal.runs_with_prefix("flow_3fa", owner_uid=None, limit=2)) == 2
        with pytest.raises(UsageError):
            journal.runs_with_prefix("", owner_uid=None, limit=1)


# --- the CLI ------------------------------------------------------------------------


def test_the_cli_passes_what_was_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body)
        return {"run_id": run_id("3fa9"), "status": "not settled", "summary": None,
                "accepted": [], "refused": [], "ignored": [], "apply": None, "diff": ""}

    monkeypatch.setattr(runs, "request", request)
    result = CliRunner().invoke(app, ["diff", "3fa9"])
    assert result.exit_code == 0, result.output
    assert [(b.op, b.run_id) for b in sent] == [("diff", "3fa9")]
    result = CliRunner().invoke(app, ["diff", "@last"])
    assert result.exit_code == 0, result.output
    assert sent[-1].run_id == "@last"


def test_the_cli_refuses_a_too_short_prefix_before_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "request", lambda *_a, **_k: pytest.fail("asked cairnd"))
    result = CliRunner().invoke(app, ["show", "3fa"])
    assert result.exit_code == 2
    assert "run prefix '3fa' is too short" in result.output


def test_the_cli_help_says_prefixes_and_at_last_work() -> None:
    for command in ("show", "logs", "cancel", "watch", "doctor", "answer"):
        result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
        assert result.exit_code == 0
        text = " ".join(result.output.split())
        assert "unique prefix" in text and "@last" in text, command


def test_watch_follows_the_run_a_reference_first_resolved_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = run_id("3fa9")
    asked: list[str | None] = []
    replies = iter([{"more": True, "finished": False}, {"more": False, "finished": True}])

    def request(body: Any, **_kwargs: Any) -> Any:
        asked.append(body.run_id)
        return {"run_id": full, "state": "succeeded", "events": [], "cursor": 0,
                "waiting": [], "output": None, "error": None, **next(replies)}

    monkeypatch.setattr(watchview, "request", request)
    result = CliRunner().invoke(app, ["watch", "@last"])
    assert result.exit_code == 0, result.output
    assert asked == ["@last", full]
