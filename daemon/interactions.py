"""cairnd's side of people in the loop: inbox, answers, approvals, control requests, watch.

Every decision is bound to the caller's UID from SO_PEERCRED; only the run's owner or a
member of ``cairn-admin`` may decide (anyone else is told the run does not exist). The
journal transaction that records a decision is the only arbiter between concurrent
deciders; a decision that leaves a waiting run free to go on wakes its coordinator
through the broker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from cairn.canonical import canonical_json
from cairn.daemon import attention
from cairn.daemon.reconcile import restart_coordinator
from cairn.daemon.schedules import blocked_schedules
from cairn.daemon.views import is_admin, visible_run
from cairn.errors import CairnError, NotFound, UsageError, ValidationFailed
from cairn.journal.people import QuestionRow, StaleRequest
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES
from cairn.journal.snapshot import read_snapshot
from cairn.policy import (
    RequestExpired,
    evaluate,
    fingerprint,
    load_policy,
    prepare_agent_operation,
)
from cairn.protocol.daemon import (
    AnswerRequest,
    ApplyRequest,
    ApprovalDecision,
    ApproveRequest,
    CancelRequest,
    ControlRequest,
    InboxRequest,
    OpRequest,
    PauseRequest,
    RejectRequest,
    ResumeRequest,
    StopRequest,
    WatchRequest,
)
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.protocol.replies import AnswerReply, ApprovalReply, ControlReply
from cairn.protocol.run_replies import WaitingApproval, WaitingFor, WaitingQuestion, WatchReply
from cairn.settle.outcome import APPLY_REQUEST_ID, SETTLEMENT_OP
from cairn.validation import invalid
from cairn.workflow.review import Review
from cairn.workflow.schema import build_models

log = logging.getLogger(__name__)

WATCH_BATCH = 500


class PolicyDenies(CairnError):
    """The current host policy denies what an approval would allow."""

    code = "denied"


def dispatch(journal: Journal, request: OpRequest, uid: int) -> Any:
    route = ROUTES.get(request.op)
    if route is None or not isinstance(request, route[0]):
        raise UsageError(f"unknown request {request.op}")
    return route[1](journal, request, uid)


def _inbox(journal: Journal, request: InboxRequest, uid: int) -> object:
    return inbox(journal, uid, request.all_users)


def _answer(journal: Journal, request: AnswerRequest, uid: int) -> object:
    return answer(journal, visible_run(journal, request.run_id, uid).run_id, request, uid)


def _decide(journal: Journal, request: ApprovalDecision, uid: int) -> object:
    return decide(journal, visible_run(journal, request.run_id, uid).run_id, request, uid)


def _apply(journal: Journal, request: ApplyRequest, uid: int) -> object:
    """``cairn apply``: approve the run's held proposal as it stands (F is immutable)."""
    run_id = visible_run(journal, request.run_id, uid).run_id
    held = journal.approval(run_id, APPLY_REQUEST_ID)
    if held is None:
        raise UsageError(
            f"{run_id} has no proposal waiting to be applied",
            hint="only a run launched with '--apply ask' waits for 'cairn apply'",
        )
    approval = ApproveRequest(
        run_id=run_id, request_id=APPLY_REQUEST_ID, fingerprint=held.fingerprint
    )
    return decide(journal, run_id, approval, uid)


def _control(journal: Journal, request: ControlRequest, uid: int) -> object:
    run_id = visible_run(journal, request.run_id, uid).run_id
    outcome, wake = journal.request_control(run_id, request.op, actor_uid=uid)
    woken = wake and start_coordinator(journal, run_id)
    return ControlReply(
        run_id=run_id, action=request.op, outcome=outcome, woken=woken
    ).model_dump(mode="json")


def start_coordinator(journal: Journal, run_id: str) -> bool:
    """Wake a run whose decision is committed. If the broker cannot start it now, the
    decision stands and the run is ``pending``: the boot reconciler starts it later."""
    try:
        restart_coordinator(journal, run_id)
    except CairnError as exc:
        log.error("%s: decision recorded, coordinator not started: %s", run_id, exc)
        return False
    return True


def inbox(journal: Journal, uid: int, all_users: bool) -> list[dict[str, Any]]:
    """What waits for the caller: open questions and approval requests of their runs,
    their blocked runs, and their schedules that repeated launch failures blocked; each
    with the commands to run next."""
    owner = None if (all_users and is_admin(uid)) else uid
    return attention.inbox(journal, owner) + blocked_schedules(owner)


# --- answers ------------------------------------------------------------------------


def answer(journal: Journal, run_id: str, request: AnswerRequest, uid: int) -> JSONObject:
    """Record the answer to the run's question ``request.challenge`` (:class:`AnswerReply`)."""
    if not request.challenge:
        raise UsageError("an answer needs --challenge sha256:… (see 'cairn inbox')")
    if request.answer is None:
        raise UsageError("no answer given", hint="give VALUE or --file FILE")
    question = next(
        (q for q in journal.questions(run_id) if q.challenge == request.challenge), None
    )
    if question is None:
        current = [q.challenge for q in journal.questions(run_id) if q.state == "waiting"]
        raise StaleRequest(
            f"challenge {request.challenge} is not a question of {run_id}"
            + (f"; the current one is {current[0]}" if current else "; nothing waits"),
            hint="see 'cairn inbox'",
        )
    value = validated_answer(journal, run_id, question, request.answer)
    outcome, wake = journal.answer_question(
        run_id, challenge=request.challenge, answer=value, actor_uid=uid
    )
    woken = wake and start_coordinator(journal, run_id)
    return AnswerReply(
        run_id=run_id, op_id=question.op_id, outcome=outcome, woken=woken
    ).model_dump(mode="json")


def validated_answer(journal: Journal, run_id: str, question: QuestionRow, text: str) -> JSONValue:
    """The answer as the question's schema reads it: JSON for a model, else the text."""
    if question.schema_name is None:
        if not text.strip():
            raise ValidationFailed("the answer is empty")
        return text
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"the answer must be JSON for {question.schema_name}: {exc.msg}",
            hint=f"e.g. cairn answer {run_id} --challenge … '{{\"field\": …}}'",
        ) from exc
    review = Review.model_validate(journal.launch_description(run_id).review)
    model = build_models(review.models)[question.schema_name]
    try:
        return model.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        raise invalid(
            exc, f"the answer does not match {question.schema_name}", top="answer"
        ) from exc


# --- approvals ----------------------------------------------------------------------


def decide(journal: Journal, run_id: str, request: ApprovalDecision, uid: int) -> dict[str, Any]:
    """Approve or reject one approval request (:class:`ApprovalReply`). An approval must
    name the fingerprint the person saw; the operation is prepared again and must be the
    same, and the current policy must still permit it."""
    if not request.request_id:
        raise UsageError("no approval request given", hint="see 'cairn inbox'")
    row = journal.approval(run_id, request.request_id)
    if row is None:
        raise NotFound(f"{run_id} has no approval request {request.request_id}",
                       hint="see 'cairn inbox'")
    if request.op == "approve":
        if not request.fingerprint:
            raise UsageError("approve needs --fingerprint sha256:… (see 'cairn inbox')")
        if row.state == "waiting" and row.op_id != SETTLEMENT_OP:
            check_still_permitted(journal, run_id, row.op_id, row.fingerprint)
    state, wake = journal.decide_approval(
        run_id,
        request.request_id,
        decision="approved" if request.op == "approve" else "rejected",
        actor_uid=uid,
        fingerprint=request.fingerprint,
        reason=request.reason,
    )
    woken = wake and start_coordinator(journal, run_id)
    if state == "expired":
        raise RequestExpired(
            f"approval request {request.request_id} of {run_id} passed its deadline "
            f"({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row.deadline))}); it is "
            "recorded as expired and the operation does not run"
        )
    return ApprovalReply(
        run_id=run_id, request_id=request.request_id, outcome=state, woken=woken
    ).model_dump(mode="json")


def check_still_permitted(journal: Journal, run_id: str, op_id: str, stored: str) -> None:
    """For an agent operation policy held: prepare it again from the journal and compare
    it with the stored one; evaluate the current policy for it. A ``flow.approve`` starts
    nothing and asks no capability: its subject is the journal's, and there is nothing to
    prepare again."""
    desc = journal.launch_description(run_id)
    op = journal.get_op_by_id(run_id, op_id)
    if op.kind != "agent":
        return
    prepared = prepare_agent_operation(desc, op_id, op.request)
    if fingerprint(prepared) != stored:
        raise StaleRequest(
            f"the operation of {op_id} changed since the approval was requested; this "
            "approval cannot authorize it",
            hint="reject the request; the run can then be launched again",
        )
    evaluation = evaluate(load_policy(), list(prepared["capabilities"]), desc)
    if evaluation.decision == "deny":
        raise PolicyDenies(
            f"host policy now denies {', '.join(evaluation.because('deny'))}; the approval "
            "is refused",
            hint=f"reject it with 'cairn reject {run_id} …' or change /etc/cairn/policy.toml",
        )


# --- watch --------------------------------------------------------------------------


def watch(journal: Journal, request: WatchRequest, uid: int) -> JSONObject:
    """The run's state and its events after ``cursor`` (:class:`WatchReply`), rebuilt from
    one read snapshot of the journal (the state never runs ahead of the events); a watcher
    polls with the last cursor it saw."""
    with read_snapshot(journal):
        return _watch(journal, request, uid).model_dump(mode="json")


def _watch(journal: Journal, request: WatchRequest, uid: int) -> WatchReply:
    run = visible_run(journal, request.run_id, uid)
    events = journal.events(run.run_id, after=request.cursor, limit=WATCH_BATCH)
    waiting: list[WaitingFor] = [
        WaitingQuestion(kind="question", op_id=q.op_id, question=q.question,
                        challenge=q.challenge)
        for q in journal.questions(run.run_id)
        if q.state == "waiting"
    ]
    waiting += [
        WaitingApproval(kind="approval", op_id=a.op_id, request_id=a.request_id,
                        fingerprint=a.fingerprint)
        for a in journal.approvals(run.run_id)
        if a.state == "waiting"
    ]
    return WatchReply.model_validate({
        "run_id": run.run_id,
        "state": run.state,
        "finished": run.state in TERMINAL_RUN_STATES,
        "error": run.error,
        "output": run.output,
        "events": [json.loads(canonical_json(e.model_dump())) for e in events],
        "cursor": events[-1].cursor if events else request.cursor,
        "more": len(events) == WATCH_BATCH,
        "waiting": waiting,
    })


Handler = Callable[[Journal, OpRequest, int], object]
R = TypeVar("R", bound=OpRequest)


def route(
    model: type[R], handler: Callable[[Journal, R, int], object]
) -> tuple[type[OpRequest], Handler]:
    """``(model, handler)`` for :data:`ROUTES`: the handler of requests of ``model``
    (:func:`dispatch` has checked the request is one)."""

    def checked(journal: Journal, request: OpRequest, uid: int) -> object:
        if not isinstance(request, model):
            raise UsageError(f"unknown request {request.op}")
        return handler(journal, request, uid)

    return model, checked


# op -> (request model, handler) of the requests of people in the loop
ROUTES: dict[str, tuple[type[OpRequest], Handler]] = {
    "inbox": route(InboxRequest, _inbox),
    "answer": route(AnswerRequest, _answer),
    "approve": route(ApproveRequest, _decide),
    "reject": route(RejectRequest, _decide),
    "apply": route(ApplyRequest, _apply),
    "pause": route(PauseRequest, _control),
    "resume": route(ResumeRequest, _control),
    "stop": route(StopRequest, _control),
    "cancel": route(CancelRequest, _control),
    "watch": route(WatchRequest, watch),
}
MODELS = {op: model for op, (model, _handler) in ROUTES.items()}
