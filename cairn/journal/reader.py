"""Reading the journal: runs, operations, intents, receipts and events.

:class:`JournalReader` opens the database read-only (``mode=ro``) and never migrates it;
it is the only part of the journal the root broker opens, so it imports neither the
writers nor the people-in-the-loop code (and through it, the host policy). The read-write
:class:`cairn.journal.Journal` inherits these reads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cairn.errors import JournalError, NotFound
from cairn.journal.rows import EventRow, OpRow, RunRow
from cairn.journal.store import SCHEMA_VERSION, Clock, Store
from cairn.protocol.broker import Intent
from cairn.protocol.launch import LaunchDescription


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

    def list_runs(self, owner_uid: int | None = None, limit: int = 200) -> list[RunRow]:
        if owner_uid is None:
            rows = self.db.execute(
                "SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        else:
            rows = self.db.execute(
                "SELECT * FROM runs WHERE owner_uid=? ORDER BY created_at DESC LIMIT ?",
                (owner_uid, limit),
            ).fetchall()
        return [RunRow.from_row(r) for r in rows]

    def count_runs(self, owner_uid: int | None = None) -> int:
        if owner_uid is None:
            return int(self.db.execute("SELECT count(*) FROM runs").fetchone()[0])
        return int(
            self.db.execute("SELECT count(*) FROM runs WHERE owner_uid=?", (owner_uid,)).fetchone()[
                0
            ]
        )

    def launch_description(self, run_id: str) -> LaunchDescription:
        row = self.db.execute("SELECT launch FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id}")
        return LaunchDescription.model_validate_json(row["launch"])

    # --- operations -----------------------------------------------------------------

    def get_op(self, run_id: str, scope: str, seq: int) -> OpRow | None:
        row = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? AND scope=? AND seq=?", (run_id, scope, seq)
        ).fetchone()
        return None if row is None else OpRow.from_row(row)

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

    # --- intents, receipts, events --------------------------------------------------

    def intents(self, run_id: str, verb: str | None = None) -> list[Intent]:
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

    def receipts(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT body FROM receipts WHERE run_id=? ORDER BY at", (run_id,)
        ).fetchall()
        return [json.loads(r["body"]) for r in rows]

    def events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRow]:
        rows = self.db.execute(
            "SELECT * FROM events WHERE run_id=? AND cursor>? ORDER BY cursor LIMIT ?",
            (run_id, after, limit),
        ).fetchall()
        return [EventRow.model_validate({**dict(r), "data": json.loads(r["data"])}) for r in rows]
