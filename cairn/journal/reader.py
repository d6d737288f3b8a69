"""Reading the journal: a run, its launch description, its operations and its intents.

:class:`JournalReader` opens the database read-only (``mode=ro``) and never migrates it;
it is the only part of the journal the root broker opens, so it imports neither the
writers nor the people-in-the-loop code (and through it, the host policy). The read-write
:class:`cairn.journal.readwrite.Journal` inherits these reads.

The journal is written by ``cairn``, which faces hostile agents; a reader may be more
trusted (root). So a reader's connection is defensive (ARCHITECTURE §7): ``query_only``,
``trusted_schema=OFF``, ``cell_size_check``, limits on a value's length and an
expression's depth, a bound on the work of its statements, and a schema that must be
exactly the one the migrations make (no view, trigger or altered table). A value it
cannot read within those bounds is a :class:`JournalError`, never a crash.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from pydantic import ValidationError

from cairn.errors import JournalError, NotFound
from cairn.journal.rows import OpRow, RunRow
from cairn.journal.store import SCHEMA_VERSION, Clock, Store
from cairn.protocol.launch import LaunchDescription
from cairn.validation import first_error

if TYPE_CHECKING:
    from cairn.protocol.broker import Intent

_P = ParamSpec("_P")
_R = TypeVar("_R")

# sha256 of the schema the migrations make (type, name, table and SQL of every object in
# sqlite_master, sorted): tests/unit/test_journal_reader_hardening.py keeps it equal.
SCHEMA_SHA256 = "3077a16652276ab51a82e4770128769212b1df3d19224ccd5a1f079ed03d8c35"
VALUE_LIMIT = 16 << 20  # the largest value a reader takes (a launch description is ~100 KiB)
# A reader's statements together may run this many SQLite VM steps (in units of
# PROGRESS_STEPS); a journal that makes them run longer is refused.
PROGRESS_STEPS = 100_000
PROGRESS_BUDGET = 2_000


def harden(db: sqlite3.Connection) -> None:
    """Make ``db`` a defensive, read-only connection to a file a less trusted user wrote."""
    db.execute("PRAGMA query_only=ON")
    db.execute("PRAGMA trusted_schema=OFF")
    db.execute("PRAGMA cell_size_check=ON")
    db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, VALUE_LIMIT)
    db.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
    db.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 100)
    db.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, 100)
    db.setlimit(sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 1)
    db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    steps = [0]

    def progress() -> int:
        steps[0] += 1
        return int(steps[0] > PROGRESS_BUDGET)

    db.set_progress_handler(progress, PROGRESS_STEPS)


def schema_digest(db: sqlite3.Connection) -> str:
    rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    text = "\n".join(repr(tuple(r)) for r in sorted(rows, key=lambda r: tuple(map(str, r))))
    return hashlib.sha256(text.encode()).hexdigest()


def guarded(what: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A read of ``what`` that SQLite's limits or a malformed value stop is a
    :class:`JournalError` naming it."""

    def wrap(read: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(read)
        def guarded_read(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return read(*args, **kwargs)
            except (sqlite3.Error, ValueError, RecursionError) as exc:
                if isinstance(exc, ValidationError):
                    where, message = first_error(exc, top=what)
                    reason = f"{where}: {message}"
                else:
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise JournalError(
                    f"the journal's {what} cannot be read safely: {reason[:300]}",
                    hint="the journal was changed outside cairnd; see 'cairn doctor'",
                ) from None

        return guarded_read

    return wrap


class JournalReader(Store):
    """A read-only, defensive connection to an existing, migrated journal."""

    def __init__(self, path: Path, *, clock: Clock = time.time) -> None:
        super().__init__(path, readonly=True, create=False, clock=clock)
        try:
            harden(self.db)
            digest = schema_digest(self.db)
        except sqlite3.Error as exc:
            self.close()
            raise JournalError(f"cannot read journal {path}: {exc}") from exc
        if digest != SCHEMA_SHA256 and self.schema_version() == SCHEMA_VERSION:
            self.close()
            raise JournalError(
                f"journal {path} has a schema its migrations did not make (a view, a "
                "trigger or a changed table): refused",
                hint="the journal was changed outside cairnd; restore it from a backup",
            )
        version = self.schema_version()
        if version != SCHEMA_VERSION:
            self.close()
            newer = version > SCHEMA_VERSION
            raise JournalError(
                f"journal schema {version} is {'newer' if newer else 'older'} than this "
                f"cairn ({SCHEMA_VERSION})",
                hint="upgrade the cairn package"
                if newer
                else "cairnd migrates the journal when it starts; start cairn.socket",
            )

    # --- runs -----------------------------------------------------------------------

    @guarded("run")
    def get_run(self, run_id: str) -> RunRow:
        row = self.db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}", hint="list runs with 'cairn ps'")
        return RunRow.from_row(row)

    @guarded("launch description")
    def launch_description(self, run_id: str) -> LaunchDescription:
        row = self.db.execute("SELECT launch FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}")
        return LaunchDescription.model_validate_json(row["launch"])

    # --- operations -----------------------------------------------------------------

    @guarded("operation")
    def get_op_by_id(self, run_id: str, op_id: str) -> OpRow:
        row = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
        ).fetchone()
        if row is None:
            raise NotFound(f"run {run_id} has no operation {op_id}")
        return OpRow.from_row(row)

    @guarded("operations")
    def list_ops(self, run_id: str) -> list[OpRow]:
        rows = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? ORDER BY scope, seq", (run_id,)
        ).fetchall()
        return [OpRow.from_row(r) for r in rows]

    # --- intents --------------------------------------------------

    @guarded("intents")
    def intents(self, run_id: str, verb: str | None = None) -> list[Intent]:
        from cairn.protocol.broker import Intent  # model egress reads no intents: not at start
        if verb is None:
            rows = self.db.execute(
                "SELECT body FROM intents WHERE run_id=? ORDER BY rowid", (run_id,)
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT body FROM intents WHERE run_id=? AND verb=? ORDER BY rowid",
                (run_id, verb),
            ).fetchall()
        return [Intent.model_validate_json(r["body"]) for r in rows]
