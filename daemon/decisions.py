"""A person's decisions on a blocked run: ``cairn reconcile`` and ``cairn retry``."""

from __future__ import annotations

from pydantic import ValidationError

from cairn.daemon.reconcile import restart_coordinator
from cairn.daemon.views import visible_run
from cairn.errors import UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.agent import AgentMessage
from cairn.protocol.daemon import ReconcileRequest, RetryRequest
from cairn.protocol.jsonvalue import JSONObject, json_str
from cairn.protocol.replies import DecisionReply, RetryReply
from cairn.restore_point import restore_point
from cairn.validation import invalid
from cairn.workflow.review import Review
from cairn.workflow.schema import build_models


def decide(journal: Journal, request: ReconcileRequest | RetryRequest, uid: int) -> JSONObject:
    """Settle an uncertain operation from a result the person vouches for
    (:class:`DecisionReply`), or retry it (:class:`RetryReply`)."""
    run = visible_run(journal, request.run_id, uid)
    if not request.op_id:
        raise UsageError("no operation given", hint="see the blocked operation in 'cairn show'")
    op = journal.get_op_by_id(run.run_id, request.op_id)
    if isinstance(request, RetryRequest) or request.no_effect:
        journal.resolve_uncertain(run.run_id, op.op_id, decision="retry", actor_uid=uid)
    else:
        if request.result is None:
            raise UsageError("reconcile needs --result FILE or --no-effect")
        finish = checked_finish(
            journal, run.run_id, json_str(op.request["descriptor"]), request.result
        )
        journal.resolve_uncertain(
            run.run_id, op.op_id, decision="result", actor_uid=uid, finish=finish
        )
    restart_coordinator(journal, run.run_id)
    answer: DecisionReply
    if isinstance(request, RetryRequest) or request.no_effect:
        # the coordinator restores the next attempt's W from the same point
        replay = journal.launch_description(run.run_id).replay
        answer = RetryReply(
            run_id=run.run_id, op_id=op.op_id, state="pending",
            from_checkpoint=restore_point(
                journal.list_ops(run.run_id), op.scope, op.seq,
                replayed_through=replay.through_op if replay else None,
            ),
        )
    else:
        answer = DecisionReply(run_id=run.run_id, op_id=op.op_id, state="pending")
    return answer.model_dump(mode="json")


def checked_finish(
    journal: Journal, run_id: str, descriptor: str, result: JSONObject
) -> JSONObject:
    """The result as the agent's finish message, valid against its output schema.
    Accepts ``{"output": …, "handoff": …}`` or the bare output object."""
    review = Review.model_validate(journal.launch_description(run_id).review)
    agent = review.agents[descriptor]
    model = build_models(review.models)[agent.output]
    output = result.get("output", result) if isinstance(result, dict) else result
    handoff = str(result.get("handoff", "")) if "output" in result else ""
    try:
        model.model_validate(output)
    except ValidationError as exc:
        raise invalid(exc, f"the result does not match {agent.output}", top="output") from exc
    message = {"type": "finish_work", "output": output, "handoff": handoff}
    return AgentMessage.model_validate(message).model_dump(mode="json")
