"""Read views for the CLI, rebuilt from one journal snapshot and authorized per caller."""

from __future__ import annotations

import grp
from typing import Any

from cairn.admission import queue_positions
from cairn.errors import CairnError, NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES, OpRow, RunRow
from cairn.journal.snapshot import read_snapshot
from cairn.proc import run
from cairn.protocol.daemon import LogsRequest
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.replies import CurrentOperation, PsReply, RunListing, SettlementSummary
from cairn.protocol.settlement_record import SettlementRecord
from cairn.protocol.view_replies import DiffReply, LogsReply
from cairn.runlogs import journalctl_argv, log_units, operation_units, split_cursor
from cairn.settle.outcome import summary as settlement_summary
from cairn.views.run import replay_point, run_view, storage_status

ADMIN_GROUP = "cairn-admin"
LOG_TIMEOUT = 60.0


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


def _current_op(ops: list[OpRow]) -> CurrentOperation | None:
    if not ops:
        return None
    last = ops[-1]
    return CurrentOperation(op_id=last.op_id, kind=last.kind, state=last.state)


def _retry_point(journal: Journal, run: RunRow, ops: list[OpRow]) -> str | None:
    """Where a failed run is retried from: its latest checkpoint ``cairn replay`` takes,
    while its storage is kept (None otherwise)."""
    if run.state != "failed":  # the others are left out: ps reads every run
        return None
    return replay_point(run, ops, storage_status(journal.receipts(run.run_id)))


def ps(journal: Journal, uid: int, all_users: bool) -> list[JSONObject]:
    """The caller's runs (every user's for an administrator who asks), :class:`PsReply`:
    on the wire its list of runs."""
    owner = None if (all_users and is_admin(uid)) else uid
    with read_snapshot(journal):
        return _ps_rows(journal, journal.list_runs(owner))


def queue_position(journal: Journal) -> dict[str, int]:
    """Each queued run's place in the machine-wide queue (1 = next to start)."""
    queued, holding = journal.queue_snapshot()
    return queue_positions(queued, holding)


def _ps_rows(journal: Journal, runs: list[RunRow]) -> list[JSONObject]:
    positions = queue_position(journal) if any(r.state == "queued" for r in runs) else {}
    replays = journal.replays_of([r for r in runs if r.state == "failed"])
    listed = []
    for r in runs:
        ops = journal.list_ops(r.run_id)
        listed.append(RunListing(
            run_id=r.run_id,
            state=r.state,
            position=positions.get(r.run_id),
            definition=r.definition,
            project=r.project,
            owner_uid=r.owner_uid,
            created_at=r.created_at,
            run_key=r.run_key,
            current_op=_current_op(ops),
            settlement_summary=_summary(r),
            error=r.error,
            replay_through=_retry_point(journal, r, ops),
            replayed_by=replays.get(r.run_id, []),
        ))
    rows: list[JSONObject] = PsReply(runs=listed).model_dump(mode="json")["runs"]
    return rows


def _summary(run: RunRow) -> SettlementSummary | None:
    summary = settlement_summary(SettlementRecord.read(run.settlement))
    return None if summary is None else SettlementSummary.model_validate(summary)


def show(journal: Journal, run_id: str | None, uid: int) -> dict[str, Any]:
    """The run's view (:func:`cairn.views.run.run_view`), read from one snapshot; a
    queued run's with its ``position`` in the machine-wide queue."""
    with read_snapshot(journal):
        row = visible_run(journal, run_id, uid)
        view = run_view(journal, row)
        if row.state == "queued":
            view["run"]["position"] = queue_position(journal).get(row.run_id)
        return view


def logs(journal: Journal, request: LogsRequest, uid: int) -> JSONObject:
    """What the run's units logged, as journalctl formats it, with the cursor to follow
    from and whether the run has ended (``cairn logs -f`` stops then): :class:`LogsReply`."""
    row = visible_run(journal, request.run_id, uid)
    units = log_units(row.run_id, journal.receipts(row.run_id))
    if request.op_id is not None:
        units = operation_units(row.run_id, request.op_id, units)
        if not units:
            raise NotFound(
                f"operation {request.op_id} of {row.run_id} started no agent unit",
                hint=f"'cairn show {row.run_id}' lists its operations",
            )
    proc = run(journalctl_argv(units, request), check=False, timeout=LOG_TIMEOUT)
    if proc.returncode != 0:
        raise journalctl_failed(proc.stderr.decode(errors="replace"), request)
    text, cursor = split_cursor(proc.stdout.decode(errors="replace"), request)
    reply = LogsReply(run_id=row.run_id, state=row.state,
                      finished=row.state in TERMINAL_RUN_STATES, text=text, cursor=cursor)
    return reply.model_dump(mode="json")


def journalctl_failed(stderr: str, request: LogsRequest) -> CairnError:
    """journalctl's refusal as one line; a time it cannot read is the caller's mistake."""
    last = (stderr.strip().splitlines() or ["journalctl failed"])[-1]
    given = [(o, v) for o, v in (("--since", request.since), ("--until", request.until)) if v]
    if given and "timestamp" in last.lower():
        # journalctl names the value it could not read; else the one time given
        option, value = next(((o, v) for o, v in given if v in last), given[0])
        return UsageError(
            f"{option} {value!r} is not a time journalctl can read",
            hint=f"e.g. {option} '1 hour ago', {option} today, {option} '2026-01-02 10:00'",
        )
    if request.grep is not None and ("pattern" in last.lower() or "regex" in last.lower()):
        return UsageError(f"--grep {request.grep!r}: {last}",
                          hint="a PCRE2 pattern, e.g. --grep 'error|warning'")
    return CairnError(f"journalctl: {last}", hint="see 'journalctl -u cairn.service'")


def diff(journal: Journal, run_id: str | None, uid: int) -> JSONObject:
    """What the run's settlement put into C, refused, ignored and applied, with the diff
    of the accepted paths: :class:`DiffReply`."""
    row = visible_run(journal, run_id, uid)
    settlement = SettlementRecord.read(row.settlement)
    if settlement is None:
        reply = DiffReply(run_id=row.run_id, status="not settled", summary=None, accepted=[],
                          refused=[], ignored=[], apply=None, diff="")
    else:
        reply = DiffReply.model_validate({
            "run_id": row.run_id,
            "status": settlement.status,
            "summary": settlement_summary(settlement),
            "accepted": settlement.candidate_list("accepted"),
            "refused": settlement.candidate_list("refused"),
            "ignored": settlement.candidate_list("ignored"),
            "apply": settlement.apply,
            "diff": str((settlement.candidate or {}).get("diff", "")),
        })
    return reply.model_dump(mode="json")
