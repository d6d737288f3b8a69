"""A scope's hot spare (ARCHITECTURE §6): a writable snapshot of its best accepted
checkpoint, made when the checkpoint is accepted, that a reject's ``create-w`` from that
checkpoint takes by rename instead of snapshotting.

The spare lives beside the scope's W generations, where only root reaches it (the run
directory is 0700 and no unit binds it). It is taken only while it still looks like the
untouched snapshot of the checkpoint: the same subvolume as its receipt, still writable,
still a snapshot of the checkpoint, and with the generation its receipt recorded. Every
change to a subvolume's tree moves its generation once committed (a read's access-time
update too); a change still in the open transaction does not yet, but only root could
have made it. The receipt is taken after a commit, so the spare's own making never looks
like a change. Anything else falls back to a snapshot of the checkpoint.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import btrfsutil

from cairn import paths, storage
from cairn.errors import BrokerRefused, CairnError
from cairn.failpoints import failpoint
from cairn.protocol.broker import Receipt, WCreated

if TYPE_CHECKING:
    from cairn.broker.verbs import IntentContext
    from cairn.operation_kinds import OperationKind

log = logging.getLogger(__name__)

SETTLE: OperationKind = "settle_experiment"


def spare_path(pool: storage.Pool, run_id: str, scope: str, op_id: str) -> Path:
    """Where the spare the settlement ``op_id`` made for ``scope`` lives."""
    return pool.w_path(run_id, scope, 0).with_name(f"spare.{op_id}")


def made(ctx: IntentContext) -> list[tuple[str, storage.SubvolumeReceipt]]:
    """The spares made for the intent's scope, oldest first, by the settlement that made
    each (a make-spare receipt's body is the spare's ``WCreated``)."""
    return [
        (r.intent_id.removeprefix("spare."), r.body(WCreated).w)
        for r in ctx.store.for_run(ctx.run_id)
        if r.kind == "make-spare" and Path(r.body(WCreated).w.path).parent.name
        == ctx.intent.scope
    ]


def gone(receipts: list[Receipt]) -> set[Path]:
    """The spares ``verify-storage`` need not find: taken as a W (the W has the spare's
    UUID) or replaced by a later spare of their scope (whose make-spare deleted them)."""
    taken = {r.body(WCreated).w.uuid for r in receipts if r.kind == "create-w"}
    spares = [r.body(WCreated).w for r in receipts if r.kind == "make-spare"]
    latest = {Path(s.path).parent: s for s in spares}
    return {Path(s.path) for s in spares if s.uuid in taken or latest[Path(s.path).parent] != s}


def make_spare(ctx: IntentContext) -> WCreated:
    """The settlement's checkpoint as the scope's new spare, owned like W; the scope's
    older spares are deleted."""
    op_id, checkpoint = ctx.intent.op_id, ctx.intent.from_checkpoint
    if op_id is None or checkpoint is None or ctx.intent.intent_id != f"spare.{op_id}":
        raise BrokerRefused(f"{ctx.intent.intent_id}: a spare names its settlement and checkpoint")
    op = ctx.journal.get_op_by_id(ctx.run_id, op_id)
    if op.kind != SETTLE or op.scope != ctx.intent.scope or \
            (op.result or {}).get("checkpoint") != checkpoint:
        raise BrokerRefused(f"{op_id} did not settle scope {ctx.intent.scope} on {checkpoint}")
    pool = ctx.pool()
    source = pool.checkpoint_path(ctx.run_id, checkpoint)
    pool.verify(source, ctx.checkpoint(checkpoint))
    path = spare_path(pool, ctx.run_id, ctx.intent.scope, op_id)
    pool.snapshot(source, path, read_only=False, qgroup=ctx.qgroup())
    os.chown(path, ctx.desc.owner_uid, ctx.desc.owner_gid)
    btrfsutil.sync(os.fspath(path))  # the receipt's generation is the one an untouched spare keeps
    for older_op, older in made(ctx):
        older_path = spare_path(pool, ctx.run_id, ctx.intent.scope, older_op)
        if older_op != op_id and os.path.lexists(older_path):
            try:
                pool.delete(older_path, older)
            except CairnError as exc:  # not that spare any more: verify-storage reports it
                log.warning("left %s: %s", older_path, exc)
    return WCreated(w=pool.receipt(path), source_uuid=ctx.checkpoint(checkpoint).uuid)


def take_as_w(ctx: IntentContext, pool: storage.Pool, w: Path, checkpoint: storage.SubvolumeReceipt
         ) -> WCreated | None:
    """The scope's latest spare renamed to ``w`` if it is the untouched spare of
    ``checkpoint`` (or already renamed there before a crash), or None: snapshot instead."""
    spares = made(ctx)
    if not spares:
        return None
    op_id, spare = spares[-1]
    path = spare_path(pool, ctx.run_id, ctx.intent.scope, op_id)
    if os.path.lexists(w):
        current = storage.receipt(w)
        return WCreated(w=current, source_uuid=checkpoint.uuid) \
            if current.uuid == spare.uuid else None
    swapped = swap(path, spare, checkpoint, w, paths.run_state_dir(ctx.run_id))
    return None if swapped is None else WCreated(w=swapped, source_uuid=checkpoint.uuid)


def swap(path: Path, spare: storage.SubvolumeReceipt, checkpoint: storage.SubvolumeReceipt,
         w: Path, state_dir: Path) -> storage.SubvolumeReceipt | None:
    """Rename ``path`` to ``w`` and return W's receipt if ``path`` is the untouched spare
    ``spare`` of ``checkpoint``; None (logged why) if it is not."""
    problem = _untouched(path, spare, checkpoint)
    if problem:
        log.warning("spare %s not taken: %s; snapshotting instead", path, problem)
        return None
    os.rename(path, w)
    failpoint("broker-after-spare-rename", state_dir)
    return storage.receipt(w)
def _untouched(path: Path, spare: storage.SubvolumeReceipt,
               checkpoint: storage.SubvolumeReceipt) -> str:
    """Why ``path`` is not the untouched spare ``spare`` of ``checkpoint`` ('' if it is)."""
    try:
        current = storage.verify(path, spare)
    except CairnError as exc:
        return str(exc)
    if current.read_only:
        return "it is read-only"
    if current.generation != spare.generation:
        return f"it was written (generation {current.generation}, receipt {spare.generation})"
    try:
        if storage.parent_uuid(path) != checkpoint.uuid:
            return "it is not a snapshot of the checkpoint"
    except CairnError as exc:
        return str(exc)
    return ""
