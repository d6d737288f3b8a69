"""What every writer of the journal shares: lease fencing, events, intents and receipts,
and reading events and receipts back.

Writes on behalf of a coordinator carry its lease token: :meth:`Writes._fence` refuses a
token that is no longer current (:class:`LeaseLost`) and renews the lease.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager

from cairn.canonical import canonical_json
from cairn.errors import JournalError, NotFound
from cairn.journal.reader import JournalReader
from cairn.journal.rows import EventRow, StoredReceipt
from cairn.journal.store import LEASE_TTL
from cairn.journal.transactions import transaction
from cairn.protocol.broker import VERB_OF_KIND, Intent
from cairn.protocol.jsonvalue import JSONValue

AGENT_TIME_EVENT = "agent-time"  # one agent attempt's seconds, from its start to its end


class LeaseLost(JournalError):
    """This coordinator no longer holds the run lease (fenced)."""

    code = "lease-lost"


class Writes(JournalReader):
    """The base of the read-write journal's parts (runs, operations, people)."""

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; commits on success, rolls back on error."""
        return transaction(self.db)

    def _fence(
        self, db: sqlite3.Connection, run_id: str, token: int, ttl: float = LEASE_TTL
    ) -> None:
        row = db.execute("SELECT lease_token FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"run {run_id} not found")
        if row["lease_token"] != token:
            raise LeaseLost(f"lease for {run_id} was taken over (token {token} is fenced)")
        db.execute("UPDATE runs SET lease_expires=? WHERE run_id=?", (self.clock() + ttl, run_id))

    # --- events ---------------------------------------------------------------------

    def append_event(
        self,
        run_id: str,
        event: str,
        data: Mapping[str, object] | None = None,
        scope: str | None = None,
        op_id: str | None = None,
    ) -> None:
        with self.transaction() as db:
            self._event(db, run_id, event, data or {}, scope, op_id)

    def events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[EventRow]:
        rows = self.db.execute(
            "SELECT * FROM events WHERE run_id=? AND cursor>? ORDER BY cursor LIMIT ?",
            (run_id, after, limit),
        ).fetchall()
        return [EventRow.model_validate({**dict(r), "data": json.loads(r["data"])}) for r in rows]

    def agent_seconds(self, run_id: str) -> float:
        """The run's agent time: the seconds of every agent attempt recorded, committed,
        crashed or retried alike (an attempt recorded twice, by a coordinator that
        restarted, counts once with its longest span)."""
        row = self.db.execute(
            "SELECT coalesce(sum(seconds), 0) FROM (SELECT max(json_extract(data, '$.seconds'))"
            " AS seconds FROM events WHERE run_id=? AND event=?"
            " GROUP BY op_id, json_extract(data, '$.attempt'))",
            (run_id, AGENT_TIME_EVENT),
        ).fetchone()
        return float(row[0])

    def _event(
        self,
        db: sqlite3.Connection,
        run_id: str,
        event: str,
        data: Mapping[str, object],
        scope: str | None = None,
        op_id: str | None = None,
    ) -> None:
        db.execute(
            "INSERT INTO events (run_id, scope, op_id, event, data, at) VALUES (?,?,?,?,?,?)",
            (run_id, scope, op_id, event, canonical_json(data), self.clock()),
        )

    def latest_progress(self, run_id: str) -> dict[str, EventRow]:
        """The newest ``progress`` event of each phase of the run, by phase."""
        rows = self.db.execute(
            "SELECT e.* FROM events e JOIN (SELECT max(cursor) AS cursor FROM events"
            " WHERE run_id=? AND event='progress' GROUP BY json_extract(data, '$.phase'))"
            " latest ON e.cursor = latest.cursor ORDER BY e.cursor",
            (run_id,),
        ).fetchall()
        events = _event_rows(rows)
        return {str(e.data.get("phase")): e for e in events}

    def last_event_cursor(self) -> int:
        """The cursor of the newest event of any run (0 without any)."""
        return int(self.db.execute("SELECT coalesce(max(cursor), 0) FROM events").fetchone()[0])

    def owner_events(
        self, owner_uid: int, names: Collection[str], after: int, limit: int
    ) -> tuple[list[EventRow], int]:
        """Events named in ``names`` of ``owner_uid``'s runs after cursor ``after``, at most
        ``limit``, and the cursor to continue from (past every event seen so far)."""
        top = self.last_event_cursor()
        marks = ",".join("?" * len(names))
        rows = self.db.execute(
            "SELECT e.* FROM events e JOIN runs r ON r.run_id = e.run_id"
            f" WHERE r.owner_uid=? AND e.cursor>? AND e.cursor<=? AND e.event IN ({marks})"
            " ORDER BY e.cursor LIMIT ?",
            (owner_uid, after, top, *names, limit),
        ).fetchall()
        events = _event_rows(rows)
        return events, events[-1].cursor if len(events) == limit else max(top, after)

    # --- intents and receipts -------------------------------------------------------

    def add_intents(self, run_id: str, intents: list[Intent], *, token: int | None) -> None:
        """Queue intents; a coordinator passes its token, the daemon (no lease yet) None."""
        with self.transaction() as db:
            if token is not None:
                self._fence(db, run_id, token)
            for intent in intents:
                self._insert_intent(db, intent)

    def _insert_intent(self, db: sqlite3.Connection, intent: Intent) -> None:
        db.execute(
            "INSERT OR IGNORE INTO intents (intent_id, run_id, verb, body, created_at)"
            " VALUES (?,?,?,?,?)",
            (
                intent.intent_id,
                intent.run_id,
                VERB_OF_KIND[intent.kind],
                intent.model_dump_json(),
                self.clock(),
            ),
        )

    def withdraw_intent(self, run_id: str, intent_id: str) -> bool:
        """Remove a pending intent no receipt says was done (a one-shot intent of cairnd
        whose call failed); whether one was removed."""
        with self.transaction() as db:
            removed = db.execute(
                "DELETE FROM intents WHERE run_id=? AND intent_id=? AND NOT EXISTS"
                " (SELECT 1 FROM receipts WHERE run_id=? AND intent_id=?)",
                (run_id, intent_id, run_id, intent_id),
            ).rowcount
        return bool(removed)

    def record_receipts(self, run_id: str, receipts: Sequence[Mapping[str, JSONValue]]) -> None:
        """Keep the broker's receipts beside the intents (the broker's own DB stays the
        authority; this copy feeds views). None (a queued run's launch, which the broker
        only pins) takes no write lock."""
        if not receipts:
            return
        with self.transaction() as db:
            for receipt in receipts:
                db.execute(
                    "INSERT OR IGNORE INTO receipts (intent_id, run_id, body, at) VALUES (?,?,?,?)",
                    (receipt["intent_id"], run_id, canonical_json(receipt), receipt["at"]),
                )

    def receipts(self, run_id: str) -> list[StoredReceipt]:
        rows = self.db.execute(
            "SELECT body FROM receipts WHERE run_id=? ORDER BY at", (run_id,)
        ).fetchall()
        return [json.loads(r["body"]) for r in rows]


def _event_rows(rows: list[sqlite3.Row]) -> list[EventRow]:
    return [EventRow.model_validate({**dict(r), "data": json.loads(r["data"])}) for r in rows]
