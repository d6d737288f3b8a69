"""Sizes as people write them: ``8G``, ``512M``, ``1073741824`` (binary multiples), for
``cairn storage init --loop`` and byte-valued ``--limit`` values. Standard library only."""

from __future__ import annotations

import re

from cairn.errors import UsageError

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"8G"``, ``"512M"``, ``"1073741824"`` → bytes (binary multiples)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(f"cannot read size {text!r}", hint="write it like 8G, 512M or 1073741824")
    shift = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]
    return int(m.group(1)) << shift
