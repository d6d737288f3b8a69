"""Boot-time reconciler: runs that should be active get their coordinator back.

Waiting, blocked, queued and finished runs stay as they are (cairnd's admission thread,
:mod:`cairn.daemon.admission`, starts queued runs as slots free). A run whose launch never
finished (no coordinator took it, and the launch recorded no receipt) ends ``failed``: a
launch is all or nothing. Half-done broker intents need no special care here: the
restarted coordinator repeats its verbs, and the broker finishes each intent exactly once
by its receipts.
"""

from __future__ import annotations

import logging

from cairn.brokerclient import call_broker
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import RunRow
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


UNFINISHED_LAUNCH = (
    "the launch did not finish (cairnd stopped before the broker started the run); "
    "launch it again"
)


def launch_unfinished(journal: Journal, run: RunRow, *, created_before: float) -> bool:
    """A run an earlier cairnd recorded (before ``created_before``, when this one started)
    that no coordinator ever took, without the receipt of its launch's
    ``start-coordinator``: its launch was cut short, so nobody was told it started. (A
    run this cairnd is launching right now looks the same, so it is never judged.)

    A run that joined the queue is not such a run: its owner was told it starts later, and
    it was pinned on their word. Queued, it waits for a slot; admitted, it is started. A
    ``queued`` run that never joined the queue (cairnd stopped before the broker pinned
    it) was cut short like any other launch."""
    if run.state not in ("pending", "queued") or run.lease_token != 0:
        return False
    if run.created_at >= created_before or journal.was_queued(run.run_id):
        return False
    if run.state == "queued":
        return True
    return not any(r.get("intent_id") == "start-coordinator" for r in journal.receipts(run.run_id))


def reconcile(journal: Journal, *, started_at: float) -> list[str]:
    """Start the coordinator of every run that should be active and has none; return them.
    ``started_at``: when this cairnd started, before it took any request."""
    restarted: list[str] = []
    with Systemd() as sd:
        for run in journal.list_runs(None, limit=100_000):
            if launch_unfinished(journal, run, created_before=started_at):
                journal.fail_unstarted_run(run.run_id, UNFINISHED_LAUNCH)
                log.error("%s: %s", run.run_id, UNFINISHED_LAUNCH)
                continue
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
