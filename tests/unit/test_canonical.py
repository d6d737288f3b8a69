"""The canonical JSON form and its hash: every Cairn hash depends on these exact bytes."""

from __future__ import annotations

import hashlib

from cairn.canonical import canonical_json, sha256_hex


def test_the_canonical_form_is_sorted_compact_utf8() -> None:
    assert canonical_json({"b": [1, 2.5], "a": "é\n"}) == '{"a":"é\\n","b":[1,2.5]}'


def test_the_hash_is_sha256_whichever_implementation_the_interpreter_offers() -> None:
    # canonical takes CPython's built-in SHA-256 where it exists (a start without OpenSSL)
    for data in (b"", b"abc", "é".encode(), bytes(range(256)) * 1000):
        assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
    assert sha256_hex("é") == hashlib.sha256("é".encode()).hexdigest()
