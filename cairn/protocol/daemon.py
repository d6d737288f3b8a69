"""cairnd's socket: one request line from the CLI, one reply line back.

A request is one model per ``op`` (:data:`DaemonRequest`, a union discriminated on ``op``);
ops of the same shape share a base class. On the wire a request is the one *envelope*
cairn has always sent (:class:`RequestEnvelope`): every request key, typed, the ones an op
does not use at their defaults. cairnd reads the envelope and builds the op's model from
it (:meth:`RequestEnvelope.request`), so the line, what is accepted and every error
are what they were before requests had a model per op.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, TypeAdapter, field_validator
from pydantic_core import PydanticCustomError

from cairn.protocol.base import Frozen, build_loaded_models
from cairn.protocol.launch import ApplyMode, ProfileSpec
from cairn.protocol.names import ARTIFACT_PATH_MAX, OP_ID_PATTERN, RUN_KEY_PATTERN
from cairn.protocol.requestchecks import (
    LOG_CURSOR_RE,
    MAX_LOG_LINES,
    LogOutput,
    log_grep_problem,
    log_priority_problem,
    log_since_problem,
    log_until_problem,
    run_ref_problem,
)

# --- naming a run (how, and the check: cairn.protocol.requestchecks) ----------------


def _run_ref(ref: str | None) -> str | None:
    problem = None if ref is None else run_ref_problem(ref)
    if problem is not None:
        raise PydanticCustomError("run_ref", "{problem}", {"problem": problem})
    return ref


RunRef = Annotated[str | None, AfterValidator(_run_ref)]

_RUN_KEY = re.compile(RUN_KEY_PATTERN)


def _run_key(key: str | None) -> str | None:
    if key is not None and not _RUN_KEY.fullmatch(key):
        raise PydanticCustomError(
            "run_key",
            "run key {key} is not a name: use 1 to 128 letters, digits and . _ : @ + -, "
            "starting with a letter or digit",
            {"key": repr(key[:200])},
        )
    return key


# A caller's name for a run (``cairn launch --run-key``).
RunKey = Annotated[str | None, AfterValidator(_run_key)]


# Every model here is built on its first use, not at import: the CLI, started for each
# command, builds only the request it sends and the reply (see :func:`build_models`).
BUILT_ON_FIRST_USE = ConfigDict(defer_build=True)


class OpRequest(Frozen):
    """What every request has: its ``op``, the tag the daemon dispatches on."""

    model_config = BUILT_ON_FIRST_USE

    op: str


# --- runs ---------------------------------------------------------------------------


class PingRequest(OpRequest):
    op: Literal["ping"] = "ping"


class LaunchRequest(OpRequest):
    """Launch a workflow: a definition name, or a workflow file's ``source`` (read by the
    client) with the review hash the person confirmed for it (``confirm``). With
    ``run_key``, a launch its owner made before under the same key is answered with that
    run instead of a new one."""

    op: Literal["launch"] = "launch"
    definition: str | None = None
    args: dict[str, JsonValue] = {}
    project: str | None = None
    scripted: dict[str, ProfileSpec] = {}
    source: str | None = None
    confirm: str | None = None
    limits: dict[str, int] = {}
    apply_mode: ApplyMode = "auto"
    run_key: RunKey = None


class ListRequest(OpRequest):
    """A listing: the caller's own, or (an administrator's) everyone's."""

    all_users: bool = False


class PsRequest(ListRequest):
    op: Literal["ps"] = "ps"


class RunRequest(OpRequest):
    """A request about one run; ``run_id`` names it as a person may (:data:`RunRef`) and
    holds the full ID once cairnd has resolved it."""

    run_id: RunRef = None


class ShowRequest(RunRequest):
    op: Literal["show"] = "show"


# --- reading a run's journal (the options' checks: cairn.protocol.requestchecks) -------


def _checked(
    problem_of: typing.Callable[[str], str | None],
) -> typing.Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        problem = None if value is None else problem_of(value)
        if problem is not None:
            raise PydanticCustomError("log_query", "{problem}", {"problem": problem})
        return value

    return check


LogPriority = Annotated[str | None, AfterValidator(_checked(log_priority_problem))]
LogSince = Annotated[str | None, AfterValidator(_checked(log_since_problem))]
LogUntil = Annotated[str | None, AfterValidator(_checked(log_until_problem))]
LogGrep = Annotated[str | None, AfterValidator(_checked(log_grep_problem))]
LogCursor = Annotated[str | None, Field(pattern=LOG_CURSOR_RE.pattern)]
LogLines = Annotated[int | None, Field(ge=0, le=MAX_LOG_LINES)]


class LogsRequest(RunRequest):
    """The journal of a run's units (of one operation's agent units with ``op_id``): the
    last ``lines`` entries (all without it), newest first with ``reverse``, or, when
    following, the entries after ``after_cursor``, the last one the reader has."""

    op: Literal["logs"] = "logs"
    since: LogSince = None
    until: LogUntil = None
    priority: LogPriority = None
    grep: LogGrep = None
    op_id: Annotated[str | None, Field(pattern=OP_ID_PATTERN)] = None
    reverse: bool = False
    output: LogOutput = "short-iso"
    lines: LogLines = None
    after_cursor: LogCursor = None


class DiffRequest(RunRequest):
    op: Literal["diff"] = "diff"


class DoctorRequest(RunRequest):
    """Check one run, or (without ``run_id``) every run the caller may see."""

    op: Literal["doctor"] = "doctor"


class RevertRequest(RunRequest):
    """Undo a finished run's apply in the live project (three-way, F back to Q)."""

    op: Literal["revert"] = "revert"


class ReplayRequest(RunRequest):
    """A new run from the root boundary ``op_id`` of a finished run (``cairn replay``)."""

    op: Literal["replay"] = "replay"
    op_id: str | None = None


class ArtifactsRequest(RunRequest):
    """The artifacts a run's agents published (of the operation ``op_id`` only), or with
    ``op_id`` and ``name`` the content of one (``cairn artifacts``)."""

    op: Literal["artifacts"] = "artifacts"
    op_id: Annotated[str | None, Field(pattern=OP_ID_PATTERN)] = None
    name: Annotated[str | None, Field(min_length=1, max_length=ARTIFACT_PATH_MAX)] = None


class CheckpointsRequest(RunRequest):
    """Every checkpoint S of one run with its operation, time and size."""

    op: Literal["checkpoints"] = "checkpoints"


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
    result: dict[str, JsonValue] | None = None
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


class ApplyRequest(RunRequest):
    """Approve the held proposal of a run launched with ``--apply ask``: F, frozen and
    shown by ``cairn diff``, goes to the live project."""

    op: Literal["apply"] = "apply"


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


class NotificationsRequest(OpRequest):
    """Notifications of the caller's runs after ``cursor``; a negative cursor asks only for
    the cursor to start from now."""

    op: Literal["notifications"] = "notifications"
    cursor: int = -1


# --- storage ------------------------------------------------------------------------


class StorageDfRequest(ListRequest):
    """The pool's size, use, free space and reserve, and the caller's runs that hold
    storage (everyone's for an administrator's ``all_users``)."""

    op: Literal["storage-df"] = "storage-df"


class RmRequest(RunRequest):
    """Delete the storage of the caller's finished run; ``dry_run`` only checks that it
    may go."""

    op: Literal["rm"] = "rm"
    dry_run: bool = False


class PruneRequest(OpRequest):
    """Delete finished runs' storage by rule: finished more than ``older_than`` seconds
    ago, or beyond the ``keep`` newest per user; with neither, by the host's storage
    policy. ``dry_run`` only says what would go."""

    op: Literal["prune"] = "prune"
    older_than: int | None = Field(default=None, ge=0)
    keep: int | None = Field(default=None, ge=0)
    dry_run: bool = False


# --- schedules ----------------------------------------------------------------------


class ScheduleCreateRequest(OpRequest):
    """Create or replace a schedule; ``schedule`` is the body cairn.schedules validates
    (ScheduleCreate). A ``user:`` or ``project:`` definition comes with its ``source`` as
    installed or trusted and that review hash (``confirm``), which the schedule pins."""

    op: Literal["schedule-create"] = "schedule-create"
    project: str | None = None
    schedule: dict[str, JsonValue] = {}
    source: str | None = None
    confirm: str | None = None


class ScheduleConfirmRequest(OpRequest):
    """Confirm a reviewed revision by its ``challenge``; ``schedule`` is ScheduleConfirm."""

    op: Literal["schedule-confirm"] = "schedule-confirm"
    challenge: str | None = None
    schedule: dict[str, JsonValue] = {}


class ScheduleRequest(OpRequest):
    """A request about one schedule."""

    schedule_id: str | None = None


class SentDefinition(ScheduleRequest):
    """A request that checks a ``user:`` or ``project:`` definition as it is now: its
    owner's CLI reads the ``source`` (cairnd never reads the person's files) or says in
    ``source_error`` why it could not."""

    source: str | None = None
    source_error: str | None = Field(default=None, max_length=500)


class ScheduleResumeRequest(SentDefinition):
    op: Literal["schedule-resume"] = "schedule-resume"


class SchedulePauseRequest(ScheduleRequest):
    op: Literal["schedule-pause"] = "schedule-pause"


class ScheduleDeleteRequest(ScheduleRequest):
    op: Literal["schedule-delete"] = "schedule-delete"


class ScheduleInspectRequest(ScheduleRequest):
    op: Literal["schedule-inspect"] = "schedule-inspect"


class ScheduleAdmission(SentDefinition):
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
    | RevertRequest
    | ReplayRequest
    | CheckpointsRequest
    | ArtifactsRequest
    | RetryRequest
    | ReconcileRequest
    | InboxRequest
    | AnswerRequest
    | ApproveRequest
    | RejectRequest
    | ApplyRequest
    | PauseRequest
    | ResumeRequest
    | StopRequest
    | CancelRequest
    | WatchRequest
    | NotificationsRequest
    | StorageDfRequest
    | RmRequest
    | PruneRequest
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
DAEMON_REQUEST: TypeAdapter[DaemonRequest] = TypeAdapter(DaemonRequest, config=BUILT_ON_FIRST_USE)


MODEL_OF_OP: dict[str, type[OpRequest]] = {
    typing.get_args(model.model_fields["op"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(DaemonRequest)[0])
}


def daemon_request(op: str, **fields: object) -> DaemonRequest:
    """The request model of ``op`` with ``fields`` (only the op's own)."""
    return DAEMON_REQUEST.validate_python({"op": op, **fields})


class RequestEnvelope(Frozen):
    """What cairnd reads from a request line: every op's keys, each typed and optional, so
    both the op's own keys (what :func:`request_line` sends) and the all-keys line of
    earlier versions parse. ``op`` comes first and must be one cairnd knows (else the
    error's type is ``unknown_op``)."""

    model_config = BUILT_ON_FIRST_USE

    op: str
    definition: str | None = None
    args: dict[str, JsonValue] = {}
    project: str | None = None
    run_id: RunRef = None
    scripted: dict[str, ProfileSpec] = {}
    all_users: bool = False
    source: str | None = None
    source_error: str | None = None
    confirm: str | None = None
    limits: dict[str, int] = {}
    apply_mode: ApplyMode = "auto"
    op_id: str | None = None
    result: dict[str, JsonValue] | None = None
    no_effect: bool = False
    dry_run: bool = False
    schedule_id: str | None = None
    schedule: dict[str, JsonValue] = {}
    challenge: str | None = None
    occurrence: str | None = None
    answer: str | None = None
    request_id: str | None = None
    fingerprint: str | None = None
    reason: str = ""
    cursor: int = 0
    since: LogSince = None
    until: LogUntil = None
    priority: LogPriority = None
    grep: LogGrep = None
    reverse: bool = False
    output: LogOutput = "short-iso"
    lines: LogLines = None
    after_cursor: LogCursor = None
    older_than: int | None = None
    keep: int | None = None
    run_key: RunKey = None
    name: str | None = None

    @field_validator("op", mode="before")
    @classmethod
    def _known(cls, op: object) -> str:
        if not (isinstance(op, str) and op in MODEL_OF_OP):
            raise PydanticCustomError("unknown_op", "no request {op!r}", {"op": op})
        return op

    def request(self) -> DaemonRequest:
        """The op's model, from the keys it takes (the others are not its business)."""
        model = MODEL_OF_OP[self.op]
        fields = {name: getattr(self, name) for name in model.model_fields}
        return DAEMON_REQUEST.validate_python(fields)


def request_line(request: OpRequest) -> bytes:
    """The request as it goes on the socket: the op's own keys as one JSON line (adding a
    key to one op changes only that op's line)."""
    return request.model_dump_json().encode() + b"\n"


# --- replies ------------------------------------------------------------------------


class ErrorBody(Frozen):
    model_config = BUILT_ON_FIRST_USE

    code: str
    message: str
    hint: str | None = None


class DaemonReply(Frozen):
    model_config = BUILT_ON_FIRST_USE

    ok: bool
    result: object = None
    error: ErrorBody | None = None


def build_models() -> None:
    """Build every model loaded so far, this protocol's request adapter with them
    (:func:`cairn.protocol.base.build_loaded_models`): cairnd and ``cairn mcp`` call it
    before they start their threads."""
    build_loaded_models()
    DAEMON_REQUEST.rebuild()
