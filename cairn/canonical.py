"""The canonical JSON form every Cairn hash and request identity is taken over.

Sorted keys, no whitespace, UTF-8 text (``ensure_ascii=False``). Review hashes, policy and
schedule hashes, receipts and journal rows depend on these exact bytes: never change them.
Imports only the standard library (through :mod:`cairn.leanjson`, the same bytes as
``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``), so
every process (the root broker too) may use it.
"""

from __future__ import annotations

from cairn.leanjson import dumps

# Read by type checkers only: importing typing costs every `cairn` start 4 ms of CPU.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from hashlib import sha256
else:
    try:  # CPython's own SHA-256: hashlib loads OpenSSL first, 3 ms at every `cairn` start
        from _sha2 import sha256
    except ImportError:  # an interpreter built without it (before 3.12, or hashes left out)
        from hashlib import sha256


def canonical_json(value: object) -> str:
    """The one canonical JSON form used for hashes and request identity."""
    return dumps(value, sort_keys=True)


def sha256_hex(data: str | bytes) -> str:
    """Hex SHA-256 of ``data`` (text is hashed as UTF-8)."""
    raw = data.encode() if isinstance(data, str) else data
    return sha256(raw).hexdigest()
