"""cairnd's side of ``cairn checkpoints RUN``: every checkpoint S of a run, from the
broker's ``checkpoint`` receipts (and a replayed run's reminted ones) joined with the
operation each one froze.

Sizes are the exclusive bytes of the snapshot's level-0 qgroup, read from sysfs only where
the host already has Btrfs quotas on (``unknown`` otherwise; quotas are never turned on
for this). Once the run's storage was deleted its checkpoints are listed from the journal
with ``deleted`` set and no size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cairn import paths, retention, storage
from cairn.daemon.views import visible_run
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import Checkpointed, QPrepared, SubvolumeReceipt
from cairn.protocol.replies import CheckpointsReply, RunCheckpoint, StorageState
from cairn.views.run import storage_status

SizeOf = Callable[[int], int | None]


def checkpoints(
    journal: Journal, run_id: str | None, uid: int, *, size_of: SizeOf | None = None
) -> dict[str, Any]:
    """The run's checkpoints in the order they were taken, :class:`CheckpointsReply`.
    ``size_of`` maps a subvolume ID to its exclusive bytes (None: unknown); by default the
    pool's qgroups."""
    run = visible_run(journal, run_id, uid)
    receipts = journal.receipts(run.run_id)
    status = storage_status(receipts)
    ops = {op.op_id: op for op in journal.list_ops(run.run_id)}
    if size_of is None and not status["deleted"]:
        size_of = pool_sizes()
    listed = []
    for receipt in receipts:
        for op_id, s, reminted in taken(receipt):
            op = ops.get(op_id)
            listed.append(
                RunCheckpoint(
                    op_id=op_id,
                    kind=op.kind if op else None,
                    scope=op.scope if op else None,
                    attempt=op.attempt if op else None,
                    op_state=op.state if op else None,
                    at=receipt.get("at"),
                    path=s.path,
                    uuid=s.uuid,
                    subvol_id=s.subvol_id,
                    exclusive=None if status["deleted"] or size_of is None
                    else size_of(s.subvol_id),
                    deleted=status["deleted"],
                    reminted=reminted,
                )
            )
    return CheckpointsReply(
        run_id=run.run_id,
        state=run.state,
        storage=StorageState.model_validate(status),
        checkpoints=listed,
    ).model_dump(mode="json")


def taken(receipt: Mapping[str, object]) -> list[tuple[str, SubvolumeReceipt, bool]]:
    """The checkpoints one receipt records: a ``checkpoint``'s S, or the snapshots a
    replayed run's ``prepare-q`` reminted from its source (marked so)."""
    if receipt.get("kind") == "checkpoint":
        body = Checkpointed.model_validate(receipt["data"])
        return [(body.op_id, body.s, False)]
    if receipt.get("kind") == "prepare-q":
        prepared = QPrepared.model_validate(receipt["data"])
        return [(op_id, s, True) for op_id, s in (prepared.reminted or {}).items()]
    return []


def pool_sizes() -> SizeOf | None:
    """Exclusive bytes per subvolume ID from the pool's qgroups; None when the pool cannot
    be opened (the sizes are then unknown, the list is still the journal's)."""
    try:
        pool = storage.Pool.open(paths.pool_dir())
    except (CairnError, OSError):
        return None
    return lambda subvol_id: retention.subvolume_exclusive_bytes(pool, subvol_id)
