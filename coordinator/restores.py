"""The coordinator's side of ``flow.restore``: W of a scope put back to one of its earlier
agent boundaries, as a new W generation.

The decision (which checkpoint, which generation) is taken from the journal alone and
saved with its ``create-w``/``drop-w`` intents and its result in the move to
``started``, before the broker makes the new W, so a crash replays the same restore (the
broker's receipts are idempotent by intent ID). It is the same restore a rejected
experiment makes (:mod:`cairn.coordinator.experiments`), chosen by the workflow.
"""

from __future__ import annotations

from cairn.coordinator.base import OperationError
from cairn.coordinator.context import RunContext, WGenerations
from cairn.errors import NotFound
from cairn.journal.rows import OpRow
from cairn.operations import restore
from cairn.protocol.broker import Intent
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONObject, json_int


class RestoreRefused(OperationError):
    """``flow.restore`` named no committed agent boundary of its scope from before the
    call; W is unchanged."""

    code = "restore-refused"


class Restores:
    """Put a scope's W back to an earlier boundary of its own."""

    def __init__(self, run: RunContext, w: WGenerations) -> None:
        self.run = run
        self.w = w

    def restore(self, op: OpRow, call: CallRequest) -> JSONObject:
        if op.state == "requested":
            decided = self.decide_restore(op, call)
            self.run.update_op(op.op_id, state="started", result=decided,
                intents=self.restore_intents(op, decided),
            )
            self.run.failpoint("restore-after-decision")
            op = self.run.op(op.op_id)
        if op.state == "settled" and op.result is not None:
            # a coordinator died between settling the restore and committing it
            self.run.update_op(op.op_id, state="committed")
            return op.result
        if op.state != "started" or op.result is None:
            raise RestoreRefused(f"{op.op_id} did not complete: {op.error}")
        result = dict(op.result)
        self.run.broker("storage-v1", self.restore_intents(op, result))  # saved: a no-op add
        self.w.move(op.scope, json_int(result["w_generation"]))
        self.run.failpoint("restore-after-storage")
        self.run.update_op(op.op_id, state="settled",
                               result=result)
        self.run.update_op(op.op_id, state="committed")
        self.run.event("restored", op_id=op.op_id, boundary=result["boundary"])
        return result

    def decide_restore(self, op: OpRow, call: CallRequest) -> JSONObject:
        """The boundary (checked against the journal, never the workflow's word) and W's
        next generation; a refusal is recorded and raised."""
        why = self.restore_problem(op, call)
        if why is not None:
            self.run.update_op(op.op_id, state="not-started", error=why,
                result={"error": why, "kind": RestoreRefused.code},
            )
            raise RestoreRefused(f"{op.op_id}: {why}")
        return {"boundary": call.request["boundary"], "w_generation": self.w[op.scope] + 1}

    def restore_problem(self, op: OpRow, call: CallRequest) -> str | None:
        """Why W of ``op``'s scope may not go back to the boundary the call names (None:
        it may): the request is not what ``flow.restore`` sends, or the boundary is no
        committed agent boundary of the scope from before the call."""
        boundary = call.request.get("boundary")
        try:
            if call.request != restore.request(boundary):
                return "not a request of flow.restore: it holds keys flow.restore never sends"
        except ValueError as exc:
            return f"not a request of flow.restore: {exc}"
        try:
            found = self.run.op(str(boundary))
        except NotFound:
            return f"{boundary} is not an operation of this run"
        if found.kind != "agent" or found.state != "committed":
            return f"{boundary} is not a committed agent boundary"
        if found.scope != op.scope or found.seq >= op.seq:
            return f"{boundary} is not an earlier boundary of scope {op.scope}"
        return None

    def restore_intents(self, op: OpRow, result: JSONObject) -> list[Intent]:
        scope, generation = op.scope, json_int(result["w_generation"])
        return [
            self.run.intent("create-w", f"create-w.{scope}.{generation}", scope=scope,
                        generation=generation, from_checkpoint=result["boundary"]),
            self.run.intent("drop-w", f"drop-w.{scope}.{generation - 1}", scope=scope,
                        generation=generation - 1),
        ]
