"""The one subprocess helper: argv lists only, an explicit environment, stdin closed."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from cairn.errors import ProcessFailed

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
