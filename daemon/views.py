"""Read views for the CLI, rebuilt from one journal snapshot and authorized per caller."""

from __future__ import annotations

import grp
import re
from typing import Any

from cairn.errors import NotFound
from cairn.journal import Journal, RunRow
from cairn.operations.unroll import worklists
from cairn.proc import run
from cairn.settle_outcome import summary as settlement_summary

ADMIN_GROUP = "cairn-admin"
LOG_LINES = 2000


def is_admin(uid: int) -> bool:
    if uid == 0:
        return True
    import pwd

    try:
        group = grp.getgrnam(ADMIN_GROUP)
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return user.pw_name in group.gr_mem or user.pw_gid == group.gr_gid


def visible_run(journal: Journal, run_id: str | None, uid: int) -> RunRow:
    """The run, if the caller owns it or administers cairn; otherwise NotFound (never
    say whether another user's run exists)."""
    if not run_id:
        raise NotFound("no run given", hint="list runs with 'cairn ps'")
    try:
        row = journal.get_run(run_id)
    except NotFound:
        row = None
    if row is None or (row.owner_uid != uid and not is_admin(uid)):
        raise NotFound(f"no run {run_id}", hint="list your runs with 'cairn ps'")
    return row


def _current_op(journal: Journal, run_id: str) -> dict[str, Any] | None:
    ops = journal.list_ops(run_id)
    if not ops:
        return None
    last = ops[-1]
    return {"op_id": last.op_id, "kind": last.kind, "state": last.state}


def _divergence(events: list[Any]) -> dict[str, Any] | None:
    """The journal's and the replay's view of the call where replay diverged, if it did."""
    for event in reversed(events):
        if event.event == "replay-diverged":
            return {"op_id": event.op_id, **event.data}
    return None


def run_units(receipts: list[dict[str, Any]]) -> list[str]:
    """Every unit the broker started for the run, in order (import, agents, candidate,
    apply)."""
    names: list[str] = []
    for receipt in receipts:
        data = receipt.get("data", {})
        for holder in (data, data.get("import") or {}):
            unit = holder.get("unit")
            if isinstance(unit, str) and unit not in names:
                names.append(unit)
    return names


def storage_status(receipts: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the run's storage was deleted (``cairn rm``, ``cairn prune``), when, and how
    many subvolumes went; the journal rows and receipts stay."""
    for receipt in receipts:
        if receipt.get("kind") == "delete-run":
            deleted = receipt.get("data", {}).get("deleted", [])
            return {"deleted": True, "deleted_at": receipt.get("at"), "subvolumes": len(deleted)}
    return {"deleted": False, "deleted_at": None, "subvolumes": 0}


def ps(journal: Journal, uid: int, all_users: bool) -> list[dict[str, Any]]:
    owner = None if (all_users and is_admin(uid)) else uid
    runs = journal.list_runs(owner)
    return [
        {
            "run_id": r.run_id,
            "state": r.state,
            "definition": r.definition,
            "project": r.project,
            "owner_uid": r.owner_uid,
            "created_at": r.created_at,
            "current_op": _current_op(journal, r.run_id),
            "settlement_summary": settlement_summary(r.settlement),
        }
        for r in runs
    ]


def show(journal: Journal, run_id: str | None, uid: int) -> dict[str, Any]:
    row = visible_run(journal, run_id, uid)
    ops = journal.list_ops(row.run_id)
    receipts = journal.receipts(row.run_id)
    events = journal.events(row.run_id)
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
                "checkpoint": o.checkpoint,
                "error": o.error,
            }
            for o in ops
        ],
        "units": run_units(receipts),
        "storage": storage_status(receipts),
        "settlement": row.settlement,
        "settlement_summary": settlement_summary(row.settlement),
        "schedule": journal.launch_description(row.run_id).schedule,
        "worklists": worklists(ops),
        "divergence": _divergence(events),
        "events": [e.model_dump() for e in events[-50:]],
        "events_omitted": max(0, len(events) - 50),
    }


def log_units(run_id: str, receipts: list[dict[str, Any]]) -> list[str]:
    """The systemd units whose journal entries belong to the run: its coordinator and
    egress, and every unit the broker started for it whose name carries the run ID."""
    units = [f"cairn-coordinator@{run_id}.service", f"cairn-egress@{run_id}.service"]
    for unit in run_units(receipts):
        if not _run_unit_re(run_id).fullmatch(unit):
            continue
        # A socket unit's entries come from the service it activates.
        for name in (unit, unit.removesuffix(".socket") + ".service"):
            if name not in units:
                units.append(name)
    return units


def _run_unit_re(run_id: str) -> re.Pattern[str]:
    return re.compile(rf"cairn-[a-z]+-{run_id}(-[a-z0-9-]+)?\.(service|socket)")


def journal_matches(units: list[str]) -> list[str]:
    """journalctl matches on fields only journald and PID 1 set, never on a field a
    client can send (``CAIRN_RUN=`` is set by any process that writes to the journal):
    what the run's units logged, or PID 1 logged about them."""
    own = [f"_SYSTEMD_UNIT={u}" for u in units]
    about = ["_PID=1", *(f"UNIT={u}" for u in units)]
    return [*own, "+", *about]


def logs(journal: Journal, run_id: str | None, uid: int) -> str:
    row = visible_run(journal, run_id, uid)
    units = log_units(row.run_id, journal.receipts(row.run_id))
    proc = run(
        [
            "journalctl",
            "--no-pager",
            "-o",
            "short-iso",
            "-n",
            str(LOG_LINES),
            *journal_matches(units),
        ],
        check=False,
    )
    return proc.stdout.decode(errors="replace")


def diff(journal: Journal, run_id: str | None, uid: int) -> dict[str, Any]:
    row = visible_run(journal, run_id, uid)
    settlement = row.settlement or {}
    candidate = settlement.get("candidate", {})
    return {
        "run_id": row.run_id,
        "status": settlement.get("status", "not settled"),
        "summary": settlement_summary(row.settlement),
        "accepted": candidate.get("accepted", []),
        "refused": candidate.get("refused", []),
        "apply": settlement.get("apply"),
        "diff": candidate.get("diff", ""),
    }
