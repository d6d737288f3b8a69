"""`cairn revert RUN`: undo a finished run's apply in the live project.

A revert is the apply run backwards: F is the base and Q the target, over the paths the
candidate accepted. A path that still holds F gets Q back, a path that already holds Q is
left alone, and any other live state is a named conflict; with a conflict nothing is
written. The broker's apply unit does the work as the project's owner
(``start-revert`` under ``launch-v1``); each attempt is a new intent, so a revert that
met a conflict can be tried again once the person has sorted the file out.
"""

from __future__ import annotations

from cairn.daemon.oneshot import carry_out_one
from cairn.daemon.views import visible_run
from cairn.errors import UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES
from cairn.protocol.broker import ApplyDone, Intent
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.replies import RevertReply
from cairn.protocol.settlement_record import SettlementRecord
from cairn.rawbytes import apply_result


def revert(journal: Journal, run_id: str | None, uid: int) -> JSONObject:
    """Revert the run's apply, :class:`RevertReply`; a conflict writes nothing."""
    run = visible_run(journal, run_id, uid)
    if run.state not in TERMINAL_RUN_STATES:
        raise UsageError(
            f"run {run.run_id} is {run.state}; only a finished run can be reverted",
            hint=f"wait for it to finish, or stop it with 'cairn stop {run.run_id}'",
        )
    settlement = SettlementRecord.read(run.settlement)
    if settlement is None or not settlement.apply.touched:
        raise UsageError(
            f"run {run.run_id} applied nothing to the live project; there is nothing to revert",
            hint=f"see its settlement with 'cairn diff {run.run_id}'",
        )
    receipts = journal.receipts(run.run_id)
    attempt = 1 + sum(1 for r in receipts if r["kind"] == "start-revert")
    intent = Intent(
        intent_id=f"start-revert.{attempt}",
        run_id=run.run_id,
        kind="start-revert",
        attempt=attempt,
    )
    receipt = carry_out_one(journal, intent, "launch-v1", timeout=3600)
    result = apply_result(receipt.body(ApplyDone))
    journal.record_revert(run.run_id, result, actor_uid=uid)
    reply = RevertReply.model_validate(
        {"run_id": run.run_id, "unit": receipt.body(ApplyDone).unit,
         **result.model_dump(mode="json")}
    )
    return reply.model_dump(mode="json")
