"""Sizes and ages as people write them: ``8G``, ``512M``, ``1073741824`` (binary
multiples), for ``cairn storage init --loop``, byte-valued ``--limit`` values and the
storage reserve; ``14d``, ``12h`` for ``cairn prune --older-than``. Standard library only."""

from __future__ import annotations

import re

from cairn.errors import UsageError

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_AGE_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_AGE_UNITS = {"": 86400, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``"8G"``, ``"512M"``, ``"1073741824"`` → bytes (binary multiples)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(f"cannot read size {text!r}", hint="write it like 8G, 512M or 1073741824")
    shift = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]
    return int(m.group(1)) << shift


def parse_age(text: str) -> int:
    """``"14d"``, ``"12h"``, ``"2w"``, ``"90m"``, ``"30s"`` → seconds (a bare number is days)."""
    m = _AGE_RE.match(text)
    if not m:
        raise UsageError(f"cannot read age {text!r}", hint="write it like 14d, 12h or 2w")
    return int(m.group(1)) * _AGE_UNITS[m.group(2)]
