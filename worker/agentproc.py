"""Running an agent's command until the command exits, not until its stdout closes.

A process the agent left behind (``sleep 600 &``) inherits the write end of the stdout
pipe; reading to end of file would wait for it. The worker reads while the command runs,
keeps only the last bytes (memory stays bounded whatever the agent prints), and stops
reading once the command exited and the pipe holds nothing more (or after
:data:`DRAIN_SEC` of a leftover process writing on). What was left behind is killed with
the unit's cgroup when the worker ends.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Sequence

from cairn.resultjson import RESULT_LIMIT, ResultInvalid, fingerprint

DRAIN_SEC = 1.0
POLL_SEC = 0.2
_CHUNK = 1 << 16


class Tail:
    """The last ``keep`` bytes of a stream, and how many bytes went by in all."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.total = 0
        self._buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._buf += chunk
        if len(self._buf) > 2 * self.keep:
            del self._buf[: len(self._buf) - self.keep]

    @property
    def data(self) -> bytes:
        return bytes(self._buf[-self.keep :])

    @property
    def cut(self) -> bool:
        """Whether bytes before :attr:`data` were dropped."""
        return self.total > len(self.data)

    def last_line(self, what: str, limit: int = RESULT_LIMIT) -> bytes | None:
        """The last line holding more than white space; None if there is none.
        :class:`ResultInvalid` (size) when that line is longer than ``limit``."""
        data = self.data.rstrip()
        start = data.rfind(b"\n") + 1
        if (start == 0 and self.cut) or len(data) - start > limit:
            raise ResultInvalid(
                "size",
                f"{what} is longer than {limit} bytes; a result may have at most {limit}",
                sha256=fingerprint(data[start:], self.total),
            )
        return data[start:] or None


def run_to_exit(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    stdin: int | None = None,
    keep: int = RESULT_LIMIT + _CHUNK,
) -> tuple[int, Tail]:
    """Run ``argv`` with its stdout on a pipe; return its exit status and the tail of what
    it printed, once it exited (see the module's docstring). ``OSError`` if it cannot
    start."""
    tail = Tail(keep)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while proc.poll() is None:
                if selector.select(POLL_SEC) and not _read_chunk(fd, tail):
                    selector.unregister(fd)  # end of file: only the exit is left to see
                    proc.wait()
                    return proc.returncode, tail
        deadline = time.monotonic() + DRAIN_SEC
        while time.monotonic() < deadline and _read_chunk(fd, tail, drained=False):
            pass
    finally:
        proc.stdout.close()
    return proc.returncode, tail


def _read_chunk(fd: int, tail: Tail, *, drained: bool = True) -> bool:
    """Read one chunk into ``tail``; False at end of file, and when the pipe holds
    nothing right now unless ``drained`` (what a poll that found data returns)."""
    try:
        chunk = os.read(fd, _CHUNK)
    except BlockingIOError:
        return drained
    if chunk:
        tail.add(chunk)
    return bool(chunk)
