"""cairnd's socket: one request line from the CLI, one reply line back.

A request is one model per ``op`` (:data:`DaemonRequest`, a union discriminated on ``op``);
ops of the same shape share a base class. On the wire a request is the *envelope* cairn
has always sent: every request key, the ones an op does not use at their defaults
(:func:`request_line`). cairnd drops those unused keys again when they are at their
default, so a CLI of an earlier version is understood; any other key an op does not take
is a malformed request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, model_validator

from cairn.protocol.base import Frozen
from cairn.protocol.launch import ProfileSpec

# Every key of the request envelope at its default, in wire order (after ``op``).
ENVELOPE: dict[str, Any] = {
    "definition": None,
    "args": {},
    "project": None,
    "run_id": None,
    "scripted": {},
    "all_users": False,
    "source": None,
    "confirm": None,
    "limits": {},
    "op_id": None,
    "result": None,
    "no_effect": False,
    "dry_run": False,
    "schedule_id": None,
    "schedule": {},
    "challenge": None,
    "occurrence": None,
    "answer": None,
    "request_id": None,
    "fingerprint": None,
    "reason": "",
    "cursor": 0,
}


class OpRequest(Frozen):
    """What every request has: its ``op``, the tag the daemon dispatches on."""

    op: str

    @model_validator(mode="before")
    @classmethod
    def _drop_unused_envelope_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {
            key: value
            for key, value in data.items()
            if key in cls.model_fields or key not in ENVELOPE or value != ENVELOPE[key]
        }


# --- runs ---------------------------------------------------------------------------


class PingRequest(OpRequest):
    op: Literal["ping"] = "ping"


class LaunchRequest(OpRequest):
    """Launch a workflow: a definition name, or a workflow file's ``source`` (read by the
    client) with the review hash the person confirmed for it (``confirm``)."""

    op: Literal["launch"] = "launch"
    definition: str | None = None
    args: dict[str, Any] = {}
    project: str | None = None
    scripted: dict[str, ProfileSpec] = {}
    source: str | None = None
    confirm: str | None = None
    limits: dict[str, int] = {}


class ListRequest(OpRequest):
    """A listing: the caller's own, or (an administrator's) everyone's."""

    all_users: bool = False


class PsRequest(ListRequest):
    op: Literal["ps"] = "ps"


class RunRequest(OpRequest):
    """A request about one run."""

    run_id: str | None = None


class ShowRequest(RunRequest):
    op: Literal["show"] = "show"


class LogsRequest(RunRequest):
    op: Literal["logs"] = "logs"


class DiffRequest(RunRequest):
    op: Literal["diff"] = "diff"


class DoctorRequest(RunRequest):
    """Check one run, or (without ``run_id``) every run the caller may see."""

    op: Literal["doctor"] = "doctor"


class UpgradeRequest(RunRequest):
    """Move a waiting or blocked run to new ``source`` (or only try, ``dry_run``)."""

    op: Literal["upgrade"] = "upgrade"
    source: str | None = None
    confirm: str | None = None
    dry_run: bool = False


class OpDecision(RunRequest):
    """A person's decision on an uncertain operation ``op_id``."""

    op_id: str | None = None


class RetryRequest(OpDecision):
    op: Literal["retry"] = "retry"


class ReconcileRequest(OpDecision):
    """Settle the operation from a ``result`` the person vouches for, or as having had
    ``no_effect`` (then it is retried)."""

    op: Literal["reconcile"] = "reconcile"
    result: dict[str, Any] | None = None
    no_effect: bool = False


# --- people in the loop -------------------------------------------------------------


class InboxRequest(ListRequest):
    op: Literal["inbox"] = "inbox"


class AnswerRequest(RunRequest):
    """An answer to the question ``challenge``, as the person typed it."""

    op: Literal["answer"] = "answer"
    challenge: str | None = None
    answer: str | None = None


class ApprovalDecision(RunRequest):
    """A decision on approval request ``request_id``: approval names the ``fingerprint``
    the person saw; a rejection may give a ``reason``."""

    request_id: str | None = None
    fingerprint: str | None = None
    reason: str = ""


class ApproveRequest(ApprovalDecision):
    op: Literal["approve"] = "approve"


class RejectRequest(ApprovalDecision):
    op: Literal["reject"] = "reject"


class PauseRequest(RunRequest):
    op: Literal["pause"] = "pause"


class ResumeRequest(RunRequest):
    op: Literal["resume"] = "resume"


class StopRequest(RunRequest):
    op: Literal["stop"] = "stop"


class CancelRequest(RunRequest):
    op: Literal["cancel"] = "cancel"


ControlRequest = PauseRequest | ResumeRequest | StopRequest | CancelRequest


class WatchRequest(RunRequest):
    """The run's events after ``cursor``, the last one the watcher has seen."""

    op: Literal["watch"] = "watch"
    cursor: int = 0


# --- schedules ----------------------------------------------------------------------


class ScheduleCreateRequest(OpRequest):
    """Create or replace a schedule; ``schedule`` is the body cairn.schedules validates
    (ScheduleCreate)."""

    op: Literal["schedule-create"] = "schedule-create"
    project: str | None = None
    schedule: dict[str, Any] = {}


class ScheduleConfirmRequest(OpRequest):
    """Confirm a reviewed revision by its ``challenge``; ``schedule`` is ScheduleConfirm."""

    op: Literal["schedule-confirm"] = "schedule-confirm"
    challenge: str | None = None
    schedule: dict[str, Any] = {}


class ScheduleRequest(OpRequest):
    """A request about one schedule."""

    schedule_id: str | None = None


class ScheduleResumeRequest(ScheduleRequest):
    op: Literal["schedule-resume"] = "schedule-resume"


class SchedulePauseRequest(ScheduleRequest):
    op: Literal["schedule-pause"] = "schedule-pause"


class ScheduleDeleteRequest(ScheduleRequest):
    op: Literal["schedule-delete"] = "schedule-delete"


class ScheduleInspectRequest(ScheduleRequest):
    op: Literal["schedule-inspect"] = "schedule-inspect"


class ScheduleAdmission(ScheduleRequest):
    """Admit an occurrence; ``occurrence`` retries a queued one."""

    occurrence: str | None = None


class ScheduleFireRequest(ScheduleAdmission):
    op: Literal["schedule-fire"] = "schedule-fire"


class ScheduleRunNowRequest(ScheduleAdmission):
    op: Literal["schedule-run-now"] = "schedule-run-now"


class ScheduleListRequest(OpRequest):
    op: Literal["schedule-list"] = "schedule-list"


class ScheduleInboxRequest(OpRequest):
    op: Literal["schedule-inbox"] = "schedule-inbox"


class ScheduleReconcileRequest(OpRequest):
    op: Literal["schedule-reconcile"] = "schedule-reconcile"


DaemonRequest = Annotated[
    PingRequest
    | LaunchRequest
    | PsRequest
    | ShowRequest
    | LogsRequest
    | DiffRequest
    | DoctorRequest
    | UpgradeRequest
    | RetryRequest
    | ReconcileRequest
    | InboxRequest
    | AnswerRequest
    | ApproveRequest
    | RejectRequest
    | PauseRequest
    | ResumeRequest
    | StopRequest
    | CancelRequest
    | WatchRequest
    | ScheduleCreateRequest
    | ScheduleConfirmRequest
    | ScheduleResumeRequest
    | SchedulePauseRequest
    | ScheduleDeleteRequest
    | ScheduleInspectRequest
    | ScheduleFireRequest
    | ScheduleRunNowRequest
    | ScheduleListRequest
    | ScheduleInboxRequest
    | ScheduleReconcileRequest,
    Field(discriminator="op"),
]
DAEMON_REQUEST: TypeAdapter[DaemonRequest] = TypeAdapter(DaemonRequest)


def daemon_request(op: str, **fields: Any) -> DaemonRequest:
    """The request model of ``op`` with ``fields`` (validated as cairnd validates it)."""
    return DAEMON_REQUEST.validate_python({"op": op, **fields})


def request_line(request: OpRequest) -> bytes:
    """The request as it goes on the socket: the envelope, with this op's fields set, as
    one JSON line."""
    envelope = {"op": request.op, **ENVELOPE, **request.model_dump(exclude={"op"})}
    return _ENVELOPE_JSON.dump_json(envelope) + b"\n"


_ENVELOPE_JSON: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


# --- replies ------------------------------------------------------------------------


class ErrorBody(Frozen):
    code: str
    message: str
    hint: str | None = None


class DaemonReply(Frozen):
    ok: bool
    result: Any = None
    error: ErrorBody | None = None
