"""Boot-time reconciler: runs that should be active get their coordinator back.

Waiting, blocked and finished runs stay as they are. Half-done broker intents need no
special care here: the restarted coordinator repeats its verbs, and the broker finishes
each intent exactly once by its receipts.
"""

from __future__ import annotations

import logging

from cairn.brokerclient import call_broker
from cairn.errors import CairnError
from cairn.journal import Journal
from cairn.protocol.broker import Intent
from cairn.systemd import Systemd

log = logging.getLogger(__name__)

ACTIVE_STATES = ("pending", "running")


def coordinator_unit(run_id: str) -> str:
    return f"cairn-coordinator@{run_id}.service"


def restart_coordinator(journal: Journal, run_id: str) -> str:
    """Queue a new start-coordinator intent and have the broker carry it out."""
    starts = [i for i in journal.intents(run_id, "launch-v1") if i.kind == "start-coordinator"]
    intent = Intent(
        intent_id=f"start-coordinator.{len(starts) + 1}", run_id=run_id, kind="start-coordinator"
    )
    journal.add_intents(run_id, [intent], token=None)
    call_broker("launch-v1", run_id, timeout=120)
    return intent.intent_id


def reconcile(journal: Journal) -> list[str]:
    """Start the coordinator of every run that should be active and has none; return them."""
    restarted: list[str] = []
    with Systemd() as sd:
        for run in journal.list_runs(None, limit=100_000):
            if run.state not in ACTIVE_STATES:
                continue
            state = sd.unit_state(coordinator_unit(run.run_id))
            if state is not None and state.active_state in ("active", "activating", "reloading"):
                continue
            try:
                intent_id = restart_coordinator(journal, run.run_id)
            except CairnError as exc:
                log.error("could not restart the coordinator of %s: %s", run.run_id, exc)
                continue
            journal.append_event(run.run_id, "reconciled", {"intent": intent_id})
            log.info("restarted the coordinator of %s", run.run_id)
            restarted.append(run.run_id)
    return restarted
