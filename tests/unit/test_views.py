"""``cairn show`` on a real SQLite journal: one read snapshot, bounded events that still
name the latest event and the divergence, and an integrity report instead of invented or
skipped history when records contradict each other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn import paths
from cairn.canonical import canonical_json
from cairn.cli import runs
from cairn.cli.commands import app
from cairn.daemon import views
from cairn.errors import JournalError
from cairn.journal.readwrite import Journal
from cairn.journal.snapshot import read_snapshot
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.views.run import FIRST_EVENTS, LAST_EVENTS, run_view
from cairn.workflow.review import review_source

SOURCE = '''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

@workflow(description="nothing at all", input=Goal, output=Goal)
async def run(flow, args: Goal) -> Goal:
    return args
'''
RUN = "flow_" + "5e" * 16
OWNER = 1001


class Clock:
    def __init__(self) -> None:
        self.now = 2_000_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Journal]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    review = review_source(SOURCE, filename="wf.py")
    clock = Clock()
    with Journal(paths.journal_path(), create=True, clock=clock) as opened:
        opened.create_run(
            LaunchDescription(
                run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
                definition="wf.py", source=SOURCE, source_filename="wf.py",
                review_hash=review.review_hash, review=review.model_dump(mode="json"),
                args={"goal": "g"},
                project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
                profiles={}, cairn_version="0", created_at=clock.now,
            ),
            intents=[],
        )
        yield opened


def insert_op(
    journal: Journal, scope: str, seq: int, kind: str, request: dict[str, Any], *,
    state: str = "committed", predecessor: str | None = None,
) -> str:
    """An operation row written by hand, as a damaged or foreign journal could hold it."""
    op_id = f"{scope}-{seq}"
    journal.db.execute(
        "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
        " source_location, predecessor, state, created_at, updated_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (RUN, scope, seq, op_id, kind, canonical_json(request), "sha256:0", "wf.py:9:5",
         predecessor, state, 10.0, 11.0),
    )
    return op_id


def insert_event(journal: Journal, event: str, op_id: str | None, data: dict[str, Any]) -> int:
    cur = journal.db.execute(
        "INSERT INTO events (run_id, scope, op_id, event, data, at) VALUES (?,?,?,?,?,?)",
        (RUN, None, op_id, event, json.dumps(data), 5.0),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def heartbeats(journal: Journal, count: int) -> None:
    """``count`` events in one transaction (one fsync, not ``count``)."""
    with journal.transaction() as db:
        db.executemany(
            "INSERT INTO events (run_id, event, data, at) VALUES (?,?,?,?)",
            [(RUN, "heartbeat", json.dumps({"n": n}), 5.0) for n in range(count)],
        )


def show(journal: Journal) -> dict[str, Any]:
    return views.show(journal, RUN, OWNER)


# --- bounded events -------------------------------------------------------------------


DIVERGED = {
    "fields": ["request_hash"],
    "journal": {"kind": "agent", "request": {"p": 1}, "location": "wf.py:9:5",
                "predecessor": None},
    "replay": {"kind": "agent", "request": {"p": 2}, "location": "wf.py:9:5",
               "predecessor": None},
}


def test_a_run_of_1201_events_shows_its_latest_event_and_its_divergence(
    journal: Journal,
) -> None:
    op = insert_op(journal, "root", 1, "agent", {"descriptor": "w", "prompt": "p"})
    heartbeats(journal, 1_099)
    diverged = insert_event(journal, "replay-diverged", op, DIVERGED)
    heartbeats(journal, 99)
    last = insert_event(journal, "run-failed", None, {"error": "replay diverged"})
    total = journal.db.execute("SELECT count(*) FROM events WHERE run_id=?", (RUN,)).fetchone()[0]
    assert total == 1_201
    # What views read before: the first thousand rows, which end long before either.
    assert all(e.cursor < diverged for e in journal.events(RUN))

    view = show(journal)

    assert view["latest_event"]["cursor"] == last
    assert view["latest_event"]["event"] == "run-failed"
    assert view["divergence"] == {"op_id": op, **DIVERGED}
    assert view["events_total"] == total
    assert view["events_omitted"] == total - FIRST_EVENTS - LAST_EVENTS
    assert view["events_shown"] == "first 25 and last 75 of 1201 events; 1101 omitted"
    cursors = [e["cursor"] for e in view["events"]]
    assert len(cursors) == FIRST_EVENTS + LAST_EVENTS and cursors == sorted(set(cursors))
    assert view["events"][0]["event"] == "run-created"  # how the run began
    # The divergence lies among the omitted events, and is named all the same.
    assert cursors[-1] == last and cursors[FIRST_EVENTS] > FIRST_EVENTS + 1
    assert cursors[FIRST_EVENTS - 1] < diverged < cursors[FIRST_EVENTS]
    assert view["integrity"] == {"ok": True, "issues": []}


def test_a_short_run_shows_every_event_and_omits_none(journal: Journal) -> None:
    for n in range(3):
        journal.append_event(RUN, "heartbeat", {"n": n})
    view = show(journal)
    assert view["events_total"] == 4 and view["events_omitted"] == 0
    assert view["events_shown"] == "all 4 events"
    assert [e["event"] for e in view["events"]] == ["run-created", *["heartbeat"] * 3]
    assert view["latest_event"] == view["events"][-1]
    assert view["divergence"] is None


# --- one read snapshot ------------------------------------------------------------------


def test_reads_inside_a_snapshot_do_not_see_later_commits(journal: Journal) -> None:
    def count() -> int:
        return int(journal.db.execute("SELECT count(*) FROM events").fetchone()[0])

    with Journal(journal.path) as writer:
        with read_snapshot(journal):
            before = count()
            writer.append_event(RUN, "late", {})
            assert count() == before
            view = run_view(journal, journal.get_run(RUN))
            assert view["events_total"] == before
            assert view["latest_event"]["event"] != "late"
        assert count() == before + 1
    assert not journal.db.in_transaction


def test_a_view_refuses_to_be_built_outside_a_snapshot(journal: Journal) -> None:
    with pytest.raises(JournalError, match="one read snapshot"):
        run_view(journal, journal.get_run(RUN))
    with (journal.transaction(), pytest.raises(JournalError, match="inside another"),
          read_snapshot(journal)):
        pass


# --- fail closed ----------------------------------------------------------------------


def codes(view: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(i["code"], i["op_id"]) for i in view["integrity"]["issues"]]


def test_an_item_without_its_unroll_is_reported_not_skipped(journal: Journal) -> None:
    item = insert_op(journal, "root", 1, "item", {"worklist": "Plan", "index": 0, "label": "a"})
    view = show(journal)
    assert view["worklists"] == []
    assert view["integrity"]["ok"] is False
    assert codes(view) == [("item-without-unroll", item)]
    assert "no flow.unroll of scope root declared before it" in (
        view["integrity"]["issues"][0]["message"])


def test_items_out_of_order_or_outside_the_list_withhold_that_worklist(journal: Journal) -> None:
    insert_op(journal, "root", 1, "unroll", {"title": "Plan", "items": ["a", "b"]})
    skipped = insert_op(journal, "root", 2, "item",
                        {"worklist": "Plan", "index": 1, "label": "b"})
    insert_op(journal, "root", 3, "unroll", {"title": "Fine", "items": ["x"]})
    insert_op(journal, "root", 4, "item", {"worklist": "Fine", "index": 0, "label": "x"})
    insert_op(journal, "root", 5, "unroll", {"title": "Short", "items": ["y"]})
    insert_op(journal, "root", 6, "item", {"worklist": "Short", "index": 0, "label": "y"})
    beyond = insert_op(journal, "root", 7, "item",
                       {"worklist": "Short", "index": 1, "label": "z"})
    view = show(journal)
    assert codes(view) == [("item-out-of-order", skipped), ("item-outside-worklist", beyond)]
    (fine,) = view["worklists"]
    assert (fine["title"], fine["states"]) == ("Fine", ["active"])


def test_an_operation_finished_before_it_started_is_reported(journal: Journal) -> None:
    fine = insert_op(journal, "root", 1, "agent", {"prompt": "p"})
    insert_event(journal, "op-requested", fine, {"kind": "agent"})
    insert_event(journal, "op-committed", fine, {})
    early = insert_op(journal, "root", 2, "agent", {"prompt": "q"}, predecessor=fine)
    committed = insert_event(journal, "op-committed", early, {})
    requested = insert_event(journal, "op-requested", early, {"kind": "agent"})
    never = insert_op(journal, "root", 3, "agent", {"prompt": "r"}, predecessor=early)
    insert_event(journal, "op-failed", never, {})
    view = show(journal)
    assert codes(view) == [
        ("finished-before-started", early),
        ("finished-before-started", never),
    ]
    messages = [i["message"] for i in view["integrity"]["issues"]]
    assert messages == [
        f"{early} reached a final state at event {committed} before it was requested at "
        f"event {requested}",
        f"{never} reached a final state at event {requested + 1} before it was requested",
    ]


def test_a_child_of_a_missing_parent_is_reported(journal: Journal) -> None:
    fork = insert_op(journal, "root", 1, "parallel", {"lanes": ["a"], "concurrency": 1})
    insert_op(journal, f"{fork}-a", 1, "agent", {"prompt": "in lane a"})
    stray = insert_op(journal, "root-7-b", 1, "agent", {"prompt": "in a lane nobody forked"})
    insert_op(journal, "root-7-b", 2, "agent", {"prompt": "same lane"}, predecessor=stray)
    lost = insert_op(journal, "root", 2, "agent", {"prompt": "p"}, predecessor="root-9")
    insert_event(journal, "op-committed", "root-42", {})
    view = show(journal)
    assert codes(view) == [
        ("event-without-operation", "root-42"),
        ("missing-predecessor", lost),
        ("lane-without-fork", stray),
    ]


def test_unreadable_rows_and_stray_questions_are_reported(journal: Journal) -> None:
    insert_op(journal, "root", 1, "agent", {"prompt": "p"}, state="teleported")
    asked = insert_op(journal, "root", 2, "ask", {"question": "ok?"}, state="committed")
    journal.db.execute(
        "INSERT INTO interactions (run_id, op_id, challenge, question, schema_name, schema,"
        " state, created_at) VALUES (?,?,?,?,?,?,?,?)",
        (RUN, asked, "ch-1", "ok?", None, "{}", "waiting", 12.0),
    )
    broken = insert_event(journal, "heartbeat", None, {})
    journal.db.execute("UPDATE events SET data='{not json' WHERE cursor=?", (broken,))
    view = show(journal)
    assert codes(view) == [
        ("unreadable-record", "root-1"),
        ("unreadable-record", None),
        ("question-without-waiting-operation", asked),
    ]
    assert [o["op_id"] for o in view["operations"]] == [asked]
    assert view["question"]["op_id"] == asked  # shown, and reported as contradicted


def test_a_clean_run_has_an_empty_integrity_report_and_its_open_question(
    journal: Journal,
) -> None:
    first = insert_op(journal, "root", 1, "unroll", {"title": "Plan", "items": ["a"]})
    insert_op(journal, "root", 2, "item", {"worklist": "Plan", "index": 0, "label": "a"},
              predecessor=first)
    insert_op(journal, "root", 3, "item",
              {"worklist": "Plan", "index": 1, "label": "", "done": True}, predecessor="root-2")
    asked = insert_op(journal, "root", 4, "ask", {"question": "ship?"}, state="waiting",
                      predecessor="root-3")
    journal.db.execute(
        "INSERT INTO interactions (run_id, op_id, challenge, question, schema_name, schema,"
        " state, created_at) VALUES (?,?,?,?,?,?,?,?)",
        (RUN, asked, "ch-2", "ship?", None, "{}", "waiting", 12.0),
    )
    view = show(journal)
    assert view["integrity"] == {"ok": True, "issues": []}
    (plan,) = view["worklists"]
    assert (plan["complete"], plan["states"]) == (True, ["done"])
    assert view["question"] == {"kind": "question", "op_id": asked, "question": "ship?",
                                "schema": None, "challenge": "ch-2", "also_waiting": 0}


# --- what the CLI prints ------------------------------------------------------------------


def cli_show(view: dict[str, Any], monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """``cairn show`` over the view cairnd built (the socket left out)."""
    monkeypatch.setattr(runs, "request", lambda *_a, **_k: view)
    result = CliRunner().invoke(app, ["show", RUN, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_show_prints_contradictions_first_and_the_latest_event_last(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert_op(journal, "root", 1, "item", {"worklist": "Plan", "index": 0, "label": "a"})
    heartbeats(journal, 150)
    lines = cli_show(show(journal), monkeypatch).splitlines()
    assert lines[2].startswith("integrity: 1 contradiction(s) in the journal;")
    assert lines[3].startswith("  ! item-without-unroll: root-1 marks item 0 of worklist 'Plan'")
    assert lines[-1] == (
        f"events: first {FIRST_EVENTS} and last {LAST_EVENTS} of 151 events; 51 omitted "
        "(--json lists them); latest #151 heartbeat"
    )
    assert not any(line.startswith(("●", "✓")) for line in lines)  # no worklist invented


def test_show_prints_the_open_question_and_json_carries_every_facet(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = insert_op(journal, "root", 1, "unroll", {"title": "Plan", "items": ["a", "b", "c"]})
    insert_op(journal, "root", 2, "item", {"worklist": "Plan", "index": 0, "label": "a"},
              predecessor=first)
    insert_op(journal, "root", 3, "item", {"worklist": "Plan", "index": 1, "label": "b"},
              predecessor="root-2")
    asked = insert_op(journal, "root", 4, "ask", {"question": "ship?"}, state="waiting",
                      predecessor="root-3")
    journal.db.execute(
        "INSERT INTO interactions (run_id, op_id, challenge, question, schema_name, schema,"
        " state, created_at) VALUES (?,?,?,?,?,?,?,?)",
        (RUN, asked, "ch-3", "ship?", None, "{}", "waiting", 12.0),
    )
    view = show(journal)
    text = cli_show(view, monkeypatch)
    assert "● Plan r1 · 1/3 · active\n  ✓ a\n  ● b\n  ○ c\n" in text
    assert f"waiting: {asked} asks: ship? (cairn answer {RUN} --challenge ch-3 VALUE)\n" in text
    assert "integrity" not in text
    emitted = json.loads(cli_show(view, monkeypatch, "--json"))
    assert emitted["question"]["challenge"] == "ch-3"
    assert emitted["worklists"][0]["states"] == ["done", "active", "waiting"]
    assert emitted["integrity"] == {"ok": True, "issues": []}
