"""Operations and their state machine.

An operation moves ``requested`` → ``started`` (intent saved before the effect) →
``settled`` (result and evidence saved) → ``committed``. :data:`OP_TRANSITIONS` lists
every move the coordinator, cairnd and the journal itself make (keys and values are
:data:`~cairn.journal.schema.OpState` names), each with where; an
:meth:`Operations.update_op` outside it raises :class:`IllegalTransition`
and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from cairn.canonical import canonical_json
from cairn.errors import JournalError, NotFound, UsageError
from cairn.journal.rows import OpRow, OpState, dumps
from cairn.journal.writes import Writes
from cairn.protocol.broker import Intent
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONValue


class ModelSpend(NamedTuple):
    """A run's model calls, their tokens and their cost (micro-units of the currency of
    the providers' prices; 0 when unpriced)."""

    calls: int
    tokens: int
    cost_micros: int


class IllegalTransition(JournalError):
    """An operation was asked to move between two states its state machine does not join
    (see :data:`OP_TRANSITIONS`); nothing was written."""

    code = "illegal-transition"


OP_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "requested": frozenset(
        {
            "started",  # agent attempt starts / fork saves its intent (coordinator)
            "waiting",  # an ask opens its question (Journal.open_question)
            "committed",  # a marker (unroll/item/repeat_until) has no effect to settle;
            # a flow.approve the host policy denies is decided without waiting
            "not-started",  # refused by policy or budget; stop/cancel at a safe point
        }
    ),
    "waiting": frozenset(
        {
            "settled",  # the question was answered, the approval decided or expired
            "not-started",  # stop/cancel while it waits; a refused flow.approve(on_reject="fail")
        }
    ),
    "started": frozenset(
        {
            "settled",  # agent boundary materialized; lanes joined
            "failed",  # limit hit, or no finish_work after the last attempt
            "uncertain",  # gone without a result and may have reached outside; cancelled
            "requested",  # clean retry: the next attempt on a restored W
            # No production path commits a started operation without settling it; kept
            # because tests/unit/test_journal.py commits one directly.
            "committed",
        }
    ),
    "uncertain": frozenset(
        {
            "started",  # a person gave the result (cairn reconcile --result)
            "retry",  # a person decided it may be redone
        }
    ),
    "retry": frozenset(
        {
            "requested",  # the coordinator records the next attempt
            "not-started",  # stop/cancel before that
        }
    ),
    "settled": frozenset(
        {
            "committed",
            "settled",  # a join replayed after a crash between its settle and commit
        }
    ),
    "committed": frozenset(),
    "failed": frozenset(),
    "not-started": frozenset(),
}


def check_op_transition(op_id: str, current: str, new: str) -> None:
    """Raise :class:`IllegalTransition` unless ``current`` → ``new`` is in the table."""
    allowed = OP_TRANSITIONS.get(current, frozenset())
    if new not in allowed:
        targets = ", ".join(sorted(allowed)) or "nothing (it is final)"
        raise IllegalTransition(
            f"operation {op_id} cannot move from {current} to {new}",
            hint=f"from {current} it may move to {targets}",
        )


class Operations(Writes):
    def get_op(self, run_id: str, scope: str, seq: int) -> OpRow | None:
        row = self.db.execute(
            "SELECT * FROM operations WHERE run_id=? AND scope=? AND seq=?", (run_id, scope, seq)
        ).fetchone()
        return None if row is None else OpRow.from_row(row)

    def record_requested(
        self, call: CallRequest, *, run_id: str, op_id: str, predecessor: str | None, token: int
    ) -> OpRow:
        now = self.clock()
        with self.transaction() as db:
            self._fence(db, run_id, token)
            db.execute(
                "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
                " source_location, predecessor, state, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    call.scope,
                    call.seq,
                    op_id,
                    call.kind,
                    canonical_json(call.request),
                    call.request_hash(),
                    call.location,
                    predecessor,
                    "requested",
                    now,
                    now,
                ),
            )
            self._event(db, run_id, "op-requested", {"kind": call.kind}, call.scope, op_id)
        op = self.get_op(run_id, call.scope, call.seq)
        assert op is not None
        return op

    def update_op(
        self,
        run_id: str,
        op_id: str,
        *,
        token: int,
        state: OpState | None = None,
        finish: Mapping[str, JSONValue] | None = None,
        result: Mapping[str, object] | None = None,
        checkpoint: Mapping[str, JSONValue] | None = None,
        error: str | None = None,
        attempt: int | None = None,
        intents: Sequence[Intent] = (),
        event: str | None = None,
        event_data: Mapping[str, object] | None = None,
    ) -> None:
        """Move one operation forward (and queue intents) in a single fenced transaction.
        A move outside :data:`OP_TRANSITIONS` raises :class:`IllegalTransition`."""
        with self.transaction() as db:
            self._fence(db, run_id, token)
            row = db.execute(
                "SELECT scope, state FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
            ).fetchone()
            if row is None:
                raise NotFound(f"run {run_id} has no operation {op_id}")
            if state is not None:
                check_op_transition(op_id, row["state"], state)
            sets: list[str] = ["updated_at=?"]
            values: list[object] = [self.clock()]
            for column, value in (
                ("state", state),
                ("finish", dumps(finish)),
                ("result", dumps(result)),
                ("checkpoint", dumps(checkpoint)),
                ("error", error),
                ("attempt", attempt),
            ):
                if value is not None:
                    sets.append(f"{column}=?")
                    values.append(value)
            cur = db.execute(
                f"UPDATE operations SET {', '.join(sets)} WHERE run_id=? AND op_id=?",
                (*values, run_id, op_id),
            )
            if cur.rowcount != 1:
                raise NotFound(f"run {run_id} has no operation {op_id}")
            for intent in intents:
                self._insert_intent(db, intent)
            self._event(db, run_id, event or f"op-{state}", event_data or {}, row["scope"], op_id)

    def resolve_uncertain(
        self,
        run_id: str,
        op_id: str,
        *,
        decision: Literal["result", "retry"],
        actor_uid: int,
        finish: Mapping[str, JSONValue] | None = None,
    ) -> None:
        """A person's decision on an uncertain operation of a blocked run: settle it from
        the given result, or retry it. The run becomes ``pending`` for its coordinator."""
        with self.transaction() as db:
            run = db.execute("SELECT state FROM runs WHERE run_id=?", (run_id,)).fetchone()
            op = db.execute(
                "SELECT state FROM operations WHERE run_id=? AND op_id=?", (run_id, op_id)
            ).fetchone()
            if run is None or op is None:
                raise NotFound(f"run {run_id} has no operation {op_id}")
            if run["state"] != "blocked" or op["state"] != "uncertain":
                raise UsageError(
                    f"{op_id} of {run_id} is {op['state']} (run {run['state']}); only an "
                    "uncertain operation of a blocked run takes a decision"
                )
            state = "started" if decision == "result" else "retry"
            check_op_transition(op_id, op["state"], state)
            db.execute(
                "UPDATE operations SET state=?, finish=?, updated_at=? WHERE run_id=? AND op_id=?",
                (state, dumps(finish), self.clock(), run_id, op_id),
            )
            db.execute(
                "UPDATE runs SET state='pending', error=NULL, updated_at=? WHERE run_id=?",
                (self.clock(), run_id),
            )
            self._event(db, run_id, f"op-{decision}-decided", {"actor_uid": actor_uid}, None, op_id)

    def record_model_tokens(
        self, run_id: str, op_id: str, attempt: int, tokens: int, *,
        cost_micros: int = 0, day: str = "",
    ) -> None:
        """Add one model call's ``tokens`` and cost to what attempt ``attempt`` of ``op_id``
        spent, and the cost to what the run's owner spent on ``day`` (local, YYYY-MM-DD).
        Not fenced: tokens spent are spent, whoever holds the run's lease now."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO model_usage"
                " (run_id, op_id, attempt, tokens, calls, cost_micros, updated_at)"
                " VALUES (?,?,?,?,1,?,?) ON CONFLICT (run_id, op_id, attempt) DO UPDATE SET"
                " tokens = tokens + excluded.tokens, calls = calls + 1,"
                " cost_micros = cost_micros + excluded.cost_micros,"
                " updated_at = excluded.updated_at",
                (run_id, op_id, attempt, tokens, cost_micros, self.clock()),
            )
            if cost_micros:
                db.execute(
                    "INSERT INTO model_cost_days (owner_uid, day, cost_micros)"
                    " SELECT owner_uid, ?, ? FROM runs WHERE run_id=?"
                    " ON CONFLICT (owner_uid, day) DO UPDATE SET"
                    " cost_micros = cost_micros + excluded.cost_micros",
                    (day, cost_micros, run_id),
                )

    def model_tokens_spent(self, run_id: str) -> dict[tuple[str, int], int]:
        """Model tokens recorded per (operation, attempt) of the run."""
        rows = self.db.execute(
            "SELECT op_id, attempt, tokens FROM model_usage WHERE run_id=?", (run_id,)
        ).fetchall()
        return {(r["op_id"], int(r["attempt"])): int(r["tokens"]) for r in rows}

    def model_spend(self, run_id: str) -> ModelSpend:
        """The run's model calls, tokens and cost (micro-units) over every attempt."""
        row = self.db.execute(
            "SELECT coalesce(sum(calls), 0) AS calls,"
            " coalesce(sum(tokens), 0) AS tokens, coalesce(sum(cost_micros), 0) AS cost"
            " FROM model_usage WHERE run_id=?", (run_id,)
        ).fetchone()
        return ModelSpend(int(row["calls"]), int(row["tokens"]), int(row["cost"]))

    def owner_cost_on(self, owner_uid: int, day: str) -> int:
        """What ``owner_uid``'s runs spent on model calls on ``day`` (micro-units)."""
        row = self.db.execute(
            "SELECT cost_micros FROM model_cost_days WHERE owner_uid=? AND day=?",
            (owner_uid, day),
        ).fetchone()
        return 0 if row is None else int(row["cost_micros"])
