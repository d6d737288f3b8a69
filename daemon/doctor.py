"""`cairn doctor`: cross-check the four authorities of each run — journal rows, Btrfs
subvolumes (through the broker, against its receipts), systemd units and settlement
receipts — and report every contradiction. It repairs nothing."""

from __future__ import annotations

import time
from typing import Any

from cairn.brokerclient import call_broker
from cairn.daemon.views import is_admin, visible_run
from cairn.errors import CairnError
from cairn.journal import TERMINAL_RUN_STATES, Journal, RunRow
from cairn.operations import BOUNDARY_KINDS
from cairn.protocol.broker import Intent, StorageVerified
from cairn.runlogs import run_units
from cairn.systemd import Systemd


def doctor(journal: Journal, run_id: str | None, uid: int) -> dict[str, Any]:
    if run_id:
        runs = [visible_run(journal, run_id, uid)]
    else:
        runs = journal.list_runs(None if is_admin(uid) else uid)
    report = [check_run(journal, run) for run in runs]
    return {"runs": report, "problems": sum(len(r["problems"]) for r in report)}


def check_run(journal: Journal, run: RunRow) -> dict[str, Any]:
    problems: list[str] = []
    receipts = journal.receipts(run.run_id)
    if any(r["kind"] in ("prepare-q",) for r in receipts):
        intent = Intent(
            intent_id=f"verify-storage.doctor.{time.time_ns()}",
            run_id=run.run_id,
            kind="verify-storage",
        )
        try:
            journal.add_intents(run.run_id, [intent], token=None)
            reply = call_broker("storage-v1", run.run_id, timeout=300)
            (verified,) = [r for r in reply.receipts if r.intent_id == intent.intent_id]
            problems += verified.body(StorageVerified).problems
        except CairnError as exc:
            problems.append(f"storage not verified: {exc}")
    with Systemd() as sd:
        for unit in run_units(receipts):
            state = sd.unit_state(unit)
            active = state is not None and state.active_state in ("active", "activating")
            if run.state in TERMINAL_RUN_STATES and active:
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
