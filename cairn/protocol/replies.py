"""cairnd's replies, typed: the result of each op that has a model (the others are still
plain JSON), built by its handler in ``daemon/`` and read by the CLI (``typed`` in
:mod:`cairn.cli.client`) and the MCP server. A key a newer cairnd adds is ignored by an
older reader; the wire keeps each reply's shape (``ps`` sends ``PsReply``'s list)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from cairn.protocol.agent import Artifact, ArtifactRefused


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
    """One run as ``ps`` lists it; ``position``: a queued run's place in the queue."""

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
