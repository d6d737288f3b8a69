"""What ``cairn show`` says about one run, built from one read snapshot of the journal.

:func:`run_view` reads every record it uses inside the caller's
:func:`~cairn.journal.snapshot.read_snapshot`, bounds the events it lists (saying how
many it left out) yet always names the latest event and the latest replay divergence, and
fails closed: records that contradict each other are listed under ``integrity`` and no
facet is built on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TypedDict

from cairn.errors import JournalError
from cairn.journal.people import ApprovalRow, QuestionRow
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES, OpRow, RunRow, StoredReceipt
from cairn.journal.snapshot import event_window, op_event_spans, readable_ops, retry_events
from cairn.operations import settle_experiment
from cairn.operations.spec import Contradiction
from cairn.operations.unroll import worklists
from cairn.protocol.jsonvalue import JSONObject, JSONValue, json_int, json_list
from cairn.protocol.launch import LaunchDescription
from cairn.protocol.settlement_record import SettlementRecord
from cairn.providers import MICROS_PER_CENT, money, today
from cairn.replay import latest_replay_point
from cairn.runlogs import run_units
from cairn.settle.outcome import summary as settlement_summary
from cairn.views import integrity

# How many of a run's events a view lists: its first ones (how it began) and its last.
FIRST_EVENTS = 25
LAST_EVENTS = 75


class StorageStatus(TypedDict):
    """Whether a run's storage was deleted (``deleted_at``: the receipt's ``at``)."""

    deleted: bool
    deleted_at: JSONValue
    subvolumes: int


def storage_status(receipts: list[StoredReceipt]) -> StorageStatus:
    """Whether the run's storage was deleted (``cairn rm``, ``cairn prune``), when, and how
    many subvolumes went; the journal rows and receipts stay."""
    for receipt in receipts:
        if receipt.get("kind") == "delete-run":
            deleted = json_list(receipt["data"].get("deleted", []))
            return {"deleted": True, "deleted_at": receipt.get("at"), "subvolumes": len(deleted)}
    return {"deleted": False, "deleted_at": None, "subvolumes": 0}


def question_facet(
    questions: list[QuestionRow], approvals: list[ApprovalRow]
) -> dict[str, object] | None:
    """The run's current open question or approval request (the oldest waiting one), and
    how many more wait behind it; ``None`` when nothing waits for a person."""
    waiting = sorted(
        [
            (q.created_at, {"kind": "question", "op_id": q.op_id, "question": q.question,
                            "schema": q.schema_name, "challenge": q.challenge})
            for q in questions
            if q.state == "waiting"
        ]
        + [
            (a.created_at, {"kind": "approval", "op_id": a.op_id, "request_id": a.request_id,
                            "fingerprint": a.fingerprint, "deadline": a.deadline})
            for a in approvals
            if a.state == "waiting"
        ],
        key=lambda pair: pair[0],
    )
    if not waiting:
        return None
    return {**waiting[0][1], "also_waiting": len(waiting) - 1}


def model_facet(journal: Journal, desc: LaunchDescription) -> JSONObject | None:
    """The run's model calls, tokens and, at the providers' prices, their cost, with the
    budgets they count against (money as the currency's units, ``"2.50"``); None before
    the run's first call."""
    spend = journal.model_spend(desc.run_id)
    if not spend.calls:
        return None
    limits = desc.limits
    priced = any(route.priced for route in desc.routes.values())
    daily = limits.daily_cost_cents
    return {
        "calls": spend.calls,
        "tokens": spend.tokens,
        "token_limit": limits.model_tokens,
        "cost": money(spend.cost_micros) if priced else None,
        "cost_limit": None if limits.model_cost_cents is None else
        money(limits.model_cost_cents * MICROS_PER_CENT),
        "owner_today": None if daily is None else
        money(journal.owner_cost_on(desc.owner_uid, today())),
        "daily_cost_limit": None if daily is None else money(daily * MICROS_PER_CENT),
    }


def replay_point(row: RunRow, ops: Sequence[OpRow], storage: StorageStatus) -> str | None:
    """Where ``cairn replay`` takes an ended run from (its latest checkpoint it accepts),
    while its storage is kept; None for a run still going or whose storage is gone."""
    if row.state not in TERMINAL_RUN_STATES or storage["deleted"]:
        return None
    return latest_replay_point(ops, row.run_id)


def run_view(journal: Journal, row: RunRow) -> dict[str, Any]:
    """The show view of ``row``'s run; call inside one read snapshot of ``journal``."""
    if not journal.db.in_transaction:
        raise JournalError("a run view is built inside one read snapshot of the journal")
    run_id = row.run_id
    ops, unreadable = readable_ops(journal, run_id)
    events = event_window(journal, run_id, head=FIRST_EVENTS, tail=LAST_EVENTS)
    questions, approvals = journal.questions(run_id), journal.approvals(run_id)
    receipts = journal.receipts(run_id)
    storage = storage_status(receipts)
    lists, list_problems = worklists(ops)
    problems: list[Contradiction] = [
        *integrity.unreadable_records([*unreadable, *events.unreadable]),
        *integrity.operation_order(ops, op_event_spans(journal, run_id)),
        *integrity.lineage(ops),
        *integrity.open_requests(ops, questions, approvals),
        *list_problems,
    ]
    try:
        settlement = SettlementRecord.read(row.settlement)
    except JournalError as exc:  # shown as what it is, not as no settlement at all
        problems.append(Contradiction("unreadable-record", None,
                                      f"runs row {run_id} settlement: {exc.message}"))
        settlement = None
    divergence = events.divergence
    origin = journal.launch_description(run_id).replay
    imported = set(origin.ops) if origin else set()
    retries: dict[str, list[JSONObject]] = {}
    for event in retry_events(journal, run_id):  # where each clean retry's W came from
        if "from_checkpoint" not in event.data:  # recorded before cairn kept it
            continue
        retries.setdefault(event.op_id or "", []).append({
            "attempt": json_int(event.data.get("failed_attempt", 0)) + 1,
            "w_generation": event.data.get("w_generation"),
            "from_checkpoint": event.data.get("from_checkpoint"),
            "source_uuid": event.data.get("source_uuid"),
        })
    return {
        "run": row.model_dump(exclude={"lease_holder", "lease_expires"}),
        "operations": [
            {
                "op_id": o.op_id,
                "scope": o.scope,
                "seq": o.seq,
                "kind": o.kind,
                "state": o.state,
                "attempt": o.attempt,
                "location": o.source_location,
                "request": o.request,
                "output": (o.result or {}).get("output"),
                "handoff": (o.result or {}).get("handoff"),
                "artifacts": (o.result or {}).get("artifacts"),
                "checkpoint": o.checkpoint,
                "error": o.error,
                "retries": retries.get(o.op_id, []),
                "imported_from": (
                    {"run_id": origin.source_run, "op_id": o.op_id}
                    if origin and o.op_id in imported else None
                ),
            }
            for o in ops
        ],
        "units": run_units(receipts),
        "storage": storage,
        "settlement": None if settlement is None else settlement.stored(),
        "settlement_summary": settlement_summary(settlement),
        "schedule": journal.launch_description(run_id).schedule,
        "replay_through": replay_point(row, ops, storage),
        "replayed_from": None if origin is None else {
            "run_id": origin.source_run, "through": origin.through_op, "imported": len(imported)
        },
        "worklists": lists,
        "experiments": settle_experiment.experiments(ops),
        "model": model_facet(journal, journal.launch_description(run_id)),
        "question": question_facet(questions, approvals),
        "divergence": None if divergence is None else {"op_id": divergence.op_id,
                                                       **divergence.data},
        "integrity": {"ok": not problems, "issues": [asdict(p) for p in problems]},
        "latest_event": None if events.latest is None else events.latest.model_dump(),
        "events": [e.model_dump() for e in (*events.head, *events.tail)],
        "events_total": events.total,
        "events_omitted": events.omitted,
        "events_shown": events.statement(),
        "progress": {
            phase: {**e.data, "at": e.at} for phase, e in journal.latest_progress(run_id).items()
        },
    }
