"""The read-only journal connection a more trusted process (root) opens is defensive: it
refuses a schema the migrations did not make, values past its limits and statements past
its work bound, as one-line JournalErrors. On a real SQLite journal written as cairn
could."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from cairn.errors import JournalError
from cairn.journal import reader
from cairn.journal.reader import JournalReader, schema_digest
from cairn.journal.readwrite import Journal

RUN = "flow_" + "c" * 32


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    Journal(path, create=True).close()
    raw = sqlite3.connect(path)
    now = time.time()
    raw.execute(
        "INSERT INTO runs (run_id, owner_uid, definition, review_hash, project, state, launch,"
        " created_at, updated_at) VALUES (?,1,'d','h','/p','running','{}',?,?)",
        (RUN, now, now),
    )
    raw.commit()
    raw.close()
    return path


def write(path: Path, sql: str, *params: object) -> None:
    raw = sqlite3.connect(path)
    raw.execute(sql, params)
    raw.commit()
    raw.close()


def test_the_pinned_schema_digest_is_what_the_migrations_make(journal_file: Path) -> None:
    assert schema_digest(sqlite3.connect(journal_file)) == reader.SCHEMA_SHA256


def test_the_connection_is_query_only_and_distrusts_the_schema(journal_file: Path) -> None:
    opened = JournalReader(journal_file)
    assert opened.db.execute("PRAGMA query_only").fetchone()[0] == 1
    assert opened.db.execute("PRAGMA trusted_schema").fetchone()[0] == 0
    assert opened.db.execute("PRAGMA cell_size_check").fetchone()[0] == 1
    with pytest.raises(sqlite3.OperationalError, match="readonly|query_only"):
        opened.db.execute("DELETE FROM runs")
    opened.close()


@pytest.mark.parametrize(
    "alteration",
    [
        "CREATE VIEW v AS SELECT * FROM runs",
        "CREATE TRIGGER t AFTER INSERT ON events BEGIN SELECT 1; END",
        "CREATE INDEX i ON runs(state)",
        "CREATE TABLE extra (x)",
        "ALTER TABLE runs ADD COLUMN extra TEXT DEFAULT 'x'",
    ],
)
def test_a_schema_the_migrations_did_not_make_is_refused(
    journal_file: Path, alteration: str
) -> None:
    write(journal_file, alteration)
    with pytest.raises(JournalError, match="has a schema its migrations did not make"):
        JournalReader(journal_file)


@pytest.mark.parametrize(
    ("launch", "reason"),
    [
        ("printf('%.*c', 20000000, 'x')", "too big"),
        ("printf('%.*c%.*c', 100000, '[', 100000, ']')", "recursion"),
        ("'{\"run_id\": 5}'", "validation error|run_id"),
        ("x'80ff'", ""),
    ],
    ids=["20MB", "nested", "wrong-type", "not-utf8"],
)
def test_a_value_past_the_limits_is_a_clear_refusal(
    journal_file: Path, launch: str, reason: str
) -> None:
    write(journal_file, f"UPDATE runs SET launch={launch} WHERE run_id=?", RUN)
    opened = JournalReader(journal_file)
    with pytest.raises(JournalError, match="the journal's launch description cannot be read"
                       " safely") as caught:
        opened.launch_description(RUN)
    assert "\n" not in caught.value.message
    if reason:
        assert caught.match(reason)
    opened.close()


def test_statements_past_the_work_bound_are_stopped(
    journal_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "PROGRESS_STEPS", 1)  # every VM step counts
    opened = JournalReader(journal_file)
    monkeypatch.setattr(reader, "PROGRESS_BUDGET", 0)  # and the budget is spent
    with pytest.raises(JournalError, match="cannot be read safely: interrupted"):
        opened.list_ops(RUN)
    opened.close()
