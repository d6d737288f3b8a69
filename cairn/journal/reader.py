"""Reading the journal: a run, its launch description, its operations and its intents.

:class:`JournalReader` opens the database read-only (``mode=ro``) and never migrates it;
it is the only part of the journal the root broker opens, so it imports neither the
writers nor the people-in-the-loop code (and through it, the host policy). The read-write
:class:`cairn.journal.readwrite.Journal` inherits these reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.errors import JournalError, NotFound
from cairn.journal.rows import OpRow, RunRow
from cairn.journal.store import SCHEMA_VERSION, Clock, Store
from cairn.protocol.launch import LaunchDescription

if TYPE_CHECKING:
    from cairn.protocol.broker import Intent


class JournalReader(Store):
    """A read-only connection to an existing, migrated journal."""

    def __init__(self, path: Path, *, clock: Clock = time.time) -> None:
        super().__init__(path, readonly=True, create=False, clock=clock)
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

    def get_run(self, run_id: str) -> RunRow:
        row = self.db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}", hint="list runs with 'cairn ps'")
        return RunRow.from_row(row)

    def launch_description(self, run_id: str) -> LaunchDescription:
        row = self.db.execute("SELECT launch FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}")
        return LaunchDescription.model_validate_json(row["launch"])

    # --- operations -----------------------------------------------------------------

    def get_op_by_id(self, run_id: str, op_id: str) -> OpRow:
        row = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
        ).fetchone()
        if row is None:
            raise NotFound(f"run {run_id} has no operation {op_id}")
        return OpRow.from_row(row)

    def list_ops(self, run_id: str) -> list[OpRow]:
        rows = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? ORDER BY scope, seq", (run_id,)
        ).fetchall()
        return [OpRow.from_row(r) for r in rows]

    # --- intents --------------------------------------------------

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
