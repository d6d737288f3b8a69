"""`cairn doctor`: the host checks cairnd can see (:mod:`cairn.hostcheck`), and a
cross-check of the four authorities of each run — journal rows, Btrfs subvolumes (through
the broker, against its receipts), systemd units and settlement receipts — reporting every
contradiction. It repairs nothing.

For a finished run that applied paths, the broker's ``check-applied`` unit reads the live
project as its owner and says what each applied path holds: F's content, Q's (reverted),
or neither (a person changed it since: a warning with the path, not a problem). A run
whose storage was deleted is not checked against the live project (a note says so)."""

from __future__ import annotations

import time
from typing import NotRequired, TypedDict

from cairn import hostcheck, paths
from cairn.daemon.oneshot import carry_out_one
from cairn.daemon.views import is_admin, visible_run
from cairn.errors import CairnError
from cairn.hostcheck import HostCheck
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES, RunRow
from cairn.operations import BOUNDARY_KINDS
from cairn.protocol.broker import AppliedChecked, Intent, StorageVerified
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.settlement_record import SettlementRecord
from cairn.rawbytes import applied_check
from cairn.runlogs import run_units
from cairn.systemd import Systemd, wait_unit_gone
from cairn.views.run import storage_status


class AppliedCounts(TypedDict):
    """How many applied paths the live project holds as applied, reverted, changed."""

    as_applied: int
    reverted: int
    changed: int


class LiveCheck(TypedDict):
    """:func:`check_live`'s report."""

    problems: list[str]
    warnings: list[str]
    notes: list[str]
    applied: NotRequired[AppliedCounts]


class RunCheck(TypedDict):
    """One run's entry of the report: :func:`check_run`'s, with :func:`check_live`'s
    warnings, notes and counts added."""

    run_id: str
    state: str
    problems: list[str]
    warnings: NotRequired[list[str]]
    notes: NotRequired[list[str]]
    applied: NotRequired[AppliedCounts]


class DoctorReport(TypedDict):
    """:func:`doctor`'s reply."""

    host: list[JSONObject]
    credentials: dict[str, str]
    runs: list[RunCheck]
    problems: int


def doctor(journal: Journal, run_id: str | None, uid: int) -> DoctorReport:
    """One run's cross-checks; without ``run_id``, the host's checks that cairnd can see
    (``host``, with ``credentials``: the names the CLI looks for as root) and every run the
    caller may see. ``problems`` counts run problems and failed host checks."""
    if run_id:
        runs = [visible_run(journal, run_id, uid)]
        host: list[HostCheck] = []
        credentials: dict[str, str] = {}
    else:
        runs = journal.list_runs(None if is_admin(uid) else uid)
        host, credentials = host_checks()
    report = [check_run(journal, run) for run in runs]
    for entry, run in zip(report, runs, strict=True):
        live = check_live(journal, run)
        entry["problems"] += live["problems"]
        entry["warnings"] = live["warnings"]
        entry["notes"] = live["notes"]
        if "applied" in live:
            entry["applied"] = live["applied"]
    failed = sum(1 for c in host if c.status == "fail")
    return {
        "host": [c.model_dump() for c in host],
        "credentials": credentials,
        "runs": report,
        "problems": failed + sum(len(r["problems"]) for r in report),
    }


def host_checks() -> tuple[list[HostCheck], dict[str, str]]:
    """What cairnd can see of the host, as the user ``cairn``: sockets, pool and free
    space, the sealed release, ``/etc/cairn``, providers by name (never contacted)."""
    def active_state(unit: str) -> str | None:
        state = sd.unit_state(unit)
        return None if state is None else state.active_state

    try:
        with Systemd() as sd:
            checks = hostcheck.socket_checks(active_state)
    except CairnError as exc:
        checks = [HostCheck(check="systemd", status="fail", detail=f"cannot ask systemd: {exc}",
                            fix="journalctl -u cairn.service shows why")]
    checks += hostcheck.pool_checks(paths.pool_dir())
    checks.append(hostcheck.release_check(paths.release_dir(), hostcheck.release_key()))
    checks.append(hostcheck.config_check())
    providers, credentials = hostcheck.provider_checks()
    return checks + providers, credentials


# How long a unit of a run that has ended may still be going: its coordinator records the
# end, then closes the journal and exits.
ENDING_GRACE_SEC = 10.0


def check_run(journal: Journal, run: RunRow) -> RunCheck:
    problems: list[str] = []
    receipts = journal.receipts(run.run_id)
    if any(r["kind"] in ("prepare-q",) for r in receipts):
        intent = Intent(
            intent_id=f"verify-storage.doctor.{time.time_ns()}",
            run_id=run.run_id,
            kind="verify-storage",
        )
        try:
            verified = carry_out_one(journal, intent, "storage-v1", timeout=300)
            problems += verified.body(StorageVerified).problems
        except CairnError as exc:
            problems.append(f"storage not verified: {exc}")
    with Systemd() as sd:
        for unit in run_units(receipts):
            state = sd.unit_state(unit)
            active = state is not None and state.active_state in ("active", "activating")
            # the coordinator records the end, then exits: a unit still going a moment
            # after the run ended is on its way out, one still going after that is not
            if run.state in TERMINAL_RUN_STATES and active and not wait_unit_gone(
                sd, unit, max(0.0, run.updated_at + ENDING_GRACE_SEC - time.time())
            ):
                problems.append(
                    f"{unit} is still {state.active_state if state else ''} "
                    f"but the run is {run.state}"
                )
        coordinator = sd.unit_state(f"cairn-coordinator@{run.run_id}.service")
    if run.state == "running" and (
        coordinator is None or coordinator.active_state not in ("active", "activating")
    ):
        problems.append("the run is running but its coordinator is not")
    for op in journal.list_ops(run.run_id):
        if op.state == "committed" and op.checkpoint is None and op.kind in BOUNDARY_KINDS:
            problems.append(f"{op.op_id} is committed without a checkpoint")
    return {"run_id": run.run_id, "state": run.state, "problems": problems}


def check_live(journal: Journal, run: RunRow) -> LiveCheck:
    """What the live project holds at the paths the run applied: ``applied`` counts per
    state, ``warnings`` (a path changed since, a receipt that is not F's) and ``notes``
    (why the check was skipped), neither of which is a problem; ``problems``: the check
    could not run."""
    result: LiveCheck = {"problems": [], "warnings": [], "notes": []}
    settlement = SettlementRecord.read(run.settlement)
    if run.state not in TERMINAL_RUN_STATES or settlement is None or not settlement.apply.touched:
        return result
    receipts = journal.receipts(run.run_id)
    if storage_status(receipts)["deleted"]:
        result["notes"].append(
            "the live project was not checked: the run's storage was deleted"
        )
        return result
    attempt = 1 + sum(1 for r in receipts if r["kind"] == "check-applied")
    intent = Intent(
        intent_id=f"check-applied.{attempt}",
        run_id=run.run_id,
        kind="check-applied",
        attempt=attempt,
    )
    try:
        receipt = carry_out_one(journal, intent, "launch-v1", timeout=3600)
    except CairnError as exc:
        result["problems"].append(f"live project not checked: {exc}")
        return result
    try:
        checked = applied_check(receipt.body(AppliedChecked))
    except CairnError as exc:
        result["problems"].append(f"live project not checked: {exc}")
        return result
    result["applied"] = {
        "as_applied": len(checked.as_applied),
        "reverted": len(checked.reverted),
        "changed": len(checked.changed),
    }
    result["warnings"] += [
        f"{path} in the live project is neither the run's result nor what it replaced "
        "(changed since the apply)"
        for path in checked.changed
    ]
    result["warnings"] += [
        f"{path}: the apply's receipt does not match the run's proposal F"
        for path in checked.receipt_differs
    ]
    return result
