"""cairnd's replies, typed: the result of every op, built by its handler in ``daemon/``
and read by the CLI (``typed`` in :mod:`cairn.cli.client`) and the MCP server. A key a
newer cairnd adds is ignored by an older reader; the wire keeps each reply's shape (``ps``
sends ``PsReply``'s list). What ``--json`` prints of them is published as a versioned
schema (:mod:`cairn.protocol.jsonschema`).

Here: the runs' ops (``ps``, ``checkpoints``, ``storage-df``, ``reconcile``, ``retry``,
``rm``, ``prune``, ``revert``, ``replay``, ``artifacts``); a person's (``inbox``,
``answer``, ``approve``, ``reject``, ``apply``, ``pause``, ``resume``, ``stop``,
``cancel``); the schedules' (``schedule-create``, ``-confirm``, ``-resume``, ``-pause``,
``-delete``, ``-list``, ``-inspect``, ``-inbox``, ``-fire`` and ``-run-now``
(:class:`OccurrenceDecision`), ``-reconcile``). In :mod:`cairn.protocol.view_replies`:
``diff``, ``logs``, ``doctor``, ``show``; in :mod:`cairn.protocol.run_replies`: ``ping``,
``launch``, ``upgrade``, ``watch``; ``notifications`` is
:class:`cairn.protocol.notify.NotifyBatch`. ``inbox``, ``schedule-create``, ``doctor``
and ``show`` are read, not built, through theirs: cairnd passes on journal rows, resolved
profiles and views whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, JsonValue, Tag

from cairn.protocol.agent import Artifact, ArtifactRefused


def kind_tag(known: tuple[str, ...], other: str) -> Callable[[object], str]:
    """A union's discriminator by the item's ``kind`` (a dict's key, a model's field): the
    kind when it is one of ``known``, else ``other`` (a kind a newer cairnd adds)."""

    def tag(item: object) -> str:
        kind = item.get("kind") if isinstance(item, dict) else getattr(item, "kind", None)
        return kind if kind in known else other

    return tag


class Reply(BaseModel):
    """The result of a cairnd reply, typed for every reader (the CLI, the MCP server); a
    key a newer cairnd adds is ignored by an older reader."""

    model_config = ConfigDict(defer_build=True, extra="ignore", frozen=True)


class OperationArtifacts(Reply):
    op_id: str
    files: list[Artifact] = []
    refused: list[ArtifactRefused] = []
    refused_total: int = 0


class ArtifactsReply(Reply):
    """``artifacts`` without a name: every agent operation's (or one's)."""

    run_id: str
    operations: list[OperationArtifacts]


class ArtifactContent(Reply):
    """``artifacts`` with a name: one artifact, its bytes in base64."""

    run_id: str
    op_id: str
    name: str
    size: int
    sha256: str
    content_base64: str


# States, kinds and statuses are read as text: a state a newer cairnd adds is shown, not
# refused.


class CurrentOperation(Reply):
    """The last operation a run recorded."""

    op_id: str
    kind: str
    state: str


class SettlementSummary(Reply):
    """How a run's settlement ended, as counts and one label
    (:func:`cairn.settle.outcome.summary`)."""

    status: str
    label: str
    complete: bool
    accepted: int
    applied: int
    already_applied: int
    refused: int
    ignored: int
    conflicts: int
    reverted: bool


class RunListing(Reply):
    """One run as ``ps`` lists it; ``position``: a queued run's place in the queue;
    ``error``: why it failed or blocked; ``replay_through``: a failed run's latest root
    boundary ``cairn replay`` starts from (how it is retried), while its storage is kept;
    None otherwise; ``replayed_by``: the runs replayed from a failed run, oldest first
    (empty for the others)."""

    run_id: str
    state: str
    position: int | None
    definition: str
    project: str
    owner_uid: int
    created_at: float
    run_key: str | None
    current_op: CurrentOperation | None
    settlement_summary: SettlementSummary | None
    error: str | None = None
    replay_through: str | None = None
    replayed_by: list[str] = []


class PsReply(Reply):
    """``ps``: on the wire the list of runs itself, read as ``{"runs": LIST}``
    (``PsReply(...).model_dump(mode="json")["runs"]`` is what cairnd sends)."""

    runs: list[RunListing]


class StorageState(Reply):
    """Whether a run's storage was deleted, when (the receipt's ``at``), and how many
    subvolumes went (:func:`cairn.views.run.storage_status`)."""

    deleted: bool
    deleted_at: float | None
    subvolumes: int


class RunCheckpoint(Reply):
    """One checkpoint S with the operation it froze (None where the journal has no such
    operation); ``exclusive``: its bytes, None when unknown or deleted."""

    op_id: str
    kind: str | None
    scope: str | None
    attempt: int | None
    op_state: str | None
    at: float | None
    path: str
    uuid: str
    subvol_id: int
    exclusive: int | None
    deleted: bool
    reminted: bool


class CheckpointsReply(Reply):
    """``checkpoints``: a run's checkpoints in the order they were taken."""

    run_id: str
    state: str
    storage: StorageState
    checkpoints: list[RunCheckpoint]


class PoolSpace(Reply):
    """The pool's size, used, free and reserved bytes, and whether Btrfs quotas are on
    (:class:`cairn.retention.PoolUsage`)."""

    root: str
    size: int
    used: int
    free: int
    reserve: int
    quotas: bool


class RunStorage(Reply):
    """A run that holds storage; ``held``: why it must stay, None when it may go."""

    run_id: str
    owner_uid: int
    state: str
    finished_at: float
    exclusive: int | None
    held: str | None


class StorageDfReply(Reply):
    """``storage-df``: the pool, and every (of the caller's) run that holds storage."""

    pool: PoolSpace
    runs: list[RunStorage]


class DecisionReply(Reply):
    """``reconcile`` with a result: the operation is decided, the run resumes."""

    run_id: str
    op_id: str
    state: Literal["pending"]


class RetryReply(DecisionReply):
    """``retry`` (or ``reconcile`` with no effect): ``from_checkpoint``, the operation
    whose checkpoint the next attempt's W is restored from (None: Q)."""

    from_checkpoint: str | None


class RmReply(Reply):
    """``rm`` of one run (``dry_run``: only checked): whether its storage was already gone,
    how many subvolumes went, how many Btrfs still reclaims, and the pool's free bytes
    then (None: unknown, or nothing deleted)."""

    run_id: str
    already_gone: bool
    subvolumes: int
    reclaim_pending: int
    free_bytes: int | None


class PruneRule(Reply):
    """The rule a prune applied (:class:`cairn.retention.Rule`)."""

    older_than: int | None
    keep: int | None


class PruneVerdict(Reply):
    """A run a prune deletes (or keeps), and why."""

    run_id: str
    reason: str


class PrunedRun(Reply):
    run_id: str
    subvolumes: int


class PruneFailure(Reply):
    """A run whose deletion was refused; the others still went."""

    run_id: str
    error: str


class PruneReply(Reply):
    """``prune``: the rule, the runs it deletes and keeps, what was deleted or refused
    (nothing on a ``dry_run``), and the pool's space after the last delete."""

    dry_run: bool
    rule: PruneRule
    delete: list[PruneVerdict]
    kept: list[PruneVerdict]
    deleted: list[PrunedRun]
    failed: list[PruneFailure]
    reclaim_pending: int
    free_bytes: int | None


class PathReason(Reply):
    """A path of the project, and why it was refused or left untouched."""

    path: str
    reason: str


class RevertReply(Reply):
    """``revert``: the apply unit that ran and its result
    (:class:`cairn.protocol.settlement.ApplyResult`); ``conflict``: nothing written."""

    run_id: str
    unit: str
    status: str
    applied: list[str]
    already_applied: list[str]
    conflicts: list[PathReason]
    xattrs_not_kept: list[str]
    links_not_kept: list[str]


class ReplayReply(Reply):
    """``replay``: the new run, its source, the operations imported, its hashes, and the
    state it was admitted in."""

    run_id: str
    source_run: str
    through: str
    imported: list[str]
    review_hash: str
    launch_hash: str
    state: str


class QueuedReplayReply(ReplayReply):
    """``replay`` of a run that joined the queue: its ``position`` in it (1 = next;
    None: it left the queue meanwhile)."""

    position: int | None


# --- people ---


class AnswerReply(Reply):
    """``answer``: the question's operation; ``outcome``: ``answered``, or ``duplicate``
    (it already had this answer); ``woken``: the run's coordinator was started."""

    run_id: str
    op_id: str
    outcome: str
    woken: bool


class ApprovalReply(Reply):
    """``approve``, ``reject`` and ``apply`` (the request ``apply``): the request as
    decided (``outcome``: ``approved``, ``rejected``); ``woken``: the coordinator was
    started."""

    run_id: str
    request_id: str
    outcome: str
    woken: bool


class ControlReply(Reply):
    """``pause``, ``resume``, ``stop`` and ``cancel``: ``outcome`` is what happened, or
    ``…-requested`` when the run's coordinator acts on it at its next safe point."""

    run_id: str
    action: str
    outcome: str
    woken: bool


class InboxItem(Reply):
    """One thing that waits for a person, with the commands that decide it; an item of a
    kind this reader does not know is read as only this."""

    kind: str
    created_at: float
    commands: list[str] = []


class QuestionItem(InboxItem):
    """A run's open question (:class:`cairn.journal.people.QuestionRow`); answer it with
    its ``challenge``."""

    run_state: str
    definition: str
    run_id: str
    op_id: str
    challenge: str
    question: str
    schema_name: str | None
    json_schema: dict[str, JsonValue]
    state: str
    answer: JsonValue
    actor_uid: int | None
    decided_at: float | None


class AgentGrant(Reply):
    """What the review grants an agent descriptor."""

    profile: str
    access: str
    network: str


class PreparedAgent(Reply):
    """The agent operation an approval would start
    (:func:`cairn.policy.prepare_agent_operation`)."""

    run_id: str
    op_id: str
    definition: str
    review_hash: str
    descriptor: str
    agent: AgentGrant
    profile: dict[str, JsonValue] | None
    prompt: str
    title: str
    limits: dict[str, JsonValue]
    capabilities: list[str]


class PreparedApproval(Reply):
    """A ``flow.approve`` the workflow asked for; ``on_expiry``: the decision when its
    deadline passes."""

    kind: str
    run_id: str
    op_id: str
    subject: str
    expires_in: int | None
    on_expiry: str
    on_reject: str


class PreparedApply(Reply):
    """A proposal held for ``cairn apply``: the paths it writes into ``project``."""

    kind: str
    run_id: str
    project: str
    accepted: list[str]
    refused: int
    f: str
    diff_sha256: str


_prepared_kind = kind_tag(("apply", "approve"), "agent")


class PolicyEvaluation(Reply):
    """The policy's decision on an approval request; ``capabilities``: each one's (none
    for a proposal held for ``cairn apply``)."""

    decision: str
    capabilities: dict[str, str] = {}


class ApprovalItem(InboxItem):
    """A run's open approval request (:class:`cairn.journal.people.ApprovalRow`): an
    agent's operation that policy holds, a ``flow.approve``, or a proposal held for
    ``cairn apply``; approve it with its ``fingerprint``."""

    run_state: str
    definition: str
    run_id: str
    request_id: str
    op_id: str
    attempt: int
    prepared: Annotated[
        Annotated[PreparedApply, Tag("apply")]
        | Annotated[PreparedApproval, Tag("approve")]
        | Annotated[PreparedAgent, Tag("agent")],
        Discriminator(_prepared_kind),
    ]
    fingerprint: str
    evaluation: PolicyEvaluation
    deadline: float
    state: str
    actor_uid: int | None
    reason: str | None
    decided_at: float | None


class BlockedRunItem(InboxItem):
    """A ``blocked`` run: an operation (``op_id``) that needs a decision, or (None) the
    run itself, storage that does not match its receipts."""

    run_id: str
    run_state: str
    definition: str
    op_id: str | None
    reason: str | None


class BlockedScheduleItem(InboxItem):
    """A schedule that repeated launch failures blocked."""

    schedule_id: str
    name: str
    owner_uid: int
    reason: str | None


_INBOX_KINDS = ("question", "approval", "blocked", "schedule-blocked")


_inbox_kind = kind_tag(_INBOX_KINDS, "other")


class InboxReply(Reply):
    """``inbox``: on the wire the list of items itself, read as ``{"items": LIST}``; each
    item is read by its ``kind``."""

    items: list[
        Annotated[
            Annotated[QuestionItem, Tag("question")]
            | Annotated[ApprovalItem, Tag("approval")]
            | Annotated[BlockedRunItem, Tag("blocked")]
            | Annotated[BlockedScheduleItem, Tag("schedule-blocked")]
            | Annotated[InboxItem, Tag("other")],
            Discriminator(_inbox_kind),
        ]
    ]


# --- schedules ---


class OccurrenceView(Reply):
    """One decided occurrence of a schedule; ``at``, ``nominal``: ISO 8601 instants."""

    key: str
    trigger: str
    nominal: str
    revision: int
    state: str
    reason: str
    run_id: str | None
    run_state: str | None
    at: str


class ScheduleView(Reply):
    """``schedule-confirm``, ``schedule-pause``, ``schedule-delete``: what a person sees of
    one schedule. ``timer``: the exact unit file the user's manager must hold (None: no
    timer should exist); ``runs_used`` counts the confirmed revision's occurrences."""

    schedule_id: str
    name: str
    status: str
    revision: int
    confirmed_revision: int | None
    awaiting_confirmation: bool
    definition: str
    project: str
    calendar: str
    timezone: str
    catch_up: str
    overlap: str
    min_spacing_sec: int
    max_runs: int
    runs_used: int
    valid_until: str
    launch_failures: int
    blocked_reason: str | None
    timer_unit: str
    timer: str | None
    last_occurrence: OccurrenceView | None


class ScheduleListReply(Reply):
    """``schedule-list``: on the wire the list of schedules itself, read as
    ``{"schedules": LIST}``."""

    schedules: list[ScheduleView]


class ScriptedProfile(Reply):
    """A scripted profile a schedule launches with (:class:`cairn.protocol.launch.ProfileSpec`)."""

    name: str
    kind: str
    steps: list[dict[str, JsonValue]] = []


class ScheduleReview(ScheduleView):
    """``schedule-create``: the revision stored paused, and the ``challenge`` that confirms
    it (``action``: ``create`` or ``replace``)."""

    action: str
    challenge: str
    review_hash: str
    args: dict[str, JsonValue]
    profiles: dict[str, ScriptedProfile]
    next_elapses: list[str]


class EnabledSchedule(ScheduleView):
    """``schedule-resume``: the schedule enabled, with the ``timer`` to install and its
    next elapses."""

    timer: str
    next_elapses: list[str]


class ScheduleDetail(ScheduleView):
    """``schedule-inspect``: the schedule with its reviewed revision, the ``challenge``
    still to confirm (None: confirmed), the next elapses (none unless enabled) and its
    latest occurrences, newest first (``occurrences_omitted``: there are older ones)."""

    review_hash: str
    args: dict[str, JsonValue]
    profiles: list[str]
    challenge: str | None
    next_elapses: list[str]
    occurrences: list[OccurrenceView]
    occurrences_omitted: bool


class ScheduleInboxItem(Reply):
    """What happened to a schedule that its owner should see (``kind``: e.g. a failed
    run, a launch failure); ``ref``: what it is about, ``at``: an ISO 8601 instant."""

    item_id: int
    schedule_id: str
    name: str
    kind: str
    ref: str
    message: str
    at: str


class ScheduleInboxReply(Reply):
    """``schedule-inbox``: on the wire the list of items itself, newest first, read as
    ``{"items": LIST}``."""

    items: list[ScheduleInboxItem]


class OccurrenceDecision(Reply):
    """``schedule-fire`` and ``schedule-run-now``: what was decided of one occurrence
    (``outcome``: ``launched``, ``queued``, ``refused``, ``duplicate``, ``launch-failed``,
    or the state of a queued occurrence retried that no longer waits) and why. ``key``:
    the occurrence (None: a timer with no new elapse); ``blocked``: the decision blocked
    the schedule; a launched one's ``run_id``, ``revision`` and ``launch_hash``; a retried
    one's :class:`OccurrenceView` keys. A key with nothing to say is left out on the wire:
    cairnd dumps with ``exclude_unset``."""

    schedule_id: str
    trigger: str
    outcome: str
    reason: str
    key: str | None = None
    nominal: str | None = None
    blocked: bool = False
    run_id: str | None = None
    revision: int | None = None
    launch_hash: str | None = None
    state: str | None = None
    run_state: str | None = None
    at: str | None = None


class QueuedOccurrence(Reply):
    schedule_id: str
    key: str


class ScheduleReconcileReply(Reply):
    """``schedule-reconcile``: the caller's schedules (the timers their user manager must
    hold), how many half-prepared occurrences were repaired, and the queued occurrences to
    try again."""

    schedules: list[ScheduleView]
    repaired: int
    queued: list[QueuedOccurrence]
