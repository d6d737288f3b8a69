"""cairnd's approval timer: an approval request nobody decides expires at its deadline.

One thread of cairnd sleeps until the earliest deadline of a waiting approval request
(looking again at least every :data:`LOOK_AGAIN_SEC`, since coordinators open requests
without telling cairnd), expires every overdue request in one journal transaction and
wakes each run that waited for one through the broker — so a run resolves its approval
at expiry although nobody runs a command. cairnd runs as long as the host does
(``cairn.service``), and after a restart the first pass expires what fell due meanwhile.
A coordinator that reaches an overdue request first expires it itself (same journal
call).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cairn import paths
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal

log = logging.getLogger(__name__)

LOOK_AGAIN_SEC = 10.0


def expire_due(journal: Journal, now: float, wake: Callable[[Journal, str], bool]) -> list[str]:
    """Expire the overdue approval requests at ``now``; wake each run that waited for
    one. The runs woken."""
    woken = journal.expire_overdue_approvals(now)
    for run_id in woken:
        log.info("%s: an approval request expired; the run goes on", run_id)
        wake(journal, run_id)
    return woken


def seconds_to_next(journal: Journal, now: float) -> float:
    """How long the timer may sleep: until the next deadline, at most LOOK_AGAIN_SEC."""
    deadline = journal.next_approval_deadline()
    if deadline is None:
        return LOOK_AGAIN_SEC
    return min(LOOK_AGAIN_SEC, max(0.05, deadline - now + 0.05))


def run_timer(
    clock: Callable[[], float],
    wake: Callable[[Journal, str], bool],
    stop: threading.Event,
) -> None:
    """The timer loop of cairnd (until ``stop`` is set); errors are logged, never fatal."""
    journal = Journal(paths.journal_path())
    try:
        while not stop.is_set():
            try:
                expire_due(journal, clock(), wake)
                pause = seconds_to_next(journal, clock())
            except CairnError as exc:
                log.error("approval timer: %s", exc)
                pause = LOOK_AGAIN_SEC
            stop.wait(pause)
    finally:
        journal.close()
