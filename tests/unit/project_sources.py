"""The project's own Python files (not the tests, build output, virtual environments or
caches), for the checks that read every module: size and repeated blocks."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SKIP_TOP = {"tests", "build", "dist", "prebuilt"}


def python_sources() -> list[Path]:
    """Every non-test ``.py`` file of the repository, in a stable order."""
    found = []
    for folder, dirs, files in os.walk(REPO):
        rel = Path(folder).relative_to(REPO)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d != "__pycache__"
            and not d.endswith(".egg-info")
            and not (rel == Path(".") and d in _SKIP_TOP)
        )
        found += [Path(folder, name) for name in sorted(files) if name.endswith(".py")]
    return found
