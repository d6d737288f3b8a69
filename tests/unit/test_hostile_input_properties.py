"""What root reads that cairn wrote, fed generated hostile input: the intent and launch
description models, and the journal reader over a real SQLite file whose rows hold
hostile JSON (huge, deeply nested, wrong types, wrong keys). Each is read or refused with
one clear line (a ValidationError's first error, a JournalError), never a crash or a hang.

Examples are bounded: these properties together stay within a few seconds of CI."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from cairn.errors import CairnError, JournalError
from cairn.journal.reader import JournalReader
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import Intent
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.validation import first_error

RUN = "flow_" + "d" * 32
EXAMPLES = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
# No read may take this long (the reader's work bound stops a hostile statement first).
READ_SECONDS = 10.0

VALID_DESCRIPTION = LaunchDescription(
    run_id=RUN, owner_uid=1000, owner_gid=1000, owner_name="alice",
    definition="builtin:implement", source="print('x')", source_filename="implement.py",
    review_hash="sha256:" + "c" * 64, review={}, args={"objective": "x"},
    project=ProjectSpec(root="/home/alice/p", owner_uid=1000, on_pool_fs=False),
    profiles={"tool": ProfileSpec(name="tool", kind="scripted")},
    cairn_version="test", created_at=1.0,
).model_dump(mode="json")
VALID_INTENT = Intent(intent_id="create-w.root.1", run_id=RUN, kind="create-w").model_dump(
    mode="json")

# Keys and strings an attacker would pick: control characters, newlines, path tricks.
hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\n", "a\nb", "\x00", "../../etc/shadow", "\u202e", "flow_" + "0" * 32,
                     "x" * 5000, "sha256:", "🙂" * 100]),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True), hostile_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=20,
)


def nested(depth: int, kind: str) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" +
                                                                 "}" * depth)


def mutated(base: dict[str, Any]) -> st.SearchStrategy[str]:
    """``base`` with one key replaced, added or removed, as JSON text."""

    @st.composite
    def build(draw: st.DrawFn) -> str:
        data = dict(base)
        action = draw(st.sampled_from(["replace", "add", "remove"]))
        if action == "replace":
            data[draw(st.sampled_from(sorted(data)))] = draw(json_values)
        elif action == "add":
            data[draw(hostile_text)] = draw(json_values)
        else:
            data.pop(draw(st.sampled_from(sorted(data))))
        return json.dumps(data, allow_nan=True)

    return build()


hostile_json = st.one_of(
    json_values.map(lambda v: json.dumps(v, allow_nan=True)),
    st.builds(nested, st.integers(min_value=1, max_value=100_000),
              st.sampled_from(["list", "dict"])),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    st.sampled_from(['{"run_id": ' + "9" * 10_000 + "}", "1e999999", "NaN", ""]),
)


def one_line(text: str) -> None:
    assert text and "\n" not in text and len(text) < 2000, text


def read_or_refuse(model: type[BaseModel], text: str) -> None:
    try:
        model.model_validate_json(text)
    except ValidationError as exc:
        where, message = first_error(exc, top="value")
        one_line(f"{where}: {message}")


@EXAMPLES
@given(st.one_of(hostile_json, mutated(VALID_DESCRIPTION)))
def test_a_hostile_launch_description_is_refused_in_one_line(text: str) -> None:
    read_or_refuse(LaunchDescription, text)


@EXAMPLES
@given(st.one_of(hostile_json, mutated(VALID_INTENT)))
def test_a_hostile_intent_is_refused_in_one_line(text: str) -> None:
    read_or_refuse(Intent, text)


# --- the journal reader over a real SQLite file -----------------------------------------


@pytest.fixture(scope="module")
def journal_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "journal.db"
    with Journal(path, create=True) as journal:
        journal.create_run(LaunchDescription.model_validate(VALID_DESCRIPTION), intents=[])
    raw = sqlite3.connect(path)
    now = time.time()
    raw.execute(
        "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
        " source_location, state, created_at, updated_at)"
        " VALUES (?, 'root', 1, 'root-1', 'agent', '{}', 'h', 'wf.py:1', 'requested', ?, ?)",
        (RUN, now, now),
    )
    raw.execute("INSERT INTO intents (intent_id, run_id, verb, body, created_at)"
                " VALUES ('create-w.root.1', ?, 'storage-v1', '{}', ?)", (RUN, now))
    raw.commit()
    raw.close()
    restore(path)
    return path


# Where cairn could put hostile text, and the read root makes of it.
CELLS: dict[str, tuple[str, Callable[[JournalReader], object]]] = {
    "launch": ("UPDATE runs SET launch=? WHERE run_id=?",
               lambda r: r.launch_description(RUN)),
    "run output": ("UPDATE runs SET output=? WHERE run_id=?", lambda r: r.get_run(RUN)),
    "run state": ("UPDATE runs SET state=? WHERE run_id=?", lambda r: r.get_run(RUN)),
    "op request": ("UPDATE operations SET request=? WHERE run_id=?",
                   lambda r: r.get_op_by_id(RUN, "root-1")),
    "op result": ("UPDATE operations SET result=? WHERE run_id=?", lambda r: r.list_ops(RUN)),
    "intent body": ("UPDATE intents SET body=? WHERE run_id=?",
                    lambda r: r.intents(RUN, "storage-v1")),
}


@EXAMPLES
@example(cell="launch", text=json.dumps({**VALID_DESCRIPTION, "a\nb": 1}))
@example(cell="intent body", text=json.dumps({**VALID_INTENT, "\x1b[2J": 1}))
@example(cell="op request", text=nested(100_000, "dict"))
@example(cell="run output", text='{"a": ' + "9" * 10_000 + "}")
@given(cell=st.sampled_from(sorted(CELLS)),
       text=st.one_of(hostile_json, mutated(VALID_DESCRIPTION), mutated(VALID_INTENT)))
def test_the_reader_refuses_a_hostile_row_in_one_line(
    journal_file: Path, cell: str, text: str
) -> None:
    sql, read = CELLS[cell]
    raw = sqlite3.connect(journal_file)
    raw.execute(sql, (text, RUN))
    raw.commit()
    reader = JournalReader(journal_file)
    started = time.monotonic()
    try:
        read(reader)
    except CairnError as exc:
        assert isinstance(exc, JournalError), exc  # noqa: PT017  (any error must be this one)
        one_line(exc.message)
    finally:
        reader.close()
        assert time.monotonic() - started < READ_SECONDS
        restore(journal_file)


def restore(path: Path) -> None:
    """The fixture's rows as cairnd wrote them."""
    raw = sqlite3.connect(path)
    raw.execute("UPDATE runs SET launch=?, output=NULL, state='pending' WHERE run_id=?",
                (json.dumps(VALID_DESCRIPTION), RUN))
    raw.execute("UPDATE operations SET request='{}', result=NULL WHERE run_id=?", (RUN,))
    raw.execute("UPDATE intents SET body=? WHERE run_id=?", (json.dumps(VALID_INTENT), RUN))
    raw.commit()
    raw.close()


def test_a_row_root_can_read_is_read(journal_file: Path) -> None:
    """The properties above can fail: the untouched rows read, a hostile one does not."""
    reader = JournalReader(journal_file)
    try:
        for _sql, read in CELLS.values():
            read(reader)
    finally:
        reader.close()
    with pytest.raises(ValidationError):
        Intent.model_validate_json(nested(10_000, "dict"))
