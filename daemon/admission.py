"""One admission for every launch (:mod:`cairn.admission`): the queue of runs waiting for
a machine-wide slot, and the thread that starts them as slots free.

Every launch — ``cairn launch``, MCP, a replay, an admitted schedule occurrence — records
its run through :meth:`cairn.journal.queue.Queue.launch_run`, which admits it at once or
queues it. A queued run is pinned on its owner's attestation during the launch (the only
time the attestation exists) and then waits with no start intent. :func:`watch_queue`, a
cairnd thread, admits queued runs when slots free and asks the broker to carry out their
start intent (no attestation needed: the run is pinned). cairnd learns that a slot freed
by looking: a launch that queues wakes the thread, and while anything is queued it looks
again every :data:`POLL_SEC` (a run's end, cancellation or wait for a person is a write to
the journal by its coordinator or by cairnd, which this thread reads). cairnd runs from
boot (cairn.service is wanted by multi-user.target) and is restarted on failure; a
cairnd that starts, for any reason, admits what is queued before it serves long.
"""

from __future__ import annotations

import logging
import threading

from cairn import paths
from cairn.admission import AdmissionConfig, admission_config, next_admitted, queue_positions
from cairn.brokerclient import call_broker
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal

log = logging.getLogger(__name__)

POLL_SEC = 1.0
BROKER_TIMEOUT = 120.0

_changed = threading.Event()


def queue_changed() -> None:
    """Tell :func:`watch_queue` to look now (a run joined the queue or a slot freed)."""
    _changed.set()


def current_config() -> AdmissionConfig:
    """The host's admission settings; a broken ``admission.toml`` is logged (``cairn config
    check`` names its problems) and the defaults apply, so queued runs still start."""
    try:
        return admission_config()
    except CairnError as exc:
        log.error("admission.toml: %s; using the defaults", exc.message)
        return AdmissionConfig()


def position(journal: Journal, run_id: str) -> int | None:
    """The queued run's place in the queue (1 = next), or None if it is not in it."""
    queued, holding = journal.queue_snapshot()
    return queue_positions(queued, holding).get(run_id)


def admit_waiting(journal: Journal) -> list[str]:
    """Admit as many queued runs as there are free slots, fairly between users, and have
    the broker start each; return the IDs of the runs admitted."""
    config = current_config()
    admitted = journal.admit_queued(lambda queued, holding: next_admitted(queued, holding, config))
    for run_id in admitted:
        start_admitted(journal, run_id)
    return admitted


def start_admitted(journal: Journal, run_id: str) -> None:
    """Have the broker carry out the admitted run's start intent (its description was
    pinned when it was launched). A run the broker refuses ends ``failed`` with the
    reason; the slot it held frees."""
    try:
        reply = call_broker("launch-v1", run_id, timeout=BROKER_TIMEOUT)
    except CairnError as exc:
        reason = f"the queued run could not start: {exc.message}"
        if journal.fail_unstarted_run(run_id, reason):
            log.error("%s failed when admitted: %s", run_id, exc.message)
        else:
            log.warning("%s: the broker answered %s, but its coordinator runs", run_id, exc)
        return
    journal.record_receipts(run_id, [r.model_dump(mode="json") for r in reply.receipts])
    log.info("%s admitted from the queue and started", run_id)


def watch_queue(*, poll: float = POLL_SEC, stop: threading.Event | None = None) -> None:
    """Admit queued runs as slots free, for as long as cairnd runs (or until ``stop``)."""
    journal = Journal(paths.journal_path())
    try:
        while stop is None or not stop.is_set():
            _changed.clear()
            look_again = True
            try:
                queued, _holding = journal.queue_snapshot()
                look_again = bool(queued)
                if queued:
                    admit_waiting(journal)
            except CairnError as exc:
                log.error("admission: %s", exc.message)
            except Exception:
                log.exception("admission failed; trying again")
            _changed.wait(poll if look_again or stop is not None else None)
    finally:
        journal.close()
