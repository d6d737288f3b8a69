"""Which operations ``cairn replay SOURCE --through OP`` imports, and when it refuses.

One function decides for cairnd (before it records the new run) and for the broker
(which recomputes the selection from the source's journal before it remints a snapshot,
taking nothing of the daemon's word): the root-level operations up to and including OP,
and every operation of the lanes of an imported fork, so a lane never comes without its
siblings and its join.
"""

from __future__ import annotations

from collections.abc import Sequence

from cairn.errors import NotFound, UsageError
from cairn.journal.rows import OpRow

ROOT = "root"
# Operations whose checkpoint S a new root W can be made from: an agent's boundary, or a
# fork's S (the parent's W, which the join leaves unchanged).
BOUNDARY_KINDS = ("agent", "parallel", "map")
# States a lane operation of a joined fork can end in; anything else is still open.
FINAL_LANE_STATES = ("committed", "failed", "not-started")


def root_fork_of(scope: str, root_ops: Sequence[OpRow]) -> OpRow | None:
    """The root-level fork whose lanes (or their nested lanes) ``scope`` belongs to."""
    for op in root_ops:
        if op.kind in BOUNDARY_KINDS[1:] and scope.startswith(op.op_id + "-"):
            return op
    return None


def select_imports(ops: Sequence[OpRow], run_id: str, through: str) -> list[OpRow]:
    """The source's operations a replay through ``through`` imports, in (scope, seq)
    order; a :class:`UsageError` naming the next step when ``through`` is not a committed
    root-level boundary of a complete prefix."""
    root_ops = sorted((o for o in ops if o.scope == ROOT), key=lambda o: o.seq)
    boundaries = [o.op_id for o in root_ops if o.kind in BOUNDARY_KINDS and o.state == "committed"]
    listed = ", ".join(boundaries[-8:]) or "none"
    target = next((o for o in ops if o.op_id == through), None)
    if target is None:
        raise NotFound(
            f"run {run_id} has no operation {through}",
            hint=f"pick a root-level boundary: {listed}",
        )
    if target.scope != ROOT:
        fork = root_fork_of(target.scope, root_ops)
        join = f" (replay through its fork {fork.op_id})" if fork else ""
        raise UsageError(
            f"{through} is inside a lane; a lane cannot be replayed without its siblings "
            f"and join{join}",
            hint=f"pick a root-level boundary: {listed}",
        )
    if target.kind not in BOUNDARY_KINDS or target.state != "committed":
        raise UsageError(
            f"{through} is a {target.state} {target.kind} operation, not a committed "
            f"boundary with a checkpoint",
            hint=f"pick a root-level boundary: {listed}",
        )
    chosen = [o for o in root_ops if o.seq <= target.seq]
    open_ops = [o.op_id for o in chosen if o.state != "committed"]
    if open_ops:
        raise UsageError(
            f"{', '.join(open_ops)} before {through} did not commit; the boundary is incomplete",
            hint=f"pick an earlier root-level boundary: {listed}",
        )
    forks = [o for o in chosen if o.kind in BOUNDARY_KINDS[1:]]
    lanes = [o for o in ops if o.scope != ROOT and root_fork_of(o.scope, forks) is not None]
    unfinished = [o.op_id for o in lanes if o.state not in FINAL_LANE_STATES]
    if unfinished:
        raise UsageError(
            f"lane operations {', '.join(unfinished[:5])} never finished; their join is "
            f"incomplete",
            hint=f"pick an earlier root-level boundary: {listed}",
        )
    return sorted([*chosen, *lanes], key=lambda o: (o.scope, o.seq))


def latest_replay_point(ops: Sequence[OpRow], run_id: str) -> str | None:
    """The latest root-level boundary ``cairn replay`` accepts for a run with ``ops``
    (what retrying a failed run starts from); None when there is none."""
    committed = sorted((o for o in ops if o.scope == ROOT and o.kind in BOUNDARY_KINDS
                        and o.state == "committed"), key=lambda o: o.seq, reverse=True)
    for op in committed:
        try:
            select_imports(ops, run_id, op.op_id)
        except UsageError:
            continue
        return op.op_id
    return None


def same_identity(imported: OpRow, source: OpRow) -> bool:
    """Whether an imported operation is its source's: the replay identity (ARCHITECTURE
    §5), its state and its result."""
    fields = ("scope", "seq", "op_id", "kind", "request_hash", "source_location",
              "predecessor", "attempt", "state", "result", "finish", "checkpoint")
    return all(getattr(imported, f) == getattr(source, f) for f in fields)
