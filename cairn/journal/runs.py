"""Runs and their lease: creating a run, moving its state, finding one by a prefix of its
ID or as its owner's newest, the fencing lease a coordinator holds while it writes, and
moving a resting run to new reviewed source."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from cairn.errors import CairnError, NotFound, UsageError
from cairn.journal.rows import TERMINAL_RUN_STATES, OpRow, RunRow, RunState, dumps, loads
from cairn.journal.store import LEASE_TTL
from cairn.journal.writes import Writes
from cairn.protocol.broker import Intent
from cairn.protocol.jsonvalue import JSONValue
from cairn.protocol.launch import LaunchDescription
from cairn.protocol.settlement import ApplyResult
from cairn.protocol.settlement_record import Revert, SettlementRecord


class RunEnded(CairnError):
    """The run has finished; nothing more can be asked of it."""

    code = "run-ended"


class Busy(CairnError):
    """Another process holds what was asked for."""

    code = "busy"


class RunKeyTaken(UsageError):
    """The owner already has a run of this run key (``run``): a retried launch."""

    def __init__(self, run: RunRow) -> None:
        super().__init__(f"run key {run.run_key} already names run {run.run_id}")
        self.run = run


class RunMatch(NamedTuple):
    """What a person needs to tell runs apart: one run a prefix of its ID matched."""

    run_id: str
    owner_uid: int
    definition: str
    state: str
    created_at: float


class Runs(Writes):
    def create_run(
        self, desc: LaunchDescription, *, intents: list[Intent], imported: Sequence[OpRow] = ()
    ) -> None:
        """Record a new run with its frozen launch description and first intents, and, for
        a replay, the operations it imports from its source (each as it was there, with an
        ``op-imported`` event naming the run and operation it came from)."""
        with self.transaction() as db:
            self._insert_run(db, desc, "pending", intents, imported)

    def run_by_key(self, owner_uid: int, run_key: str) -> RunRow | None:
        """The owner's run recorded with ``run_key`` (``cairn launch --run-key``), if any."""
        row = self.db.execute(
            "SELECT * FROM runs WHERE owner_uid=? AND run_key=?", (owner_uid, run_key)
        ).fetchone()
        return RunRow.from_row(row) if row is not None else None

    def _insert_run(
        self,
        db: sqlite3.Connection,
        desc: LaunchDescription,
        state: RunState,
        intents: list[Intent],
        imported: Sequence[OpRow] = (),
        run_key: str | None = None,
    ) -> None:
        now = self.clock()
        db.execute(
            "INSERT INTO runs (run_id, owner_uid, definition, review_hash, project, state,"
            " launch, created_at, updated_at, run_key) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                desc.run_id,
                desc.owner_uid,
                desc.definition,
                desc.review_hash,
                desc.project.root,
                state,
                desc.model_dump_json(),
                now,
                now,
                run_key,
            ),
        )
        for intent in intents:
            self._insert_intent(db, intent)
        self._event(db, desc.run_id, "run-created", {"definition": desc.definition})
        for op in imported:
            self._import_op(db, desc.run_id, op, now)

    def _import_op(self, db: sqlite3.Connection, run_id: str, op: OpRow, now: float) -> None:
        db.execute(
            "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
            " source_location, predecessor, attempt, state, finish, result, error, checkpoint,"
            " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run_id, op.scope, op.seq, op.op_id, op.kind, dumps(op.request),
                op.request_hash, op.source_location, op.predecessor, op.attempt, op.state,
                dumps(op.finish), dumps(op.result), op.error, dumps(op.checkpoint), now, now,
            ),
        )
        provenance = {"source_run": op.run_id, "source_op": op.op_id, "state": op.state}
        self._event(db, run_id, "op-imported", provenance, op.scope, op.op_id)

    def set_run_state(
        self,
        run_id: str,
        state: RunState,
        *,
        token: int,
        ttl: float = LEASE_TTL,
        output: Mapping[str, JSONValue] | None = None,
        error: str | None = None,
    ) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, ttl)
            db.execute(
                "UPDATE runs SET state=?, output=coalesce(?, output), error=?, updated_at=?"
                " WHERE run_id=?",
                (state, dumps(output), error, self.clock(), run_id),
            )
            self._event(db, run_id, f"run-{state}", {"error": error} if error else {})

    def fail_unstarted_run(self, run_id: str, error: str) -> bool:
        """End a run no coordinator ever took (``pending`` or ``queued``, no lease ever
        acquired) as ``failed`` with ``error``: a launch that could not start it leaves
        nothing behind to start later. False when a coordinator took the run meanwhile (it
        is started) or it ended otherwise."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT state, lease_token FROM runs WHERE run_id=?", (run_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id}")
            if row["state"] not in ("pending", "queued") or row["lease_token"] != 0:
                return False
            db.execute(
                "UPDATE runs SET state='failed', error=?, updated_at=? WHERE run_id=?",
                (error, self.clock(), run_id),
            )
            self._event(db, run_id, "run-failed", {"error": error, "by": "launch"})
            return True

    def set_settlement(self, run_id: str, settlement: SettlementRecord, *, token: int) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token)
            db.execute(
                "UPDATE runs SET settlement=?, updated_at=? WHERE run_id=?",
                (dumps(settlement.stored()), self.clock(), run_id),
            )
            self._event(db, run_id, "settlement", {"status": settlement.status})

    def record_revert(self, run_id: str, result: ApplyResult, *, actor_uid: int) -> None:
        """Keep the outcome of ``cairn revert`` in the finished run's settlement record
        (its ``revert``) with a ``reverted`` event. The daemon writes it; a finished run
        has no coordinator holding its lease."""
        with self.transaction() as db:
            row = db.execute("SELECT settlement FROM runs WHERE run_id=?", (run_id,)).fetchone()
            settlement = SettlementRecord.read(None if row is None else loads(row["settlement"]))
            if settlement is None:
                raise NotFound(f"run {run_id} has no settlement to revert")
            revert = Revert(status=result.status, applied=result.applied,
                            already_applied=result.already_applied,
                            conflicts=result.conflicts, by_uid=actor_uid, at=self.clock())
            db.execute(
                "UPDATE runs SET settlement=?, updated_at=? WHERE run_id=?",
                (dumps(settlement.model_copy(update={"revert": revert}).stored()),
                 self.clock(), run_id),
            )
            counts = {"applied": len(result.applied),
                      "already_applied": len(result.already_applied),
                      "conflicts": len(result.conflicts)}
            self._event(db, run_id, "reverted", {"status": result.status, **counts})

    # --- listing runs -----------------------------------------------------------------

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

    def replays_of(self, runs: Sequence[RunRow]) -> dict[str, list[str]]:
        """The runs replayed from each of ``runs`` (``cairn replay``), oldest first; a run
        no replay names is left out. A replay is its source's owner's and newer than it
        (``daemon/replay.py``), so only each owner's runs since their oldest source given
        are read (the ``runs_owner`` index)."""
        sources = {run.run_id for run in runs}
        since: dict[int, float] = {}
        for run in runs:
            since[run.owner_uid] = min(since.get(run.owner_uid, run.created_at), run.created_at)
        replays: dict[str, list[str]] = {}
        for owner, first in since.items():
            rows = self.db.execute(
                "SELECT json_extract(launch, '$.replay.source_run'), run_id FROM runs"
                " WHERE owner_uid=? AND created_at>=? ORDER BY created_at",
                (owner, first),
            ).fetchall()
            for source, run_id in rows:
                if source in sources:
                    replays.setdefault(source, []).append(run_id)
        return replays

    # --- finding a run by a short name -----------------------------------------------

    def runs_with_prefix(self, prefix: str, *, owner_uid: int | None, limit: int) -> list[RunMatch]:
        """At most ``limit`` runs whose ID starts with ``prefix`` (``flow_`` and some hex
        digits), of ``owner_uid`` (None: anyone's), in ID order: a range on the primary
        key, so it reads only the matching rows however many runs the journal holds."""
        if not prefix:
            raise UsageError("an empty run prefix matches every run")
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        # The unary + keeps SQLite on the primary key's range rather than on the owner
        # index, which would read every run of the owner.
        rows = self.db.execute(
            "SELECT run_id, owner_uid, definition, state, created_at FROM runs"
            " WHERE run_id >= ? AND run_id < ? AND (? IS NULL OR +owner_uid = ?)"
            " ORDER BY run_id LIMIT ?",
            (prefix, upper, owner_uid, owner_uid, limit),
        ).fetchall()
        return [RunMatch(*row) for row in rows]

    def latest_run_id(self, owner_uid: int) -> str | None:
        """The ID of ``owner_uid``'s most recently created run (the last one recorded, of
        two created at the same time), if any."""
        row = self.db.execute(
            "SELECT run_id FROM runs WHERE owner_uid = ?"
            " ORDER BY created_at DESC, rowid DESC LIMIT 1",
            (owner_uid,),
        ).fetchone()
        return None if row is None else str(row["run_id"])

    # --- lease ----------------------------------------------------------------------

    def acquire_lease(
        self,
        run_id: str,
        holder: str,
        *,
        ttl: float = LEASE_TTL,
        holder_is_dead: Callable[[str], bool] = lambda _holder: False,
    ) -> int:
        """Take the run lease, returning the new fencing token; ``Busy`` if it is held.

        A lease whose holder ``holder_is_dead`` says is gone (a crashed coordinator on this
        host) is reclaimed at once instead of waiting for it to expire.
        """
        now = self.clock()
        with self.transaction() as db:
            row = db.execute(
                "SELECT state, lease_holder, lease_token, lease_expires FROM runs WHERE run_id=?",
                (run_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id}")
            if row["state"] in TERMINAL_RUN_STATES:
                raise RunEnded(f"run {run_id} is {row['state']}; nothing to start")
            held = row["lease_holder"]
            if held and held != holder and row["lease_expires"] > now and not holder_is_dead(held):
                raise Busy(
                    f"run {run_id} is held by {row['lease_holder']}",
                    hint="another coordinator is running it",
                )
            token = int(row["lease_token"]) + 1
            db.execute(
                "UPDATE runs SET lease_holder=?, lease_token=?, lease_expires=? WHERE run_id=?",
                (holder, token, now + ttl, run_id),
            )
            self._event(db, run_id, "lease-acquired", {"holder": holder, "token": token})
            return token

    def renew_lease(self, run_id: str, token: int, *, ttl: float = LEASE_TTL) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, ttl)

    def release_lease(self, run_id: str, token: int) -> None:
        with self.transaction() as db:
            self._fence(db, run_id, token, 0.0)
            db.execute(
                "UPDATE runs SET lease_holder=NULL, lease_expires=0 WHERE run_id=?", (run_id,)
            )

    # --- new source -----------------------------------------------------------------

    def upgrade_source(
        self,
        run_id: str,
        desc: LaunchDescription,
        *,
        locations: dict[str, str],
        actor_uid: int,
        old_hash: str,
    ) -> None:
        """Move a run that is not active to new reviewed source: the new launch description
        and the committed operations' new source locations, in one transaction."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT state, review_hash, lease_holder, lease_expires FROM runs WHERE run_id=?",
                (run_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no run {run_id}")
            if row["state"] not in ("waiting", "blocked", "pending") or (
                row["lease_holder"] and row["lease_expires"] > self.clock()
            ):
                raise UsageError(
                    f"run {run_id} is {row['state']}; only a waiting or blocked run moves to "
                    "new source"
                )
            if row["review_hash"] != old_hash:
                raise UsageError(f"run {run_id} changed while the dry run was checked; repeat it")
            db.execute(
                "UPDATE runs SET launch=?, review_hash=?, updated_at=? WHERE run_id=?",
                (desc.model_dump_json(), desc.review_hash, self.clock(), run_id),
            )
            for op_id, location in locations.items():
                db.execute(
                    "UPDATE operations SET source_location=? WHERE run_id=? AND op_id=?",
                    (location, run_id, op_id),
                )
            self._event(
                db,
                run_id,
                "source-upgraded",
                {"from": old_hash, "to": desc.review_hash, "actor_uid": actor_uid},
            )
