"""Named crash points for fault-injection tests.

A failpoint does nothing unless ``CAIRN_FAILPOINTS`` names it (comma-separated). When
enabled it SIGKILLs the calling process the first time it is reached for a given marker
directory, leaving a marker so the restarted process runs on. Production never sets the
variable; the tests set it through a unit drop-in.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "CAIRN_FAILPOINTS"


def enabled(name: str) -> bool:
    return name in {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}


def failpoint(name: str, marker_dir: Path) -> None:
    """Die here (SIGKILL, no cleanup) once per ``marker_dir`` if ``name`` is enabled."""
    if not enabled(name):
        return
    marker = marker_dir / f"failpoint-{name}"
    try:
        marker_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
    # Still here: the caller is the init of a PID namespace (an agent worker), which no
    # signal from inside the namespace kills. Exiting without cleanup is the same crash.
    os._exit(128 + signal.SIGKILL)
