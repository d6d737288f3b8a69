"""Contradictions among a run's journal records, found by views.

A view claims only what the journal proves: where records contradict each other it
reports a :class:`~cairn.operations.spec.Contradiction` and builds nothing on them. Each
check is over records the journal writes together or in a fixed order, so a
contradiction means the journal was damaged or written by something other than cairn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cairn.journal.people import ApprovalRow, QuestionRow
from cairn.journal.rows import OpRow, fork_lanes
from cairn.journal.snapshot import OpEventSpan, Unreadable
from cairn.operations import FORK_KINDS
from cairn.operations.spec import Contradiction
from cairn.settle.outcome import SETTLEMENT_OP

ROOT_SCOPE = "root"


def unreadable_records(rows: Iterable[Unreadable]) -> list[Contradiction]:
    return [
        Contradiction(
            "unreadable-record",
            row.key if row.table == "operations" else None,
            f"{row.table} row {row.key} cannot be read: {row.reason}",
        )
        for row in rows
    ]


def operation_order(ops: Sequence[OpRow], spans: Iterable[OpEventSpan]) -> list[Contradiction]:
    """Operations finished before they started, and events of operations the journal
    does not hold. Order is the events' cursor, never their wall-clock time, which may
    step back between two writes."""
    known = {op.op_id for op in ops} | {SETTLEMENT_OP}
    found: list[Contradiction] = []
    for span in spans:
        if span.op_id not in known:
            found.append(
                Contradiction(
                    "event-without-operation",
                    span.op_id,
                    f"events name operation {span.op_id}, which the journal does not hold",
                )
            )
        elif span.finished is not None and (
            span.requested is None or span.finished < span.requested
        ):
            found.append(
                Contradiction(
                    "finished-before-started",
                    span.op_id,
                    f"{span.op_id} reached a final state at event {span.finished} before "
                    f"it was requested"
                    + ("" if span.requested is None else f" at event {span.requested}"),
                )
            )
    return found


def lineage(ops: Sequence[OpRow]) -> list[Contradiction]:
    """Operations whose parent is missing: a lane's scope with no fork that made it, a
    predecessor the journal does not hold."""
    known = {op.op_id for op in ops}
    lanes = {
        f"{op.op_id}-{lane}"
        for op in ops
        if op.kind in FORK_KINDS
        for lane in fork_lanes(op.request) or []
    }
    found: list[Contradiction] = []
    orphans: set[str] = set()
    for op in ops:
        if op.scope != ROOT_SCOPE and op.scope not in lanes and op.scope not in orphans:
            orphans.add(op.scope)
            found.append(
                Contradiction(
                    "lane-without-fork",
                    op.op_id,
                    f"{op.op_id} belongs to lane {op.scope}, which no flow.parallel or "
                    "flow.map of the journal forked",
                )
            )
        if op.predecessor is not None and op.predecessor not in known:
            found.append(
                Contradiction(
                    "missing-predecessor",
                    op.op_id,
                    f"{op.op_id} follows {op.predecessor}, which the journal does not hold",
                )
            )
    return found


def open_requests(
    ops: Sequence[OpRow], questions: Iterable[QuestionRow], approvals: Iterable[ApprovalRow]
) -> list[Contradiction]:
    """Waiting questions and approvals whose operation is missing or not waiting on them
    (the proposal of a run launched with ``--apply ask`` waits on the settlement, which is
    not an operation)."""
    state = {op.op_id: op.state for op in ops}
    found: list[Contradiction] = []
    for q in questions:
        if q.state == "waiting" and state.get(q.op_id) != "waiting":
            found.append(
                Contradiction(
                    "question-without-waiting-operation",
                    q.op_id,
                    f"a question waits on {q.op_id}, which is "
                    + state.get(q.op_id, "not in the journal"),
                )
            )
    for a in approvals:
        if a.state == "waiting" and a.op_id not in state and a.op_id != SETTLEMENT_OP:
            found.append(
                Contradiction(
                    "approval-without-operation",
                    a.op_id,
                    f"approval request {a.request_id} waits on {a.op_id}, which is not in "
                    "the journal",
                )
            )
    return found
