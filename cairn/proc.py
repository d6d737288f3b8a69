"""The one subprocess helper: argv lists only, an explicit environment, stdin closed."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO

from cairn.errors import CairnError, ProcessFailed

log = logging.getLogger(__name__)

BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def make_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: a fixed PATH and C.UTF-8 locale, plus ``extra``."""
    return {**BASE_ENV, **(extra or {})}


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    capture: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` (never through a shell) and return the completed process.

    The environment is exactly ``make_env(env)``; stdin is ``input`` or /dev/null.
    With ``check`` a non-zero exit raises :class:`ProcessFailed` naming the command and
    the last line of its stderr.
    """
    args = [os.fspath(a) for a in argv]
    log.debug("+ %s", shlex.join(args))
    proc = subprocess.run(
        args,
        env=make_env(env),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
    if check and proc.returncode != 0:
        err = (proc.stderr or b"").decode(errors="replace").strip()
        last = err.splitlines()[-1] if err else f"exit status {proc.returncode}"
        raise ProcessFailed(f"{args[0]} failed: {last}", returncode=proc.returncode, stderr=err)
    return proc


class Output:
    """A running command's stdout, read as it comes; it knows when it reached the end."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        self.ended = False

    def read(self, size: int = -1) -> bytes:
        """``size`` bytes (all if negative); fewer only at the end."""
        data = self._pipe.read(size)
        if size < 0 or len(data) < size:
            self.ended = True
        return data


@contextmanager
def reading(
    argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None
) -> Iterator[Output]:
    """Run ``argv`` (environment and stdin as :func:`run`) and yield its stdout to read as
    it comes, for output too large to hold. Leaving before the end kills the process;
    reading to the end and leaving waits for it and checks its exit like
    ``run(check=True)``. Its stderr is kept for that message, so it must stay small (a
    command run quiet)."""
    args = [os.fspath(a) for a in argv]
    log.debug("+ %s", shlex.join(args))
    child = subprocess.Popen(
        args, env=make_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    output = Output(child.stdout)
    try:
        yield output
    finally:
        if not output.ended:
            child.kill()
        child.stdout.close()
        err = child.stderr.read().decode(errors="replace").strip()
        child.stderr.close()
        child.wait()
    if output.ended and child.returncode != 0:
        last = err.splitlines()[-1] if err else f"exit status {child.returncode}"
        raise ProcessFailed(f"{args[0]} failed: {last}", returncode=child.returncode, stderr=err)


class OutputTooLarge(CairnError):
    """A command printed more than its caller reads; it was killed."""

    code = "output-too-large"


def run_bounded(
    argv: Sequence[str | os.PathLike[str]],
    *,
    limit: int,
    env: Mapping[str, str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` as :func:`run` does (never raising for its exit status), holding at
    most ``limit`` bytes of its stdout and of its stderr: for a command whose output a less
    trusted process writes. One byte more of either kills it and raises
    :class:`OutputTooLarge`; so does ``timeout``, as :class:`subprocess.TimeoutExpired`."""
    import selectors
    import time

    args = [os.fspath(a) for a in argv]
    log.debug("+ %s (at most %d bytes)", shlex.join(args), limit)
    child = subprocess.Popen(args, env=make_env(env), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    held = {child.stdout: bytearray(), child.stderr: bytearray()}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for pipe in held:
            selector.register(pipe, selectors.EVENT_READ)
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(args, timeout)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    data = held[key.fileobj]  # type: ignore[index]
                    data += chunk
                    if len(data) > limit:
                        raise OutputTooLarge(f"{args[0]} printed more than {limit} bytes")
        except BaseException:
            child.kill()
            child.wait()
            raise
        finally:
            for pipe in held:
                pipe.close()
    returncode = child.wait(timeout=max(0.1, deadline - time.monotonic()))
    return subprocess.CompletedProcess(args, returncode, bytes(held[child.stdout]),
                                       bytes(held[child.stderr]))


def replace_process(argv: Sequence[str], *, env: Mapping[str, str]) -> None:
    """Become ``argv[0]`` (looked up on ``env``'s PATH) with ``argv`` and exactly ``env``:
    its exit status is then this process's. Returns only by raising :class:`OSError`
    (no such program, not executable)."""
    log.debug("exec %s", shlex.join(argv))
    os.execvpe(argv[0], list(argv), dict(env))  # noqa: S606 - an argv list, no shell
