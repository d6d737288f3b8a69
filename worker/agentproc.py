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
import select
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
    stderr: Tail | None = None,
) -> tuple[int, Tail]:
    """Run ``argv`` with its stdout on a pipe; return its exit status and the tail of what
    it printed, once it exited (see the module's docstring). ``stderr``: its standard
    error goes through a pipe too, on to this process's own (the journal) as it comes,
    its tail kept there. ``OSError`` if it cannot start."""
    tail = Tail(keep)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if stderr is not None else None)
    assert proc.stdout is not None
    out = proc.stdout.fileno()
    streams = {out: tail}
    if proc.stderr is not None and stderr is not None:
        streams[proc.stderr.fileno()] = stderr
    for fd in streams:
        os.set_blocking(fd, False)
    try:
        with selectors.DefaultSelector() as selector:
            for fd in streams:
                selector.register(fd, selectors.EVENT_READ)
            while proc.poll() is None:
                for key, _ in selector.select(POLL_SEC):
                    if not _read_chunk(key.fd, streams[key.fd], echo=key.fd != out):
                        selector.unregister(key.fd)  # end of file
                if not selector.get_map():  # every pipe closed: only the exit is left to see
                    proc.wait()
                    return proc.returncode, tail
            left = [key.fd for key in selector.get_map().values()]
        deadline = time.monotonic() + DRAIN_SEC
        while time.monotonic() < deadline and any(
            [_read_chunk(fd, streams[fd], drained=False, echo=fd != out) for fd in left]  # noqa: C419  (every stream read each pass)
        ):
            pass
    finally:
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    return proc.returncode, tail


def _read_chunk(fd: int, tail: Tail, *, drained: bool = True, echo: bool = False) -> bool:
    """Read one chunk into ``tail`` (and on to this process's stderr if ``echo``); False at
    end of file, and when the pipe holds nothing right now unless ``drained`` (what a poll
    that found data returns)."""
    try:
        chunk = os.read(fd, _CHUNK)
    except BlockingIOError:
        return drained
    if chunk:
        tail.add(chunk)
        if echo:
            _write_all(2, chunk)
    return bool(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], POLL_SEC)
        except OSError:
            return  # nowhere to pass it on to: the tail still has it
