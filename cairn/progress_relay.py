"""Progress of long steps (import, apply) and agent notes, the coordinator's side,
bounded on the way to the journal.

What a helper reports (:mod:`cairn.progress`) is untrusted: the coordinator reads it
without following links, checks owner and size, validates it, and records a ``progress``
event whose phase *it* names (:class:`ProgressRelay`), at most every
:data:`EVENT_INTERVAL` seconds and only when it changed — a helper can neither name
another event nor flood the journal. Agent notes are cut to :data:`NOTE_LIMIT` characters
and rate-limited per operation (:class:`NoteGate`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from cairn import untrusted
from cairn.progress import PROGRESS_FILE, Clock, Throttle
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.progress import ProgressPhase, ProgressReport

log = logging.getLogger(__name__)

REPORT_LIMIT = 4096
EVENT_INTERVAL = 0.5
POLL_INTERVAL = 0.25
NOTE_LIMIT = 2000
NOTES_PER_SECOND = 2.0
NOTE_BURST = 5


def read_report(directory: Path, owner: int) -> ProgressReport | None:
    """The helper's latest report, or None when there is none or it is not acceptable
    (a link, another owner's file, too large, not a valid report)."""
    try:
        raw = untrusted.read_bytes(directory, PROGRESS_FILE, owner=owner, limit=REPORT_LIMIT)
        return ProgressReport.model_validate_json(raw)
    except untrusted.UntrustedFileMissing:
        return None
    except (untrusted.UntrustedFileError, ValidationError) as exc:
        log.warning("ignoring progress in %s: %s", directory, str(exc).splitlines()[0])
        return None


def prepare_progress_dir(state_dir: Path, phase: ProgressPhase) -> Path:
    """A fresh, empty ``progress/<phase>`` directory the owner's helper can write (the
    run's state directory itself is closed to other users). The broker binds it into
    the helper's unit."""
    directory = state_dir / "progress" / phase
    directory.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)  # a link itself goes, never what it names
    os.chmod(directory, 0o777)  # noqa: S103  (the owner's helper writes; state_dir is closed)
    return directory


class ProgressRelay:
    """While a helper runs, poll its report and record changes as ``progress`` events.

    ``record(data)`` appends one event; it is called at most every ``interval`` seconds
    and only for a report that differs from the last one recorded. Use as a context
    manager around the call that waits for the helper; on exit the last report is
    recorded once more if it changed.
    """

    def __init__(
        self,
        directory: Path,
        phase: ProgressPhase,
        owner: int,
        record: Callable[[JSONObject], None],
        *,
        interval: float = EVENT_INTERVAL,
        poll: float = POLL_INTERVAL,
        clock: Clock = time.monotonic,
    ) -> None:
        self.directory = directory
        self.phase = phase
        self.owner = owner
        self.record = record
        self.poll = poll
        self.throttle = Throttle(interval, clock)
        self.last: ProgressReport | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"progress-{phase}", daemon=True)

    def check(self, *, force: bool = False) -> bool:
        """Read the report once; record it if it changed (and the interval has passed,
        unless ``force``). Whether an event was recorded."""
        report = read_report(self.directory, self.owner)
        if report is None or report == self.last:
            return False
        if not force and not self.throttle.ready():
            return False
        self.last = report
        self.record(report.event_data(self.phase))
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.check()
            except Exception:  # a view must never stop the step it watches
                log.exception("progress relay for %s failed", self.phase)
                return

    def __enter__(self) -> ProgressRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.check(force=True)
        except Exception:
            log.exception("progress relay for %s failed", self.phase)


class NoteGate:
    """Bound an agent's notes on their way to the journal: each cut to ``NOTE_LIMIT``
    characters, and a token bucket of ``burst`` notes refilled at ``rate`` per second.
    :meth:`admit` returns the text to record, or None for a dropped note;
    :attr:`dropped` counts them."""

    def __init__(
        self,
        *,
        rate: float = NOTES_PER_SECOND,
        burst: int = NOTE_BURST,
        clock: Clock = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = float(burst)
        self.at = clock()
        self.dropped = 0
        self._lock = threading.Lock()

    def admit(self, text: str) -> str | None:
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1:
                self.dropped += 1
                return None
            self.tokens -= 1
        if len(text) > NOTE_LIMIT:
            return text[: NOTE_LIMIT - 1] + "…"
        return text
