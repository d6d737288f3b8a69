"""The machine-wide queue of runs (:mod:`cairn.admission`): recording a new run admitted or
``queued``, and moving queued runs to ``pending`` when slots free, each decision in one
``BEGIN IMMEDIATE`` transaction, so concurrent launches and admissions never hand out more
slots than there are.

A queued run joins the queue once its owner's attestation is pinned (a ``run-queued``
event): before that, root would refuse to start it. Its start intent is added only when it
is admitted (a ``run-admitted`` event); the daemon then asks the broker to carry it out.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from cairn.admission import SLOT_STATES, Queued
from cairn.journal.rows import OpRow, RunState
from cairn.journal.runs import RunKeyTaken, Runs
from cairn.protocol.broker import Intent
from cairn.protocol.launch import LaunchDescription

START_INTENT = "start-coordinator"
Chooser = Callable[[list[Queued], dict[int, int]], list[Queued]]


def start_intent(run_id: str) -> Intent:
    return Intent(intent_id=START_INTENT, run_id=run_id, kind="start-coordinator")


class Queue(Runs):
    def launch_run(
        self,
        desc: LaunchDescription,
        *,
        machine_limit: int,
        user_limit: int,
        imported: Sequence[OpRow] = (),
        run_key: str | None = None,
    ) -> bool:
        """Record a new run (a replay's with the operations it imports): admitted
        (``pending``, with its start intent) when the machine has a free slot, its owner is
        under their share and no run is queued; otherwise ``queued``, with no intent. True
        when admitted. :class:`RunKeyTaken` when the owner has a run of ``run_key``
        already (a concurrent launch of the same key recorded it first)."""
        try:
            with self.transaction() as db:
                holding = self._holding(db)
                waiting = db.execute(
                    "SELECT 1 FROM runs WHERE state='queued' LIMIT 1"
                ).fetchone()
                admitted = (
                    waiting is None
                    and sum(holding.values()) < machine_limit
                    and holding.get(desc.owner_uid, 0) < user_limit
                )
                intents = [start_intent(desc.run_id)] if admitted else []
                state: RunState = "pending" if admitted else "queued"
                self._insert_run(db, desc, state, intents, imported, run_key=run_key)
                return admitted
        except sqlite3.IntegrityError:
            taken = self.run_by_key(desc.owner_uid, run_key) if run_key is not None else None
            if taken is None:
                raise
            raise RunKeyTaken(taken) from None

    def join_queue(self, run_id: str) -> bool:
        """The queued run's description is pinned on its owner's word: it may be started
        later without them. False when it is no longer queued (cancelled meanwhile)."""
        with self.transaction() as db:
            if not self._is_queued(db, run_id):
                return False
            self._event(db, run_id, "run-queued", {})
            return True

    def admit_queued(self, choose: Chooser) -> list[str]:
        """Move the queued runs ``choose`` picks (from the queue and the slots each user
        holds now) to ``pending`` with their start intent; return their IDs."""
        with self.transaction() as db:
            picked = choose(self._queue(db), self._holding(db))
            for run in picked:
                db.execute(
                    "UPDATE runs SET state='pending', updated_at=? WHERE run_id=?"
                    " AND state='queued'",
                    (self.clock(), run.run_id),
                )
                self._insert_intent(db, start_intent(run.run_id))
                self._event(db, run.run_id, "run-admitted", {})
            return [run.run_id for run in picked]

    def queue_snapshot(self) -> tuple[list[Queued], dict[int, int]]:
        """The queue (runs that joined it, oldest first) and how many slots each user
        holds."""
        return self._queue(self.db), self._holding(self.db)

    def was_queued(self, run_id: str) -> bool:
        """Whether the run ever joined the queue (its owner was told it would start
        later)."""
        row = self.db.execute(
            "SELECT 1 FROM events WHERE run_id=? AND event='run-queued' LIMIT 1", (run_id,)
        ).fetchone()
        return row is not None

    @staticmethod
    def _is_queued(db: sqlite3.Connection, run_id: str) -> bool:
        row = db.execute("SELECT state FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return row is not None and row["state"] == "queued"

    @staticmethod
    def _holding(db: sqlite3.Connection) -> dict[int, int]:
        rows = db.execute(
            f"SELECT owner_uid, count(*) AS n FROM runs WHERE state IN"
            f" ({','.join('?' * len(SLOT_STATES))}) GROUP BY owner_uid",
            SLOT_STATES,
        ).fetchall()
        return {int(r["owner_uid"]): int(r["n"]) for r in rows}

    @staticmethod
    def _queue(db: sqlite3.Connection) -> list[Queued]:
        rows = db.execute(
            "SELECT r.run_id, r.owner_uid, e.at FROM runs r JOIN events e"
            " ON e.run_id = r.run_id AND e.event = 'run-queued'"
            " WHERE r.state = 'queued' ORDER BY e.at, r.run_id"
        ).fetchall()
        return [Queued(r["run_id"], int(r["owner_uid"]), float(r["at"])) for r in rows]
