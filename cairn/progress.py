"""Progress of long steps (import, apply), the helper's side: a helper unit runs as the
project's owner and writes one small ``progress.json`` into a directory the coordinator
made for that phase, replacing it at most every :data:`WRITE_INTERVAL` seconds. What the
coordinator does with it is :mod:`cairn.progress_relay`. Plain code, no pydantic: the
helpers start from it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

PROGRESS_FILE = "progress.json"
WRITE_INTERVAL = 0.5

Clock = Callable[[], float]


class Throttle:
    """True at most once per ``interval`` seconds of ``clock`` (the first call passes)."""

    def __init__(self, interval: float, clock: Clock = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: float | None = None

    def ready(self) -> bool:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return False
        self._last = now
        return True


class ProgressWriter:
    """The helper's side: replace ``directory/progress.json`` at most every
    ``interval`` seconds; :meth:`final` always writes. No fsync: progress is a view.
    A report is what :class:`cairn.protocol.progress.ProgressReport` reads: items (entries,
    paths) and bytes done, of a total when known."""

    def __init__(
        self, directory: Path, *, interval: float = WRITE_INTERVAL, clock: Clock = time.monotonic
    ) -> None:
        self.directory = directory
        self.throttle = Throttle(interval, clock)

    def report(self, done: int, total: int | None = None, *, bytes_done: int = 0,
               bytes_total: int | None = None) -> bool:
        """Write the counts if the interval has passed; whether they were written."""
        if not self.throttle.ready():
            return False
        self.final(done, total, bytes_done=bytes_done, bytes_total=bytes_total)
        return True

    def final(self, done: int, total: int | None = None, *, bytes_done: int = 0,
              bytes_total: int | None = None) -> None:
        report = {"done": done, "total": total, "bytes_done": bytes_done,
                  "bytes_total": bytes_total}
        tmp = self.directory / f".{PROGRESS_FILE}.{secrets.token_hex(4)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644)
        try:
            with open(fd, "wb") as fh:
                fh.write(json.dumps(report, separators=(",", ":")).encode())
            os.replace(tmp, self.directory / PROGRESS_FILE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
