"""``prepare-q`` of a replayed run: the source's Q and the checkpoints of the imported
operations reminted as the new run's own read-only snapshots.

Nothing cairnd or the coordinator wrote is taken on its word. The source's description and
owner are root's own pin of it. The broker recomputes from
the source's journal which operations the replay imports (:func:`cairn.replay.select_imports`)
and requires the launch description to name exactly those; each imported row must be its
source's; the source must be a finished run of the same owner on the same project and
definition whose storage was not deleted; and every snapshot reminted must still be the
subvolume the broker's own receipt of the source names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cairn.errors import BrokerRefused, CairnError
from cairn.journal.rows import TERMINAL_RUN_STATES
from cairn.protocol.broker import Checkpointed, Forked, QPrepared, SubvolumeReceipt
from cairn.protocol.launch import LaunchDescription
from cairn.replay import same_identity, select_imports

if TYPE_CHECKING:
    from cairn.broker.verbs import IntentContext


def remint_q(ctx: IntentContext) -> QPrepared:
    """Remint the replay's source Q and imported checkpoints under the new run."""
    origin = ctx.desc.replay
    assert origin is not None
    source = origin.source_run
    if source == ctx.run_id:
        raise BrokerRefused(f"{ctx.run_id} cannot be replayed from itself")
    try:
        run = ctx.journal.get_run(source)
    except CairnError as exc:
        raise BrokerRefused(f"replay source {source}: {exc.message}") from exc
    source_pin = ctx.store.pin(source)  # root's own record, not the journal's claim
    if source_pin is None:
        raise BrokerRefused(f"replay source {source} was never attested by its owner")
    old = LaunchDescription.model_validate_json(source_pin.description)
    if not (source_pin.owner_uid == ctx.pin.owner_uid == ctx.desc.owner_uid):
        raise BrokerRefused(f"replay source {source} is not owned by the owner of {ctx.run_id}")
    if (source_pin.project_dev, source_pin.project_ino) != (
        ctx.pin.project_dev, ctx.pin.project_ino
    ):
        raise BrokerRefused(f"replay source {source} is another project or definition")
    if (old.project.root, old.review_hash, old.source) != (
        ctx.desc.project.root, ctx.desc.review_hash, ctx.desc.source
    ):
        raise BrokerRefused(f"replay source {source} is another project or definition")
    if run.state not in TERMINAL_RUN_STATES:
        raise BrokerRefused(f"replay source {source} is {run.state}, not finished")
    receipts = ctx.store.for_run(source)
    if any(r.kind == "delete-run" for r in receipts):
        raise BrokerRefused(f"the storage of replay source {source} was deleted")
    try:
        chosen = select_imports(ctx.journal.list_ops(source), source, origin.through_op)
    except CairnError as exc:
        raise BrokerRefused(f"replay of {source}: {exc.message}") from exc
    if [o.op_id for o in chosen] != origin.ops:
        raise BrokerRefused(f"{ctx.run_id} does not import exactly the boundary it names")
    imported = {o.op_id: o for o in ctx.journal.list_ops(ctx.run_id)}
    for op in chosen:
        mine = imported.get(op.op_id)
        if mine is None or not same_identity(mine, op):
            raise BrokerRefused(f"{ctx.run_id}'s {op.op_id} is not {source}'s operation")
    snapshots = source_checkpoints(ctx, source)
    if origin.through_op not in snapshots:
        raise BrokerRefused(f"{source} has no checkpoint of {origin.through_op}")
    prepared = next((r for r in receipts if r.intent_id == "prepare-q"), None)
    if prepared is None:
        raise BrokerRefused(f"replay source {source} has no Q")
    q = prepared.body(QPrepared)
    pool = ctx.pool()
    ctx.make_run_dir(pool)
    qgroup = pool.ensure_run_qgroup(ctx.run_id) if q.imported else None
    q_receipt = pool.remint(pool.q_path(source), q.q, pool.q_path(ctx.run_id), qgroup=qgroup)
    reminted = {
        op_id: pool.remint(
            pool.checkpoint_path(source, op_id), s, pool.checkpoint_path(ctx.run_id, op_id),
            qgroup=qgroup,
        )
        for op_id, s in sorted(snapshots.items())
        if op_id in origin.ops
    }
    return QPrepared(
        q=q_receipt,
        subpath=q.subpath,
        imported=q.imported,
        project_ino=q.project_ino,
        reminted=reminted,
    )


def source_checkpoints(ctx: IntentContext, source: str) -> dict[str, SubvolumeReceipt]:
    """Every checkpoint S the broker made for ``source``, by operation: agent boundaries,
    forks, and those a replayed source had reminted itself."""
    found: dict[str, SubvolumeReceipt] = {}
    for receipt in ctx.store.for_run(source):
        if receipt.kind == "checkpoint":
            done = receipt.body(Checkpointed)
            found[done.op_id] = done.s
        elif receipt.kind == "fork":
            forked = receipt.body(Forked)
            found[forked.op_id] = forked.s
        elif receipt.kind == "prepare-q":
            found.update(receipt.body(QPrepared).reminted or {})
    return found
