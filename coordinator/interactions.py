"""The coordinator's side of people in the loop (ARCHITECTURE §10).

- ``flow.ask``: the question is committed as a waiting interaction with a challenge; the
  coordinator exits and the run is ``waiting`` until an answer bound to that challenge
  arrives, then the operation settles with the answer.
- Capability policy: before an agent is dispatched its capabilities are evaluated against
  the current host policy; ``require_approval`` stores the exact prepared operation and
  its fingerprint and the run waits; dispatch needs an approval of that same fingerprint.
- ``flow.approve``: an approval request the workflow itself opens, with an optional
  expiry; the decision (approved, rejected, expired, denied by policy) settles the
  operation and reaches the workflow as a value, unless it asked to fail on a refusal.
- Control requests (pause, stop, cancel) are honoured at safe points: whenever the
  control worker makes its next call, no effect of this coordinator is in flight.

The hooks in the coordinator call :func:`at_safe_point` and :func:`ask` (replay),
:func:`authorize` (the agent operation) and :func:`suspend` (:mod:`cairn.coordinator.core`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from cairn.canonical import canonical_json, sha256_hex
from cairn.coordinator.base import Nondeterminism, OperationError
from cairn.errors import CairnError
from cairn.journal.people import ApprovalRow
from cairn.journal.rows import OpRow
from cairn.operations.approve import ApproveCall, Decision
from cairn.policy import (
    agent_capabilities,
    evaluate,
    fingerprint,
    load_policy,
    prepare_agent_operation,
)
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONObject, JSONValue

if TYPE_CHECKING:
    from cairn.coordinator.context import RunContext

EXIT_RESTART = 75  # same meaning as in core: systemd starts the coordinator again

SuspendedState = Literal["waiting", "paused", "stopped", "cancelled"]
CONTROL_STATE: dict[str, SuspendedState] = {
    "pause": "paused",
    "stop": "stopped",
    "cancel": "cancelled",
}


class RunSuspended(CairnError):
    """The coordinator exits before the run is finished: the run waits for a person, or
    a control request pauses, stops or cancels it. No process is held meanwhile."""

    code = "suspended"

    def __init__(self, message: str, *, state: SuspendedState) -> None:
        super().__init__(message)
        self.state = state


class OperationRefused(OperationError):
    """Policy or a person refused an operation; it did not run. The workflow sees
    ``OperationFailed`` (and fails unless it handles it)."""

    code = "refused"


def at_safe_point(run: RunContext) -> None:
    """Honour the oldest pending pause/stop/cancel request (called before each call is
    answered: nothing this coordinator started is in flight then)."""
    for action in run.journal.pending_controls(run.run_id):
        if action in CONTROL_STATE:
            raise RunSuspended(f"{action} requested", state=CONTROL_STATE[action])


def suspend(run: RunContext, exc: RunSuspended) -> int:
    """Record why the coordinator exits; return its exit status."""
    if exc.state == "waiting":
        state = run.journal.suspend_run(run.run_id, token=run.token)
        if state is None:  # decided while we were on our way out: go on at once
            run.event("decided-meanwhile")
            return EXIT_RESTART
        run.event(f"run-{state}", reason=exc.message)
        return 0
    action = {v: k for k, v in CONTROL_STATE.items()}[exc.state]
    run.journal.honour_control(run.run_id, action, token=run.token)  # type: ignore[arg-type]
    run.event(f"run-{exc.state}")
    return 0


# --- flow.ask -----------------------------------------------------------------------


def challenge_of(run_id: str, op: OpRow, question: str, schema: Mapping[str, JSONValue]) -> str:
    """Fingerprint of the question, its answer schema and the run transition it guards
    (the operation, its request and its predecessor)."""
    document = {
        "run_id": run_id,
        "op_id": op.op_id,
        "predecessor": op.predecessor,
        "request_hash": op.request_hash,
        "question": question,
        "schema": schema,
    }
    return "sha256:" + sha256_hex(canonical_json(document))


def answer_schema(run: RunContext, call: CallRequest) -> tuple[str | None, JSONObject]:
    """The answer model named by the call, which must be the one the review listed."""
    site = run.check_manifest(call)
    name = call.request.get("schema")
    if name != site.get("answer_schema"):
        raise Nondeterminism(
            f"flow.ask at {call.location} names schema {name!r}, the review listed "
            f"{site.get('answer_schema')!r}"
        )
    if name is None:
        return None, {"type": "string", "minLength": 1}
    return name, run.models[name].model_json_schema()


def ask(run: RunContext, op: OpRow, call: CallRequest) -> JSONObject:
    """Drive an ``ask`` operation: open its question once, and settle it when answered."""
    if op.state == "settled":
        assert op.result is not None
        run.update_op(op.op_id, state="committed")
        return op.result
    question = run.journal.question(run.run_id, op.op_id)
    if question is None:
        text = str(call.request.get("question", ""))
        name, schema = answer_schema(run, call)
        decision = evaluate(load_policy(), ["human"], run.desc)
        if decision.decision == "deny":
            raise OperationRefused(f"host policy denies questions to people ({op.op_id})")
        question = run.journal.open_question(
            run.run_id,
            op.op_id,
            token=run.token,
            challenge=challenge_of(run.run_id, op, text, schema),
            question=text,
            schema_name=name,
            schema=schema,
        )
        run.event("question-asked", op_id=op.op_id, challenge=question.challenge)
    if question.state != "answered":
        raise RunSuspended(f"{op.op_id} waits for an answer", state="waiting")
    result: JSONObject = {
        "answer": question.answer, "actor_uid": question.actor_uid, "op_id": op.op_id
    }
    run.update_op(op.op_id, state="settled", result=result
    )
    run.update_op(op.op_id, state="committed")
    run.event("answer-committed", op_id=op.op_id, actor_uid=question.actor_uid)
    return result


# --- flow.approve -------------------------------------------------------------------


def approve(run: RunContext, op: OpRow, call: CallRequest) -> JSONObject:
    """Drive an ``approve`` operation: open its approval request once, and settle it with
    the decision — a person's, the host policy's denial, or the expiry at the deadline
    (cairnd's timer expires it even when the coordinator is not running). The decision is
    journalled once (the approval row) and the settled result is what replay returns."""
    if op.state == "settled":
        assert op.result is not None
        run.update_op(op.op_id, state="committed")
        return op.result
    if op.state == "not-started":  # decided before with on_reject="fail"
        raise OperationRefused(f"{op.op_id} was not approved: {op.error}")
    wanted = ApproveCall.model_validate(call.request)
    request_id = approval_request_id(op.op_id)
    existing = run.journal.approval(run.run_id, request_id)
    if existing is None:
        evaluation = evaluate(load_policy(), ["human"], run.desc)
        if evaluation.decision == "deny":
            reason = "host policy denies approvals from people (capability human)"
            return decided(run, op, wanted, Decision(
                approved=False, outcome="denied", reason=reason,
                request_id=request_id, op_id=op.op_id))
        prepared = {
            "kind": "approve",
            "run_id": run.run_id,
            "op_id": op.op_id,
            **wanted.model_dump(mode="json"),
        }
        seconds = wanted.expires_in or load_policy().approval_deadline_sec
        existing = run.journal.open_approval(
            run.run_id,
            token=run.token,
            request_id=request_id,
            op_id=op.op_id,
            attempt=op.attempt,
            prepared=prepared,
            fingerprint=fingerprint(prepared),
            evaluation=evaluation.model_dump(mode="json"),
            deadline=time.time() + seconds,
            waiting=True,
        )
        run.event("approval-requested", op_id=op.op_id, request_id=request_id,
                    fingerprint=existing.fingerprint)
    if existing.state == "waiting" and run.journal.expire_overdue_approvals(
        time.time(), run_id=run.run_id
    ):  # cairnd's timer had not come round yet
        existing = run.journal.approval(run.run_id, request_id) or existing
    if existing.state == "waiting":
        raise RunSuspended(f"{op.op_id} waits for approval {request_id}", state="waiting")
    return decided(run, op, wanted, decision_of(existing, wanted))


def decision_of(row: ApprovalRow, wanted: ApproveCall) -> Decision:
    """The workflow's view of a decided approval request."""
    if row.state == "expired":
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.deadline))
        return Decision(
            approved=wanted.on_expiry == "approve",
            outcome="expired",
            reason=f"no decision before the deadline ({when}); on_expiry={wanted.on_expiry}",
            request_id=row.request_id,
            op_id=row.op_id,
        )
    return Decision(
        approved=row.state == "approved",
        outcome="approved" if row.state == "approved" else "rejected",
        reason=row.reason,
        actor_uid=row.actor_uid,
        request_id=row.request_id,
        op_id=row.op_id,
    )


def decided(
    run: RunContext, op: OpRow, wanted: ApproveCall, decision: Decision
) -> JSONObject:
    """Settle and commit the operation with ``decision`` — or, when it is not an approval
    and the workflow asked for ``on_reject="fail"``, record it not started and fail it."""
    if not decision.approved and wanted.on_reject == "fail":
        refuse(run, op, f"{decision.outcome}: {decision.reason or 'no reason given'}")
    result = decision.model_dump(mode="json")
    if run.op(op.op_id).state == "requested":  # nothing waited
        run.update_op(op.op_id, state="committed", result=result
        )
    else:
        run.update_op(op.op_id, state="settled", result=result
        )
        run.update_op(op.op_id, state="committed")
    run.event(f"approve-{decision.outcome}", op_id=op.op_id, request_id=decision.request_id)
    return result


# --- capability policy before dispatch -------------------------------------------------


def approval_request_id(op_id: str) -> str:
    return f"{op_id}-approval"


def authorize(
    run: RunContext, op: OpRow, call: CallRequest, agent: Mapping[str, object]
) -> None:
    """Evaluate the current host policy for an agent about to be dispatched. Returns when
    it may start; otherwise the run waits for an approval or fails with the refusal."""
    capabilities = agent_capabilities(agent)
    evaluation = evaluate(load_policy(), capabilities, run.desc)
    request_id = approval_request_id(op.op_id)
    existing = run.journal.approval(run.run_id, request_id)
    if evaluation.decision == "deny":
        refuse(run, op, f"host policy denies {', '.join(evaluation.because('deny'))}")
    if existing is None and evaluation.decision == "allow":
        return
    prepared = prepare_agent_operation(run.desc, op.op_id, call.request)
    if existing is None:
        policy_deadline = load_policy().approval_deadline_sec
        existing = run.journal.open_approval(
            run.run_id,
            token=run.token,
            request_id=request_id,
            op_id=op.op_id,
            attempt=op.attempt,
            prepared=prepared,
            fingerprint=fingerprint(prepared),
            evaluation=evaluation.model_dump(mode="json"),
            deadline=time.time() + policy_deadline,
        )
        run.event(
            "approval-requested",
            op_id=op.op_id,
            request_id=request_id,
            fingerprint=existing.fingerprint,
        )
    if existing.state == "waiting":
        raise RunSuspended(f"{op.op_id} waits for approval {request_id}", state="waiting")
    if existing.state == "approved":
        if fingerprint(prepared) != existing.fingerprint:
            refuse(run, op, f"the operation changed since {request_id} was approved")
        return
    if existing.state == "expired":
        refuse(run, op, f"approval {request_id} expired (its deadline passed)")
    who = f" by uid {existing.actor_uid}" if existing.actor_uid is not None else ""
    why = f": {existing.reason}" if existing.reason else ""
    refuse(run, op, f"approval {request_id} was {existing.state}{who}{why}")


def refuse(run: RunContext, op: OpRow, reason: str) -> None:
    """Record that the operation did not run and fail the run with the reason."""
    run.update_op(op.op_id, state="not-started",
        error=reason,
        event="op-refused",
        event_data={"reason": reason},
    )
    raise OperationRefused(f"{op.op_id} did not run: {reason}")
