"""The canonical JSON form every Cairn hash and request identity is taken over.

Sorted keys, no whitespace, UTF-8 text (``ensure_ascii=False``). Review hashes, policy and
schedule hashes, receipts and journal rows depend on these exact bytes: never change them.
Imports only the standard library, so every process (the root broker too) may use it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """The one canonical JSON form used for hashes and request identity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: str | bytes) -> str:
    """Hex SHA-256 of ``data`` (text is hashed as UTF-8)."""
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()
