"""Which checkpoint a scope's W holds at a point of its run (ARCHITECTURE §5): the one
function a clean retry (automatic or ``cairn retry``), a measurement's record and a reject's
restore take it from.

Only an agent writes W, and nothing but a restore replaces it, so W of a scope just before
call ``seq`` is the checkpoint S of the last agent boundary committed there before it, or
the checkpoint a later reject or ``flow.restore`` restored. Markers, questions,
measurements, accepts, forks and joins leave W as it was. Before any of these a lane's W is
its fork's S; the root W is Q, or, in a run replayed through a fork, that fork's reminted S
(``None`` stands for Q). The operation's predecessor in the journal is an identity field,
not a checkpoint: it may be any kind.
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.journal.rows import OpRow, fork_lanes
from cairn.protocol.jsonvalue import json_str_or_none

AGENT = "agent"
FORK_KINDS = ("parallel", "map")
SETTLE = "settle_experiment"
RESTORE = "restore"


def lane_fork(ops: Iterable[OpRow], scope: str) -> str | None:
    """The fork operation ``scope`` is a lane of (None: the root scope)."""
    for op in ops:
        if op.kind in FORK_KINDS and scope in {
            f"{op.op_id}-{key}" for key in fork_lanes(op.request) or []
        }:
            return op.op_id
    return None


def restore_point(
    ops: Iterable[OpRow], scope: str, seq: int, *, replayed_through: str | None = None
) -> str | None:
    """The operation whose checkpoint S ``scope``'s W holds just before its call ``seq``
    (None: Q). ``replayed_through``: the operation a replayed run's root W was made from."""
    ops = list(ops)
    held = lane_fork(ops, scope) if scope != "root" else None
    earlier = sorted((o for o in ops if o.scope == scope and o.seq < seq), key=lambda o: o.seq)
    for op in earlier:
        if op.op_id == replayed_through and scope == "root":
            held = op.op_id  # imported: the new W was made from its S
        elif op.kind == AGENT and op.state == "committed":
            held = op.op_id
        elif op.kind == SETTLE and op.state in ("settled", "committed"):
            result = op.result or {}
            if result.get("disposition") == "rejected":
                held = json_str_or_none(result.get("checkpoint"))
        elif op.kind == RESTORE and op.state in ("settled", "committed"):
            held = json_str_or_none((op.result or {}).get("boundary"))
    return held
