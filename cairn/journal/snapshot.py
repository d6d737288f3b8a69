"""One read snapshot of the journal, for views.

Every read made inside :func:`read_snapshot` sees the same committed state: it is one
SQLite read transaction (WAL readers see the database as of their first read and never
block writers). A view reads a run's events bounded — the first and the last of them —
and says what it left out, but the latest event and the latest replay divergence are
always read, however many events lie between. A row that does not parse is reported as
:class:`Unreadable`, never skipped and never fatal to the view.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, ValidationError

from cairn.errors import JournalError
from cairn.journal.rows import EventRow, OpRow
from cairn.journal.store import Store

# What ends an operation: the events of its moves to a final state.
FINAL_EVENTS = ("op-committed", "op-failed", "op-not-started")


@contextmanager
def read_snapshot(store: Store) -> Iterator[None]:
    """Make every read on ``store`` inside the block see one state of the journal."""
    db = store.db
    if db.in_transaction:
        raise JournalError("a view's read snapshot cannot start inside another transaction")
    db.execute("BEGIN DEFERRED")
    try:
        # A deferred transaction takes its snapshot at its first read: take it now.
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        yield
    finally:
        db.execute("ROLLBACK")


class Unreadable(BaseModel):
    """A journal row a view could not read (bad JSON or a value outside its model)."""

    model_config = ConfigDict(defer_build=True)

    table: str
    key: str
    reason: str


class EventWindow(BaseModel):
    """A bounded read of one run's events: the first ``head`` and the last ``tail`` of
    ``total``, with ``omitted`` between them; ``latest`` is the run's last event and
    ``divergence`` its last ``replay-diverged`` event, wherever they are."""

    model_config = ConfigDict(defer_build=True)

    total: int
    head: list[EventRow]
    tail: list[EventRow]
    omitted: int
    latest: EventRow | None
    divergence: EventRow | None
    unreadable: list[Unreadable]

    def statement(self) -> str:
        """What this window shows of the run's events, in one line."""
        if not self.omitted:
            return f"all {self.total} events"
        return (
            f"first {len(self.head)} and last {len(self.tail)} of {self.total} events; "
            f"{self.omitted} omitted"
        )


class OpEventSpan(BaseModel):
    """Where an operation's events start and end: the cursor of its first
    ``op-requested`` event and of its first move to a final state (``None``: none)."""

    model_config = ConfigDict(defer_build=True)

    op_id: str
    requested: int | None
    finished: int | None


def _event(row: sqlite3.Row, unreadable: list[Unreadable]) -> EventRow | None:
    try:
        return EventRow.model_validate({**dict(row), "data": json.loads(row["data"])})
    except (ValueError, TypeError, ValidationError) as exc:
        unreadable.append(Unreadable(table="events", key=str(row["cursor"]), reason=_why(exc)))
        return None


def _why(exc: Exception) -> str:
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def event_window(store: Store, run_id: str, *, head: int, tail: int) -> EventWindow:
    """The first ``head`` and last ``tail`` events of ``run_id``, its latest event and
    its latest replay divergence (call inside :func:`read_snapshot`)."""
    db = store.db
    unreadable: list[Unreadable] = []
    total = int(db.execute("SELECT count(*) FROM events WHERE run_id=?", (run_id,)).fetchone()[0])
    first_rows = db.execute(
        "SELECT * FROM events WHERE run_id=? ORDER BY cursor LIMIT ?", (run_id, head)
    ).fetchall()
    after = first_rows[-1]["cursor"] if first_rows else 0
    last_rows = db.execute(
        "SELECT * FROM events WHERE run_id=? AND cursor>? ORDER BY cursor DESC LIMIT ?",
        (run_id, after, tail),
    ).fetchall()
    last_rows.reverse()
    diverged = db.execute(
        "SELECT * FROM events WHERE run_id=? AND event='replay-diverged'"
        " ORDER BY cursor DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    newest = (last_rows or first_rows)[-1:] or [None]
    first = [e for r in first_rows if (e := _event(r, unreadable))]
    last = [e for r in last_rows if (e := _event(r, unreadable))]
    return EventWindow(
        total=total,
        head=first,
        tail=last,
        omitted=total - len(first_rows) - len(last_rows),
        latest=None if newest[0] is None else _event(newest[0], []),
        divergence=None if diverged is None else _event(diverged, unreadable),
        unreadable=list({row.key: row for row in unreadable}.values()),
    )


def op_event_spans(store: Store, run_id: str) -> list[OpEventSpan]:
    """For every operation ID the run's events name, where its events start and end."""
    rows = store.db.execute(
        "SELECT op_id,"
        " min(CASE WHEN event='op-requested' THEN cursor END) AS requested,"
        f" min(CASE WHEN event IN ({','.join('?' * len(FINAL_EVENTS))}) THEN cursor END)"
        " AS finished"
        " FROM events WHERE run_id=? AND op_id IS NOT NULL GROUP BY op_id ORDER BY min(cursor)",
        (*FINAL_EVENTS, run_id),
    ).fetchall()
    return [OpEventSpan.model_validate(dict(r)) for r in rows]


def retry_events(store: Store, run_id: str) -> list[EventRow]:
    """Every ``op-retry`` event of the run, oldest first (a few per operation at most)."""
    rows = store.db.execute(
        "SELECT * FROM events WHERE run_id=? AND event='op-retry' ORDER BY cursor", (run_id,)
    ).fetchall()
    return [e for r in rows if (e := _event(r, []))]


def readable_ops(store: Store, run_id: str) -> tuple[list[OpRow], list[Unreadable]]:
    """The run's operations in (scope, seq) order, and the rows that do not parse."""
    ops: list[OpRow] = []
    unreadable: list[Unreadable] = []
    rows = store.db.execute(
        "SELECT * FROM operations WHERE run_id=? ORDER BY scope, seq", (run_id,)
    ).fetchall()
    for row in rows:
        try:
            ops.append(OpRow.from_row(row))
        except (ValueError, TypeError, ValidationError) as exc:
            key = str(row["op_id"])
            unreadable.append(Unreadable(table="operations", key=key, reason=_why(exc)))
    return ops, unreadable
