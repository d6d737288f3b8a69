"""The three verbs. Each reads the run's pending intents of its class from the journal and
carries out the valid ones, deriving every path, UID and argv itself from the frozen
launch description and its own receipts. Intents are idempotent by ID: a repeated verb
returns the stored receipt and does nothing twice.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import btrfsutil

from cairn import paths, storage
from cairn.broker import candidate, hostfiles, pins, receipts, spare, units
from cairn.broker.pins import Attestation
from cairn.broker.receipts import Pin, ReceiptStore
from cairn.broker.remint import remint_q
from cairn.errors import BrokerRefused, CairnError, StorageError
from cairn.failpoints import failpoint
from cairn.journal.reader import JournalReader
from cairn.journal.rows import TERMINAL_RUN_STATES, fork_lanes
from cairn.protocol.broker import (
    AFTER_END_KINDS,
    VERB_OF_KIND,
    AgentStarted,
    AgentStopped,
    AppliedChecked,
    ApplyDone,
    B,
    CandidateBuilt,
    Checkpointed,
    CheckResult,
    CoordinatorStarted,
    Forked,
    ForkLane,
    Intent,
    MeasurementTaken,
    ProposalFrozen,
    ProposalVerified,
    QPrepared,
    RawBytes,
    Receipt,
    ReceiptBody,
    RunDeleted,
    StorageVerified,
    TrialChecked,
    WCreated,
    WDropped,
)
from cairn.protocol.launch import LaunchDescription
from cairn.protocol.measurement import EvaluatorRun

if TYPE_CHECKING:  # a type only: root loads no code it does not run
    from cairn.operation_kinds import OperationKind

log = logging.getLogger(__name__)

# Operation kinds the broker checks intents against: cairn.operations.AGENT and
# FORK_KINDS, spelled out because the broker does not load the registry (a unit test
# keeps them equal).
AGENT: OperationKind = "agent"
FORK_KINDS: tuple[OperationKind, ...] = ("parallel", "map")


def carry_out(
    verb: str,
    run_id: str,
    attestation: Attestation | None = None,
    service_uids: frozenset[int] = frozenset({0}),
) -> list[Receipt]:
    """Carry out every pending intent of ``verb`` for ``run_id``; return all its receipts.
    ``attestation``: the owner's word on the run's description (a launch or an upgrade),
    pinned before anything is done; ``service_uids`` may never attest."""
    journal_file = paths.journal_path()
    if not journal_file.exists():
        raise BrokerRefused("no journal", hint="start cairn.socket first")
    journal = JournalReader(journal_file)  # read-only; cairnd migrates, never the broker
    store = receipts.shared()
    try:
        desc, pin = pins.description(
            journal, store, run_id, verb, attestation, set(service_uids)
        )
        ended = journal.get_run(run_id).state in TERMINAL_RUN_STATES
        answered: list[Receipt] = []
        for intent in journal.intents(run_id, verb):
            if intent.run_id != run_id or VERB_OF_KIND[intent.kind] != verb:
                raise BrokerRefused(f"intent {intent.intent_id} does not belong to {verb}")
            done = store.get(run_id, intent.intent_id)
            if done is None and ended and intent.kind not in AFTER_END_KINDS:
                log.info("%s left undone: run %s has ended", intent.intent_id, run_id)
                continue
            if done is None:
                try:
                    body = handle_intent(intent, desc, pin, journal, store)
                except units.ChannelNotReady as exc:
                    log.info("%s left pending: %s", intent.intent_id, exc)
                    continue
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    raise StorageError(
                        f"storage pool {paths.pool_dir()} is full: {intent.kind} was not done",
                        hint="'cairn storage df' shows what each run holds; "
                        "'cairn rm RUN' or 'cairn prune' frees it",
                    ) from exc
                done = store.put(intent, body)
                log.info("%s %s done", intent.kind, intent.intent_id)
            answered.append(done)
        return answered
    finally:
        journal.close()


def handle_intent(
    intent: Intent,
    desc: LaunchDescription,
    pin: Pin | None,
    journal: JournalReader,
    store: ReceiptStore,
) -> ReceiptBody:
    """Carry out ``intent`` with the handler of its kind."""
    handler = HANDLERS[intent.kind]
    return handler(IntentContext(intent, desc, pin, journal, store))


class IntentContext:
    """What a handler may use: the intent, the launch description its owner attested and
    its pin (None only for a delete of a run never pinned), the journal (read) and the
    broker's own receipts."""

    def __init__(
        self,
        intent: Intent,
        desc: LaunchDescription,
        pin: Pin | None,
        journal: JournalReader,
        store: ReceiptStore,
    ) -> None:
        self.intent = intent
        self.desc = desc
        self.journal = journal
        self.store = store
        self.run_id = intent.run_id
        self._pin = pin

    @property
    def pin(self) -> Pin:
        if self._pin is None:
            raise BrokerRefused(f"{self.run_id} was never attested by its owner")
        return self._pin

    def check_project(self) -> os.stat_result:
        """The live project, still the directory the owner attested."""
        return pins.check_pinned_project(Path(self.desc.project.root), self.pin)

    def pool(self) -> storage.Pool:
        return storage.Pool.open(paths.pool_dir())

    def qgroup(self) -> int | None:
        """The run's level-1 qgroup where the host has quotas on (never turned on here)
        and the run's storage is its own, Q an import. A run whose Q snapshots a project
        on the pool's filesystem shares that project's extents: inheriting its snapshots
        into a qgroup of their own would leave the host's quota data inconsistent."""
        prepared = self.store.get(self.run_id, "prepare-q")
        if prepared is None or not prepared.body(QPrepared).imported:
            return None
        return self.pool().ensure_run_qgroup(self.run_id)

    def receipt(self, intent_id: str, model: type[B]) -> B:
        """The body of this run's receipt ``intent_id``, which must have been done."""
        receipt = self.store.get(self.run_id, intent_id)
        if receipt is None:
            raise BrokerRefused(f"{self.intent.intent_id} needs {intent_id}, which was not done")
        return receipt.body(model)

    def require_op(self) -> str:
        """The intent's operation must exist in the journal for this run."""
        if self.intent.op_id is None:
            raise BrokerRefused(f"{self.intent.intent_id} names no operation")
        op = self.journal.get_op_by_id(self.run_id, self.intent.op_id)
        if op.kind != AGENT:
            raise BrokerRefused(f"operation {op.op_id} is not an agent operation")
        return op.op_id

    def subpath(self) -> str:
        return self.receipt("prepare-q", QPrepared).subpath

    def make_run_dir(self, pool: storage.Pool) -> Path:
        """The run's directory in the pool. Only root traverses the run's subvolumes:
        units get them by bind mount, so no other user can list run IDs or read another
        user's workspace, checkpoints or proposal."""
        run_dir = pool.run_dir(self.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        for directory in (run_dir.parent, run_dir):
            os.chmod(directory, 0o700)
        return run_dir

    def checkpoint(self, op_id: str) -> storage.SubvolumeReceipt:
        """The receipt of this run's checkpoint S of ``op_id``, which must have been taken;
        for an intent of one of a fork's lanes, that fork's S counts too."""
        taken = self.checkpoints().get(op_id) or self.lane_start(op_id)
        return taken or self.receipt(f"checkpoint.{op_id}", Checkpointed).s

    def lane_start(self, op_id: str) -> storage.SubvolumeReceipt | None:
        """S of the fork ``op_id`` when the intent's scope is one of its lanes (the
        checkpoint the lane's W started from), from this broker's own fork receipt."""
        made = self.store.get(self.run_id, f"fork.{op_id}")
        if made is None or made.kind != "fork":
            return None
        forked = made.body(Forked)
        lanes = {f"{forked.op_id}-{key}" for key in forked.lanes}
        return forked.s if forked.op_id == op_id and self.intent.scope in lanes else None

    def checkpoints(self) -> dict[str, storage.SubvolumeReceipt]:
        """Every checkpoint S of this run by operation: taken here, or reminted from a
        replay's source."""
        found: dict[str, storage.SubvolumeReceipt] = {}
        for r in self.store.for_run(self.run_id):
            if r.kind == "checkpoint":
                found[r.body(Checkpointed).op_id] = r.body(Checkpointed).s
            elif r.kind == "prepare-q":
                found.update(r.body(QPrepared).reminted or {})
        return found


def check_generation_and_attempt(intent: Intent) -> None:
    """Refuse an intent whose generation or attempt number is out of range."""
    if not 1 <= intent.generation <= 10_000 or not 1 <= intent.attempt <= 100:
        raise BrokerRefused(f"{intent.intent_id}: generation/attempt out of range")


# --- storage-v1 ----------------------------------------------------------------------


def discard_interrupted(pool: storage.Pool, unit: str, *made: Path) -> None:
    """What an earlier broker left of this verb when it died in it (a crash of any run
    kills every verb in flight): the helper ``unit``, still running or not, is ended, and
    the subvolumes in ``made`` it was building are deleted. No receipt names them, so the
    retried verb starts from nothing."""
    left = [path for path in made if path.exists() or path.is_symlink()]
    if not left:
        return
    units.end_leftover(unit)
    for path in left:
        log.info("discarding %s, left by an interrupted %s", path, unit)
        pool.delete(path, pool.receipt(path))


def prepare_q(ctx: IntentContext) -> QPrepared:
    """Q: a snapshot of the project's subvolume when it lives on the pool's filesystem,
    otherwise an import made by a unit that runs as the project's owner."""
    if ctx.desc.replay is not None:
        return remint_q(ctx)
    project = Path(ctx.desc.project.root)
    st = ctx.check_project()
    pool = ctx.pool()
    ctx.make_run_dir(pool)
    q = pool.q_path(ctx.run_id)
    if storage.is_same_filesystem(project, pool.root):
        subvolume, subpath = storage.containing_subvolume(project)
        receipt = pool.snapshot(subvolume, q, read_only=True)
        return QPrepared(q=receipt, subpath=str(subpath), imported=False, project_ino=st.st_ino)
    staging = pool.q_import_path(ctx.run_id)
    # the import writes only into an empty subvolume
    discard_interrupted(pool, units.import_unit_name(ctx.run_id), q, staging)
    qgroup = pool.ensure_run_qgroup(ctx.run_id)
    pool.create_subvolume(staging, qgroup=qgroup)
    os.chown(staging, ctx.desc.owner_uid, ctx.desc.owner_gid)
    done: dict[str, Any] = {"import": units.run_import(ctx.desc, project, staging)}
    receipt = pool.snapshot(staging, q, read_only=True, qgroup=qgroup)
    pool.delete(staging, pool.receipt(staging))
    return QPrepared(
        q=receipt, subpath="", imported=True, project_ino=st.st_ino, **done
    )


def create_w(ctx: IntentContext) -> WCreated:
    check_generation_and_attempt(ctx.intent)
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, ctx.intent.scope, ctx.intent.generation)
    if ctx.intent.from_checkpoint:
        source = pool.checkpoint_path(ctx.run_id, ctx.intent.from_checkpoint)
        taken = ctx.checkpoint(ctx.intent.from_checkpoint)
        pool.verify(source, taken)
        swapped = spare.take_as_w(ctx, pool, w, taken)
        if swapped is not None:
            return swapped
    else:
        source = pool.q_path(ctx.run_id)
        taken = ctx.receipt("prepare-q", QPrepared).q
        pool.verify(source, taken)
    w.parent.mkdir(parents=True, exist_ok=True)
    receipt = pool.snapshot(source, w, read_only=False, qgroup=ctx.qgroup())
    os.chown(w, ctx.desc.owner_uid, ctx.desc.owner_gid)
    return WCreated(w=receipt, source_uuid=taken.uuid)


def checkpoint(ctx: IntentContext) -> Checkpointed:
    """S of W after the agent's unit is gone and its cgroup is empty (QUIESCE proven here,
    not taken on the coordinator's word)."""
    check_generation_and_attempt(ctx.intent)
    op_id = ctx.require_op()
    started = [
        body
        for body in (
            r.body(AgentStarted) for r in ctx.store.for_run(ctx.run_id) if r.kind == "start-agent"
        )
        if body.op_id == op_id
    ]
    if not started:
        raise BrokerRefused(f"no agent unit was started for {op_id}")
    units.require_quiesced(started[-1].unit, started[-1].control_group)
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, ctx.intent.scope, ctx.intent.generation)
    s = pool.checkpoint_path(ctx.run_id, op_id)
    s.parent.mkdir(parents=True, exist_ok=True)
    receipt = pool.snapshot(w, s, read_only=True, qgroup=ctx.qgroup())
    failpoint("broker-after-snapshot", paths.run_state_dir(ctx.run_id))
    return Checkpointed(s=receipt, op_id=op_id, changed=boundary_changed(ctx, pool, w, receipt))


def boundary_changed(
    ctx: IntentContext, pool: storage.Pool, w: Path, taken: storage.SubvolumeReceipt
) -> bool | None:
    """Whether the agent changed W: ``taken`` (S of ``w``) against the newest earlier
    checkpoint of the same W, else the subvolume W was made from (Q, a checkpoint, a
    fork's S), each found among this broker's own receipts and verified; None if none is,
    or btrfs send failed (logged: the boundary stands without it)."""
    checkpoints = ctx.checkpoints()  # taken here or reminted
    made = list(checkpoints.values())
    for r in ctx.store.for_run(ctx.run_id):
        if r.kind == "prepare-q":
            made.append(r.body(QPrepared).q)
        elif r.kind == "fork":
            made.append(r.body(Forked).s)
    # an operation's ID is its scope-seq: only the scope's own checkpoints can be of this W
    earlier = sorted((s for op, s in checkpoints.items() if s.uuid != taken.uuid
                      and op.rsplit("-", 1)[0] == ctx.intent.scope),
                     key=lambda s: s.generation, reverse=True)
    try:
        w_uuid, source = pool.receipt(w).uuid, storage.parent_uuid(w)
        base = next((c for c in earlier if _parent_or_none(Path(c.path)) == w_uuid),
                    None) or next((m for m in made if m.uuid == source), None)
        if base is None:
            log.warning("%s: no subvolume of this run to compare it with", w)
            return None
        pool.verify(Path(base.path), base)
        return storage.content_changed(Path(base.path), Path(taken.path))
    except CairnError as exc:
        log.warning("%s: not compared with where its agent began: %s", taken.path, exc.message)
        return None


def _parent_or_none(path: Path) -> str | None:
    """The subvolume ``path`` was made from, or None if it is gone (deleted since)."""
    try:
        return storage.parent_uuid(path)
    except CairnError:
        return None


def fork(ctx: IntentContext) -> Forked:
    """S of the parent's W at the fork, then one writable W per lane made from it."""
    check_generation_and_attempt(ctx.intent)
    if ctx.intent.op_id is None or not ctx.intent.lanes:
        raise BrokerRefused(f"{ctx.intent.intent_id} names no fork operation or no lanes")
    op = ctx.journal.get_op_by_id(ctx.run_id, ctx.intent.op_id)
    if op.kind not in FORK_KINDS or op.scope != ctx.intent.scope:
        raise BrokerRefused(f"{op.op_id} is not a fork of scope {ctx.intent.scope}")
    named = fork_lanes(op.request)
    if named is None or sorted(named) != sorted(ctx.intent.lanes):
        raise BrokerRefused(f"{ctx.intent.intent_id}: lanes differ from the journal's")
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, ctx.intent.scope, ctx.intent.generation)
    s = pool.checkpoint_path(ctx.run_id, op.op_id)
    s.parent.mkdir(parents=True, exist_ok=True)
    qgroup = ctx.qgroup()
    s_receipt = pool.snapshot(w, s, read_only=True, qgroup=qgroup)
    lanes: dict[str, ForkLane] = {}
    for key in ctx.intent.lanes:
        lane_w = pool.w_path(ctx.run_id, f"{op.op_id}-{key}", 1)
        lane_w.parent.mkdir(parents=True, exist_ok=True)
        receipt = pool.snapshot(s, lane_w, read_only=False, qgroup=qgroup)
        os.chown(lane_w, ctx.desc.owner_uid, ctx.desc.owner_gid)
        lanes[key] = ForkLane(w=receipt)
    return Forked(s=s_receipt, op_id=op.op_id, lanes=lanes)


def drop_w(ctx: IntentContext) -> WDropped:
    """Delete a W generation replaced by a restore or clean retry."""
    check_generation_and_attempt(ctx.intent)
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, ctx.intent.scope, ctx.intent.generation)
    pool.delete(w, w_receipt(ctx))
    return WDropped(deleted=str(w))


def w_receipt(ctx: IntentContext) -> storage.SubvolumeReceipt:
    """The receipt of the intent's W generation: its create-w, or for a lane's first W its
    fork."""
    made = ctx.store.get(ctx.run_id, f"create-w.{ctx.intent.scope}.{ctx.intent.generation}")
    created = None if made is None else made.body(WCreated).w
    if created is None:  # a lane's first W comes from its fork
        for receipt in ctx.store.for_run(ctx.run_id):
            if receipt.kind != "fork":
                continue
            forked = receipt.body(Forked)
            for key, lane in forked.lanes.items():
                if f"{forked.op_id}-{key}" == ctx.intent.scope:
                    created = lane.w
    if created is None:
        raise BrokerRefused(f"no receipt for W.{ctx.intent.generation} of {ctx.intent.scope}")
    return created


def freeze_proposal(ctx: IntentContext) -> ProposalFrozen:
    check_generation_and_attempt(ctx.intent)
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, "root", ctx.intent.generation)
    p = pool.settlement_path(ctx.run_id, "P")
    receipt = pool.snapshot(w, p, read_only=True, qgroup=ctx.qgroup())
    return ProposalFrozen(p=receipt)


def settle_candidate(ctx: IntentContext) -> CandidateBuilt:
    """C = Q + the allowed changes of P, built by the owner's candidate unit from the
    kernel's account of the changes; F = frozen C. Root only snapshots and passes bytes on."""
    pool = ctx.pool()
    q = pool.q_path(ctx.run_id)
    p = pool.settlement_path(ctx.run_id, "P")
    pool.verify(p, ctx.receipt("freeze-proposal", ProposalFrozen).p)
    source = candidate.change_source(q, p)
    c = pool.settlement_path(ctx.run_id, "C")
    f = pool.settlement_path(ctx.run_id, "F")
    # the candidate unit brings up a fresh snapshot of Q, never one it half changed
    discard_interrupted(pool, candidate.candidate_unit_name(ctx.run_id), f, c)
    qgroup = ctx.qgroup()
    work = pool.run_dir(ctx.run_id) / "scratch" / "candidate"
    unit, result, c_receipt = candidate.build_c(ctx.desc, pool, (q, p, c), qgroup,
                                                ctx.subpath(), source, work)
    try:
        f_receipt = pool.snapshot(c, f, read_only=True, qgroup=qgroup)
    except BaseException:
        candidate.discard_c(pool, c, c_receipt)
        raise
    built = result.model_dump()
    built["ignored"] = built["ignored"] or None  # a receipt without any keeps its old JSON
    return CandidateBuilt(**unit, **built, f=f_receipt, c=c_receipt)


def verify_storage(ctx: IntentContext) -> StorageVerified:
    """Cross-check the run's subvolumes against the receipts: every recorded subvolume
    still there and still itself, nothing on disk that no receipt explains, a checkpoint
    for every committed agent operation."""
    pool = ctx.pool()
    expected: dict[Path, storage.SubvolumeReceipt] = {}
    dropped: set[Path] = set()
    for receipt in ctx.store.for_run(ctx.run_id):
        if receipt.kind == "drop-w":
            dropped.add(Path(receipt.body(WDropped).deleted))
        if receipt.kind == "delete-run":
            left = [f"subvolume {p} outlived the run's deletion" for p in
                    pool.run_subvolumes(ctx.run_id)]
            return StorageVerified(problems=left, checked=0, deleted=True)
        for rec in receipt.typed_body().subvolumes():
            expected[Path(rec.path)] = rec
    dropped |= spare.gone(ctx.store.for_run(ctx.run_id))
    problems: list[str] = []
    for path, rec in sorted(expected.items()):
        if path in dropped:
            continue
        if not os.path.lexists(path):
            problems.append(f"missing subvolume {path} (uuid {rec.uuid})")
            continue
        try:
            pool.verify(path, rec)
        except CairnError as exc:
            problems.append(f"foreign subvolume at {path}: {exc}")
    for path in pool.run_subvolumes(ctx.run_id):
        if path not in expected and path != pool.q_import_path(ctx.run_id):
            problems.append(f"subvolume {path} has no receipt")
    checkpoints = set(ctx.checkpoints())
    for op in ctx.journal.list_ops(ctx.run_id):
        if (
            op.kind == AGENT
            and op.state in ("settled", "committed")
            and (op.op_id not in checkpoints)
        ):
            problems.append(f"{op.op_id} is {op.state} but has no checkpoint receipt")
    return StorageVerified(problems=problems, checked=len(expected))


# --- launch-v1 -----------------------------------------------------------------------


def start_coordinator(ctx: IntentContext) -> CoordinatorStarted:
    run = ctx.journal.get_run(ctx.run_id)
    if run.state in TERMINAL_RUN_STATES:  # e.g. failed at launch: never started later
        raise BrokerRefused(f"run {ctx.run_id} is {run.state}; its coordinator is not started")
    name = f"cairn-coordinator@{ctx.run_id}.service"
    units.set_egress_skipped(ctx.run_id, not ctx.desc.routes)  # before the unit pulls it in
    units.start_unit(name)
    return CoordinatorStarted(unit=name)


def start_agent(ctx: IntentContext) -> AgentStarted:
    check_generation_and_attempt(ctx.intent)
    op_id = ctx.require_op()
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, ctx.intent.scope, ctx.intent.generation)
    workspace = w / ctx.subpath() if ctx.subpath() else w
    checkpoints = {op: pool.checkpoint_path(ctx.run_id, op) for op in ctx.checkpoints()}
    op = ctx.journal.get_op_by_id(ctx.run_id, op_id)
    descriptor = op.request.get("descriptor")
    profile = units.agent_profile(ctx.desc, descriptor)
    files = hostfiles.check_profile(profile)
    return units.start_agent(
        ctx.desc,
        op_id,
        units.agent_network(ctx.desc, descriptor),
        ctx.intent.attempt,
        workspace,
        checkpoints,
        pool.run_dir(ctx.run_id) / "scratch" / op_id,
        profile_sha256=profile.sha256(),
        route=units.profile_route(ctx.desc, profile),
        profile_files=files,
    )


def stop_agent(ctx: IntentContext) -> AgentStopped:
    check_generation_and_attempt(ctx.intent)
    op_id = ctx.require_op()
    return units.stop_agent(ctx.desc, op_id, ctx.intent.attempt)


def start_apply(ctx: IntentContext) -> ApplyDone:
    candidate = ctx.receipt("settle-candidate", CandidateBuilt)
    pool = ctx.pool()
    ctx.check_project()
    done = units.run_apply(
        ctx.desc,
        ctx.intent.attempt,
        pool.q_path(ctx.run_id),
        pool.settlement_path(ctx.run_id, "F"),
        ctx.subpath(),
        list(candidate.accepted),
        pool.run_dir(ctx.run_id) / "scratch" / "apply",
    )
    return ApplyDone.model_validate(done)


def start_revert(ctx: IntentContext) -> ApplyDone:
    """Undo the run's apply: the apply unit with F as the base and Q as the target, over
    the paths the candidate accepted, so only paths still holding F go back to Q."""
    run = ctx.journal.get_run(ctx.run_id)
    if run.state not in TERMINAL_RUN_STATES:
        raise BrokerRefused(f"run {ctx.run_id} is {run.state}; only a finished run is reverted")
    candidate = ctx.receipt("settle-candidate", CandidateBuilt)
    ctx.receipt("start-apply.1", ApplyDone)
    pool = ctx.pool()
    f, q = pool.settlement_path(ctx.run_id, "F"), pool.q_path(ctx.run_id)
    if not (f.is_dir() and q.is_dir()):
        raise BrokerRefused(f"the snapshots of {ctx.run_id} were deleted; it cannot be reverted")
    ctx.check_project()
    done = units.run_apply(
        ctx.desc,
        ctx.intent.attempt,
        f,
        q,
        ctx.subpath(),
        list(candidate.accepted),
        pool.run_dir(ctx.run_id) / "scratch" / "revert",
        step="revert",
    )
    return ApplyDone.model_validate(done)


def check_applied(ctx: IntentContext) -> AppliedChecked:
    """For ``cairn doctor``: what the live project holds at every path the run's apply
    wrote, read by a unit that runs as the project's owner and writes nothing."""
    run = ctx.journal.get_run(ctx.run_id)
    if run.state not in TERMINAL_RUN_STATES:
        raise BrokerRefused(f"run {ctx.run_id} is {run.state}; only a finished run is checked")
    applied = ctx.receipt("start-apply.1", ApplyDone).result
    if applied is None:
        raise BrokerRefused(f"the apply receipt of {ctx.run_id} records no parsed result")
    pool = ctx.pool()
    f, q = pool.settlement_path(ctx.run_id, "F"), pool.q_path(ctx.run_id)
    if not (f.is_dir() and q.is_dir()):
        raise BrokerRefused(f"the snapshots of {ctx.run_id} were deleted; it cannot be checked")
    ctx.check_project()
    scratch = pool.run_dir(ctx.run_id) / "scratch"
    done = units.run_apply(
        ctx.desc,
        ctx.intent.attempt,
        q,
        f,
        ctx.subpath(),
        sorted({*applied.applied, *applied.already_applied}),
        scratch / "check-applied",
        step="check-applied",
        applied=(scratch / "apply") if (scratch / "apply").is_dir() else None,
    )
    return AppliedChecked.model_validate(done)


def verify_proposal(ctx: IntentContext) -> ProposalVerified:
    """Run the host's checks frozen in the launch description, each over a fresh writable
    snapshot of F that is deleted afterwards; stop at the first that fails."""
    ctx.receipt("settle-candidate", CandidateBuilt)
    pool = ctx.pool()
    f = pool.settlement_path(ctx.run_id, "F")
    workspace = pool.run_dir(ctx.run_id) / "verify"
    checks: list[CheckResult] = []
    for verifier in ctx.desc.verifiers:
        hostfiles.check_verifier(verifier)
        if storage.is_subvolume(workspace):  # left by a crash: a check may have changed it
            pool.delete(workspace, pool.receipt(workspace))
        made = pool.snapshot(f, workspace, read_only=False)
        try:
            project = workspace / ctx.subpath() if ctx.subpath() else workspace
            checks.append(units.run_check(ctx.desc, verifier, project, ctx.intent.attempt))
        finally:
            pool.delete(workspace, made)
        if not checks[-1].passed:
            break
    return ProposalVerified(checks=checks, passed=all(c.passed for c in checks))


MEASURE: OperationKind = "measure_proposal"
ERROR_OUTPUT_LIMIT = 2048  # the tail of a failed evaluator run's output its receipt keeps


def measure_checkpoint(ctx: IntentContext) -> MeasurementTaken:
    """Run the evaluator the journalled ``measure_proposal`` operation names (frozen in the
    launch description) over a fresh writable snapshot of the scope's W, deleted
    afterwards: its warm-ups, then its samples, each a unit; stop at the first run that
    fails or prints no metric line."""
    check_generation_and_attempt(ctx.intent)
    if ctx.intent.op_id is None:
        raise BrokerRefused(f"{ctx.intent.intent_id} names no operation")
    op = ctx.journal.get_op_by_id(ctx.run_id, ctx.intent.op_id)
    if op.kind != MEASURE or op.scope != ctx.intent.scope:
        raise BrokerRefused(f"{op.op_id} is not a measurement of scope {ctx.intent.scope}")
    named = op.request.get("evaluator")
    evaluator = next((e for e in ctx.desc.evaluators if e.name == named), None)
    if evaluator is None:
        raise BrokerRefused(f"{op.op_id}: evaluator {named!r} was not frozen at launch")
    hostfiles.check_evaluator(evaluator)
    pool = ctx.pool()
    w = pool.w_path(ctx.run_id, ctx.intent.scope, ctx.intent.generation)
    pool.verify(w, w_receipt(ctx))
    workspace = pool.run_dir(ctx.run_id) / "measure"
    if storage.is_subvolume(workspace):  # left by a crash: a run may have changed it
        pool.delete(workspace, pool.receipt(workspace))
    made = pool.snapshot(w, workspace, read_only=False)
    runs: list[EvaluatorRun] = []
    error = ""
    output = b""
    try:
        project = workspace / ctx.subpath() if ctx.subpath() else workspace
        for index in range(evaluator.warmups + evaluator.samples):
            name = f"cairn-measure-{ctx.run_id}-{op.op_id}-{ctx.intent.attempt}-{index}.service"
            run, output = units.run_evaluator(
                ctx.desc, evaluator, project, name, warmup=index < evaluator.warmups
            )
            runs.append(run)
            if run.values is None:
                error = f"{name} ended {run.result} (status {run.exit_status}) with no " \
                    "metric line"
                break
    finally:
        pool.delete(workspace, made)
    trial = None
    if not error:
        try:
            trial = check_trial(ctx, pool, w, op.op_id)
        except CairnError as exc:
            error, output = f"W's changes could not be checked: {exc.message}", b""
    return MeasurementTaken(
        op_id=op.op_id,
        environment=units.measurement_environment(evaluator),
        runs=runs,
        samples=[] if error else [r.values for r in runs if not r.warmup and r.values],
        error=error,
        output_raw=RawBytes.of(output, limit=ERROR_OUTPUT_LIMIT) if error and output else None,
        trial=trial,
    )


def check_trial(ctx: IntentContext, pool: storage.Pool, w: Path, op_id: str) -> TrialChecked:
    """W's changes since Q judged as the settlement would, by the owner's candidate unit
    without C, over a read-only snapshot of W deleted afterwards: a trial whose changes
    the settlement would refuse is no trial to accept (the coordinator decides)."""
    q = pool.q_path(ctx.run_id)
    pool.verify(q, ctx.receipt("prepare-q", QPrepared).q)
    trial = pool.run_dir(ctx.run_id) / "trial"
    if storage.is_subvolume(trial):  # left by a crash
        pool.delete(trial, pool.receipt(trial))
    made = pool.snapshot(w, trial, read_only=True)
    try:
        source = candidate.change_source(q, trial)
        work = pool.run_dir(ctx.run_id) / "scratch" / "trial"
        name = candidate.trial_unit_name(ctx.run_id, op_id, ctx.intent.attempt)
        return candidate.run_trial_check(ctx.desc, q, trial, ctx.subpath(), source, work, name)
    finally:
        pool.delete(trial, made)


# --- delete-v1 -----------------------------------------------------------------------


def delete_run(ctx: IntentContext) -> RunDeleted:
    """Every subvolume of a finished, settled run (its qgroup too); journal rows and
    receipts stay. The intent carries nothing but the run: anything else is refused."""
    if ctx.intent.model_dump(exclude={"run_id"}) != DELETE_INTENT:
        raise BrokerRefused(f"{ctx.intent.intent_id}: a delete names only the run")
    run = ctx.journal.get_run(ctx.run_id)
    if run.state not in TERMINAL_RUN_STATES:
        raise BrokerRefused(f"run {ctx.run_id} is {run.state}; only finished runs are deleted")
    receipts = ctx.store.for_run(ctx.run_id)
    frozen = any(r.kind == "freeze-proposal" for r in receipts)
    if frozen and run.settlement is None:
        raise BrokerRefused(f"run {ctx.run_id} has a proposal that was never settled")
    agents = [r.body(AgentStarted).unit for r in receipts if r.kind == "start-agent"]
    units.require_ended(
        [f"cairn-coordinator@{ctx.run_id}.service", *agents],
        f"run {ctx.run_id} has not ended; nothing is deleted",
    )
    proxy = units.remove_proxy(ctx.run_id)
    units.set_egress_skipped(ctx.run_id, False)
    deleted = ctx.pool().delete_run(ctx.run_id)
    pending = reclaim(ctx.pool().root, timeout=RECLAIM_WAIT)  # the next launch finds the space
    return RunDeleted(deleted=[str(p) for p in deleted], proxy_removed=proxy,
                      reclaim_pending=pending)


# How long a delete waits for Btrfs to return the space (cairnd waits 600 s for the verb).
RECLAIM_WAIT = 60.0


def reclaim(root: Path, timeout: float) -> int:
    """Have Btrfs's cleaner return the space of deleted subvolumes now (else it starts
    within a commit interval, 30 s) and wait up to ``timeout`` s; how many still wait."""
    deadline = time.monotonic() + timeout
    btrfsutil.sync(root)  # commits, and wakes the transaction thread that wakes the cleaner
    while (pending := len(btrfsutil.deleted_subvolumes(root))) and time.monotonic() < deadline:
        time.sleep(0.1)
    btrfsutil.sync(root)  # what the cleaner freed counts as free once committed
    return pending


# The one delete-run intent a run may have (cairnd's, daemon/lifecycle.py), less its run.
DELETE_INTENT: dict[str, object] = {
    "intent_id": "delete-run",
    "kind": "delete-run",
    "scope": "root",
    "op_id": None,
    "generation": 1,
    "attempt": 1,
    "from_checkpoint": None,
    "lanes": [],
}

HANDLERS = {
    "prepare-q": prepare_q,
    "create-w": create_w,
    "checkpoint": checkpoint,
    "drop-w": drop_w,
    "make-spare": spare.make_spare,
    "fork": fork,
    "verify-storage": verify_storage,
    "freeze-proposal": freeze_proposal,
    "settle-candidate": settle_candidate,
    "start-coordinator": start_coordinator,
    "start-agent": start_agent,
    "stop-agent": stop_agent,
    "start-apply": start_apply,
    "start-revert": start_revert,
    "check-applied": check_applied,
    "verify-proposal": verify_proposal,
    "measure-checkpoint": measure_checkpoint,
    "delete-run": delete_run,
}
