"""People in the loop: questions, approval requests and durable control requests.

A coordinator writes with its lease token; cairnd's decisions are plain transactions
whose conditional updates make exactly one of concurrent deciders win. "wake" in a
result means the run went from waiting to pending and needs its coordinator started.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, JsonValue

from cairn.canonical import canonical_json
from cairn.errors import CairnError, NotFound, UsageError
from cairn.journal.rows import (
    TERMINAL_RUN_STATES,
    ControlAction,
    JSONColumn,
    RunRow,
    RunState,
    loads,
)
from cairn.journal.runs import RunEnded
from cairn.journal.writes import Writes
from cairn.protocol.jsonvalue import JSONObject, JSONValue


class AlreadyAnswered(CairnError):
    """A question or approval request was decided before, differently or by someone else."""

    code = "already-answered"


class StaleRequest(CairnError):
    """A challenge or fingerprint that does not name what the run waits for now."""

    code = "stale"


_Row = TypeVar("_Row", "QuestionRow", "ApprovalRow")


class People(Writes):
    def open_question(
        self,
        run_id: str,
        op_id: str,
        *,
        token: int,
        challenge: str,
        question: str,
        schema_name: str | None,
        schema: Mapping[str, JSONValue],
    ) -> QuestionRow:
        """Record the question an ``ask`` operation waits on (once) and mark it waiting."""
        with self.transaction() as db:
            self._fence(db, run_id, token)
            cur = db.execute(
                "INSERT OR IGNORE INTO interactions (run_id, op_id, challenge, question,"
                " schema_name, schema, state, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    op_id,
                    challenge,
                    question,
                    schema_name,
                    canonical_json(schema),
                    "waiting",
                    self.clock(),
                ),
            )
            if cur.rowcount:
                db.execute(
                    "UPDATE operations SET state='waiting', updated_at=? WHERE run_id=? AND op_id=?"
                    " AND state='requested'",
                    (self.clock(), run_id, op_id),
                )
                self._event(db, run_id, "question-asked", {"challenge": challenge}, None, op_id)
        found = self.question(run_id, op_id)
        assert found is not None
        return found

    def question(self, run_id: str, op_id: str) -> QuestionRow | None:
        found = self._select(
            QuestionRow, "SELECT * FROM interactions WHERE run_id=? AND op_id=?", (run_id, op_id)
        )
        return found[0] if found else None

    def questions(self, run_id: str) -> list[QuestionRow]:
        return self._select(
            QuestionRow, "SELECT * FROM interactions WHERE run_id=? ORDER BY created_at", (run_id,)
        )

    def answer_question(
        self, run_id: str, *, challenge: str, answer: JSONValue, actor_uid: int
    ) -> tuple[Literal["answered", "duplicate"], bool]:
        """Bind a validated answer to the waiting question named by ``challenge``.

        The same answer again is a harmless duplicate; another answer to an answered
        question is :class:`AlreadyAnswered`; a challenge that names no waiting question
        of the run is :class:`StaleRequest`."""
        with self.transaction() as db:
            run = self._people_run(db, run_id)
            row = db.execute(
                "SELECT * FROM interactions WHERE run_id=? AND challenge=?", (run_id, challenge)
            ).fetchone()
            current = db.execute(
                "SELECT challenge FROM interactions WHERE run_id=? AND state='waiting'",
                (run_id,),
            ).fetchone()
            if row is None:
                now = f"; the current one is {current['challenge']}" if current else ""
                raise StaleRequest(
                    f"challenge {challenge} names no question of {run_id}{now}",
                    hint=f"see 'cairn inbox' or 'cairn show {run_id}'",
                )
            if row["state"] == "answered":
                if canonical_json(answer) == row["answer"]:
                    return "duplicate", False
                raise AlreadyAnswered(
                    f"{row['op_id']} of {run_id} is already answered",
                    hint=f"see the answer in 'cairn show {run_id}'",
                )
            if row["state"] != "waiting" or run["state"] in TERMINAL_RUN_STATES:
                raise RunEnded(f"{run_id} is {run['state']}; the question is {row['state']}")
            db.execute(
                "UPDATE interactions SET state='answered', answer=?, actor_uid=?, decided_at=?"
                " WHERE run_id=? AND op_id=? AND state='waiting'",
                (canonical_json(answer), actor_uid, self.clock(), run_id, row["op_id"]),
            )
            self._event(
                db, run_id, "question-answered", {"actor_uid": actor_uid}, None, row["op_id"]
            )
            return "answered", self._wake(db, run_id, run["state"])

    def open_approval(
        self,
        run_id: str,
        *,
        token: int,
        request_id: str,
        op_id: str,
        attempt: int,
        prepared: Mapping[str, object],
        fingerprint: str,
        evaluation: Mapping[str, JSONValue],
        deadline: float,
        waiting: bool = False,
    ) -> ApprovalRow:
        """Record an approval request for one prepared operation (once); ``waiting``: the
        operation itself waits on it (``flow.approve``) and is marked so."""
        with self.transaction() as db:
            self._fence(db, run_id, token)
            cur = db.execute(
                "INSERT OR IGNORE INTO approvals (run_id, request_id, op_id, attempt, prepared,"
                " fingerprint, evaluation, deadline, state, created_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    request_id,
                    op_id,
                    attempt,
                    canonical_json(prepared),
                    fingerprint,
                    canonical_json(evaluation),
                    deadline,
                    "waiting",
                    self.clock(),
                ),
            )
            if cur.rowcount and waiting:
                db.execute(
                    "UPDATE operations SET state='waiting', updated_at=? WHERE run_id=? AND op_id=?"
                    " AND state='requested'",
                    (self.clock(), run_id, op_id),
                )
            if cur.rowcount:
                self._event(
                    db,
                    run_id,
                    "approval-requested",
                    {"request_id": request_id, "fingerprint": fingerprint},
                    None,
                    op_id,
                )
        found = self.approval(run_id, request_id)
        assert found is not None
        return found

    def approval(self, run_id: str, request_id: str) -> ApprovalRow | None:
        found = self._select(
            ApprovalRow,
            "SELECT * FROM approvals WHERE run_id=? AND request_id=?",
            (run_id, request_id),
        )
        return found[0] if found else None

    def approvals(self, run_id: str) -> list[ApprovalRow]:
        return self._select(
            ApprovalRow, "SELECT * FROM approvals WHERE run_id=? ORDER BY created_at", (run_id,)
        )

    def _select(self, model: type[_Row], sql: str, args: tuple[str, ...]) -> list[_Row]:
        """The rows ``sql`` selects (``SELECT *`` from ``model``'s table) as ``model``."""
        return [model.from_row(r) for r in self.db.execute(sql, args).fetchall()]

    def decide_approval(
        self,
        run_id: str,
        request_id: str,
        *,
        decision: Literal["approved", "rejected"],
        actor_uid: int,
        fingerprint: str | None,
        reason: str = "",
        now: float | None = None,
    ) -> tuple[Literal["approved", "rejected", "expired"], bool]:
        """Decide a waiting approval request; exactly one concurrent decider wins, the
        others get :class:`AlreadyAnswered`. A decision after the deadline expires the
        request instead (committed) and returns ``expired``, as does any decision on a
        request that expired before it."""
        now = self.clock() if now is None else now
        with self.transaction() as db:
            run = self._people_run(db, run_id)
            row = db.execute(
                "SELECT * FROM approvals WHERE run_id=? AND request_id=?", (run_id, request_id)
            ).fetchone()
            if row is None:
                raise NotFound(
                    f"{run_id} has no approval request {request_id}", hint="see 'cairn inbox'"
                )
            if row["state"] == "expired":
                return "expired", False  # by an earlier decision or cairnd's deadline timer
            if row["state"] != "waiting":
                raise AlreadyAnswered(
                    f"approval request {request_id} of {run_id} is already answered "
                    f"({row['state']})"
                )
            if fingerprint is not None and fingerprint != row["fingerprint"]:
                raise StaleRequest(
                    f"fingerprint {fingerprint} is not the one of request {request_id} "
                    f"({row['fingerprint']})",
                    hint="look at the request again with 'cairn inbox' before deciding",
                )
            if run["state"] in TERMINAL_RUN_STATES:
                raise RunEnded(f"{run_id} is {run['state']}; nothing waits for a decision")
            state: Literal["approved", "rejected", "expired"] = decision
            if now > row["deadline"]:
                state = "expired"
            db.execute(
                "UPDATE approvals SET state=?, actor_uid=?, reason=?, decided_at=?"
                " WHERE run_id=? AND request_id=? AND state='waiting'",
                (state, actor_uid, reason or None, now, run_id, request_id),
            )
            self._event(
                db,
                run_id,
                f"approval-{state}",
                {"request_id": request_id, "actor_uid": actor_uid, "reason": reason},
                None,
                row["op_id"],
            )
            return state, self._wake(db, run_id, run["state"])

    def expire_overdue_approvals(self, now: float, *, run_id: str | None = None) -> list[str]:
        """Expire every waiting approval request whose deadline passed (of ``run_id``
        only, when given) and wake the runs that waited for them; the IDs of the runs
        woken. One transaction: a person's decision racing it either wins or gets
        :class:`AlreadyAnswered`."""
        only = "" if run_id is None else " AND a.run_id=?"
        args: tuple[float | str, ...] = (now,) if run_id is None else (now, run_id)
        woken: list[str] = []
        with self.transaction() as db:
            rows = db.execute(
                "SELECT a.run_id, a.request_id, a.op_id, r.state AS run_state FROM approvals a"
                " JOIN runs r USING (run_id) WHERE a.state='waiting' AND a.deadline<?"
                f"{only} ORDER BY a.deadline",
                args,
            ).fetchall()
            states = {r["run_id"]: r["run_state"] for r in rows}
            for row in rows:
                if row["run_state"] in TERMINAL_RUN_STATES:
                    continue
                db.execute(
                    "UPDATE approvals SET state='expired', decided_at=? WHERE run_id=? AND"
                    " request_id=? AND state='waiting'",
                    (now, row["run_id"], row["request_id"]),
                )
                self._event(
                    db, row["run_id"], "approval-expired",
                    {"request_id": row["request_id"], "by": "deadline"}, None, row["op_id"],
                )
            for waiting_run, state in states.items():
                if state not in TERMINAL_RUN_STATES and self._wake(db, waiting_run, state):
                    woken.append(waiting_run)
        return woken

    def next_approval_deadline(self) -> float | None:
        """The earliest deadline of a waiting approval request of a run not ended."""
        row = self.db.execute(
            "SELECT min(a.deadline) FROM approvals a JOIN runs r USING (run_id)"
            " WHERE a.state='waiting' AND r.state NOT IN (?,?,?,?)",
            tuple(TERMINAL_RUN_STATES),
        ).fetchone()
        return None if row[0] is None else float(row[0])

    def request_control(
        self, run_id: str, action: ControlAction, *, actor_uid: int
    ) -> tuple[str, bool]:
        """Record pause/resume/stop/cancel. A run a coordinator holds (see
        :meth:`_held`) gets a durable row its coordinator honours at its next safe point;
        a run no process holds (waiting, paused, blocked, or pending and never taken)
        changes at once. Returns (what happened, wake)."""
        with self.transaction() as db:
            run = self._people_run(db, run_id)
            state = run["state"]
            if state in TERMINAL_RUN_STATES:
                raise RunEnded(
                    f"{run_id} already {state}" + (f": {run['error']}" if run["error"] else ""),
                    hint=f"see 'cairn show {run_id}'",
                )
            active = self._held(db, run_id, state)
            pending = {
                r["action"]
                for r in db.execute(
                    "SELECT action FROM control_requests WHERE run_id=? AND state='pending'",
                    (run_id,),
                )
            }
            now = self.clock()
            if action == "resume":
                if state == "paused":
                    self._insert_control(db, run_id, action, actor_uid, "done")
                    return "resumed", self._wake(db, run_id, state, also=("paused",))
                if active and "pause" in pending:
                    db.execute(
                        "UPDATE control_requests SET state='withdrawn', done_at=? WHERE"
                        " run_id=? AND action='pause' AND state='pending'",
                        (now, run_id),
                    )
                    self._insert_control(db, run_id, action, actor_uid, "done")
                    return "pause withdrawn", False
                raise UsageError(f"{run_id} is {state}, not paused")
            if action == "pause" and state == "paused":
                return "already paused", False
            if action == "pause" and state == "queued":
                raise UsageError(
                    f"{run_id} is queued for a slot and has not started; there is nothing to "
                    "pause",
                    hint=f"cancel it with 'cairn cancel {run_id}' if it should not run",
                )
            if active:
                if action in pending:
                    return f"{action} already requested", False
                self._insert_control(db, run_id, action, actor_uid, "pending")
                return f"{action} requested", False
            self._insert_control(db, run_id, action, actor_uid, "done")
            self._apply_control(db, run_id, action)
            return {"pause": "paused", "stop": "stopped", "cancel": "cancelled"}[action], False

    def pending_controls(self, run_id: str) -> list[str]:
        """Actions requested of an active run and not yet honoured, oldest first."""
        rows = self.db.execute(
            "SELECT action FROM control_requests WHERE run_id=? AND state='pending' ORDER BY id",
            (run_id,),
        ).fetchall()
        return [r["action"] for r in rows]

    def honour_control(self, run_id: str, action: ControlAction, *, token: int) -> None:
        """The coordinator acts on a pending control request at a safe point."""
        with self.transaction() as db:
            self._fence(db, run_id, token)
            self._apply_control(db, run_id, action)

    def suspend_run(self, run_id: str, *, token: int) -> RunState | None:
        """The coordinator is about to exit because the run waits for a person. The run
        becomes ``waiting`` — unless a pending control request applies instead, or what it
        waits for was decided meanwhile (None: go on at once)."""
        with self.transaction() as db:
            self._fence(db, run_id, token)
            for action in self.pending_controls(run_id):
                if action in ("pause", "stop", "cancel"):
                    self._apply_control(db, run_id, action)
                    return {"pause": "paused", "stop": "stopped", "cancel": "cancelled"}[action]  # type: ignore[return-value]
            waiting = db.execute(
                "SELECT (SELECT count(*) FROM interactions WHERE run_id=? AND state='waiting')"
                " + (SELECT count(*) FROM approvals WHERE run_id=? AND state='waiting')",
                (run_id, run_id),
            ).fetchone()[0]
            if not waiting:
                return None
            db.execute(
                "UPDATE runs SET state='waiting', updated_at=? WHERE run_id=?",
                (self.clock(), run_id),
            )
            self._event(db, run_id, "run-waiting", {})
            return "waiting"

    def waiting_for_people(self, owner_uid: int | None) -> list[dict[str, Any]]:
        """Open questions and approval requests of the owner's runs (all when None)."""
        owner = "" if owner_uid is None else " AND r.owner_uid=?"
        args: tuple[int, ...] = () if owner_uid is None else (owner_uid,)
        items: list[JSONObject] = []
        for row in self.db.execute(
            "SELECT i.*, r.state AS run_state, r.definition FROM interactions i JOIN runs r"
            f" USING (run_id) WHERE i.state='waiting'{owner} ORDER BY i.created_at",
            args,
        ):
            items.append(
                {
                    "kind": "question",
                    "run_state": row["run_state"],
                    "definition": row["definition"],
                    **QuestionRow.from_row(row).model_dump(),
                }
            )
        for row in self.db.execute(
            "SELECT a.*, r.state AS run_state, r.definition FROM approvals a JOIN runs r"
            f" USING (run_id) WHERE a.state='waiting'{owner} ORDER BY a.created_at",
            args,
        ):
            items.append(
                {
                    "kind": "approval",
                    "run_state": row["run_state"],
                    "definition": row["definition"],
                    **ApprovalRow.from_row(row).model_dump(),
                }
            )
        return items

    def blocked_runs(self, owner_uid: int | None) -> list[RunRow]:
        """The owner's ``blocked`` runs (everyone's when None), oldest change first."""
        owner = "" if owner_uid is None else " AND owner_uid=?"
        args: tuple[int, ...] = () if owner_uid is None else (owner_uid,)
        rows = self.db.execute(
            f"SELECT * FROM runs WHERE state='blocked'{owner} ORDER BY updated_at", args
        ).fetchall()
        return [RunRow.from_row(r) for r in rows]

    def _held(self, db: sqlite3.Connection, run_id: str, state: str) -> bool:
        """Whether a coordinator holds the run or acts for it, so that a control request
        must wait for its next safe point: a ``running`` run, or a ``pending`` one whose
        lease is held or that has an operation under way. A ``pending`` run without
        either (its launch or wake-up has not reached a coordinator) is held by nobody: a
        coordinator that starts later finds it ended and refuses to take its lease."""
        if state != "pending":
            return state == "running"
        lease = db.execute(
            "SELECT lease_holder, lease_expires FROM runs WHERE run_id=?", (run_id,)
        ).fetchone()
        if lease["lease_holder"] and lease["lease_expires"] > self.clock():
            return True
        under_way = db.execute(
            "SELECT 1 FROM operations WHERE run_id=? AND state IN ('started', 'uncertain')"
            " LIMIT 1",
            (run_id,),
        ).fetchone()
        return under_way is not None

    @staticmethod
    def _people_run(db: sqlite3.Connection, run_id: str) -> sqlite3.Row:
        run = db.execute("SELECT state, error FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if run is None:
            raise NotFound(f"no run {run_id}")
        return run  # type: ignore[no-any-return]

    def _wake(
        self, db: sqlite3.Connection, run_id: str, state: str, also: tuple[str, ...] = ()
    ) -> bool:
        if state not in ("waiting", *also):
            return False
        db.execute(
            "UPDATE runs SET state='pending', error=NULL, updated_at=? WHERE run_id=?",
            (self.clock(), run_id),
        )
        self._event(db, run_id, "run-woken", {"from": state})
        return True

    def _insert_control(
        self, db: sqlite3.Connection, run_id: str, action: str, actor_uid: int, state: str
    ) -> None:
        now = self.clock()
        db.execute(
            "INSERT INTO control_requests (run_id, action, state, actor_uid, created_at,"
            " done_at) VALUES (?,?,?,?,?,?)",
            (run_id, action, state, actor_uid, now, now if state == "done" else None),
        )
        self._event(db, run_id, f"{action}-requested", {"actor_uid": actor_uid})

    def _apply_control(self, db: sqlite3.Connection, run_id: str, action: str) -> None:
        """Pause, stop or cancel a run that nothing is running for (a safe point)."""
        now = self.clock()
        db.execute(
            "UPDATE control_requests SET state='done', done_at=? WHERE run_id=? AND"
            " state='pending' AND (action=? OR ?<>'pause')",
            (now, run_id, action, action),
        )
        target = {"pause": "paused", "stop": "stopped", "cancel": "cancelled"}[action]
        if action != "pause":
            for table in ("interactions", "approvals"):
                db.execute(
                    f"UPDATE {table} SET state='cancelled', decided_at=? WHERE run_id=? AND"
                    " state='waiting'",
                    (now, run_id),
                )
            db.execute(
                "UPDATE operations SET state='not-started', updated_at=? WHERE run_id=? AND"
                " state IN ('requested', 'waiting', 'retry')",
                (now, run_id),
            )
        db.execute("UPDATE runs SET state=?, updated_at=? WHERE run_id=?", (target, now, run_id))
        self._event(db, run_id, f"run-{target}", {"by": action})


# --- rows of the people-in-the-loop tables ---------------------------------------------


class QuestionRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    run_id: str
    op_id: str
    challenge: str
    question: str
    schema_name: str | None
    json_schema: dict[str, object]
    state: Literal["waiting", "answered", "cancelled"]
    answer: JsonValue  # pydantic's JSON type: the project's alias is not one it evaluates
    actor_uid: int | None
    created_at: float
    decided_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> QuestionRow:
        data = {k: row[k] for k in row.keys() if k in cls.model_fields or k == "schema"}  # noqa: SIM118  (a Row iterates values)
        data["json_schema"] = json.loads(data.pop("schema"))
        data["answer"] = loads(data["answer"])
        return cls.model_validate(data)


class ApprovalRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    run_id: str
    request_id: str
    op_id: str
    attempt: int
    prepared: JSONColumn
    fingerprint: str
    evaluation: dict[str, Any]
    deadline: float
    state: Literal["waiting", "approved", "rejected", "expired", "cancelled"]
    actor_uid: int | None
    reason: str | None
    created_at: float
    decided_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> ApprovalRow:
        data = {k: row[k] for k in row.keys() if k in cls.model_fields}  # noqa: SIM118
        data["prepared"] = json.loads(data["prepared"])
        data["evaluation"] = json.loads(data["evaluation"])
        return cls.model_validate(data)
