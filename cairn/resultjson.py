"""An agent's result, read as the hostile input it is (ARCHITECTURE §8).

The worker parses what the agent wrote inside the sandbox and judges it once: bytes past
a size limit are never read, the text must be strict UTF-8, nesting is bounded before the
JSON parser recurses, and a string may not hold a lone surrogate (JSON's ``\\ud800``
escape), which no UTF-8 message could carry further. A result that fails is a
:class:`ResultInvalid` naming its reason, one of :data:`KINDS`; the coordinator fails the
operation with it instead of retrying when retrying cannot change it.

Standard library only, so the worker (from the capsule) and the coordinator share it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import BinaryIO, NoReturn

from cairn.errors import CairnError
from cairn.protocol.jsonvalue import JSONValue

RESULT_LIMIT = 4 << 20
"""Bytes of one result (``/outputs/result.json`` or a stdout line); the agent socket's
message limit (8 MiB) leaves room for JSON escapes added on the way."""
DEPTH_LIMIT = 64
"""Nesting of arrays and objects in a result: far beyond any workflow model, far below
the parsers' recursion limits."""
FINGERPRINT_LIMIT = 64 << 20
"""Bytes of an oversized result hashed to tell a repeat from a new answer."""

KINDS = ("size", "depth", "encoding", "syntax", "schema", "file")

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_PRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\ud7ff\ue000-\ufffd]")


class ResultInvalid(CairnError):
    """An agent's result was refused before anyone used it. ``kind`` is one of
    :data:`KINDS`; ``sha256`` fingerprints the refused bytes ("" when unknown)."""

    code = "result-invalid"

    def __init__(self, kind: str, detail: str, *, sha256: str = "") -> None:
        super().__init__(f"result-invalid: {kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.sha256 = sha256

    @property
    def reason(self) -> str:
        """``kind: detail``, as the operation's error shows it after ``result-invalid:``."""
        return f"{self.kind}: {self.detail}"

    @classmethod
    def from_reason(cls, reason: str, *, sha256: str = "") -> ResultInvalid:
        """The error a ``kind: detail`` line (the agent's own, untrusted) stands for:
        an unknown kind becomes ``schema``; the detail is cut to one printable line."""
        kind, sep, detail = reason.partition(": ")
        if not sep or kind not in KINDS:
            kind, detail = "schema", reason
        detail = _PRINTABLE.sub("?", detail)[:500] or "(no detail)"
        valid_hash = re.fullmatch(r"[0-9a-f]{64}", sha256) is not None
        return cls(kind, detail, sha256=sha256 if valid_hash else "")


def fingerprint(data: bytes, total: int | None = None) -> str:
    """SHA-256 over the size and ``data`` (a prefix, when ``total`` says it was cut)."""
    digest = hashlib.sha256(f"{len(data) if total is None else total}:".encode())
    digest.update(data)
    return digest.hexdigest()


def fingerprint_stream(stream: BinaryIO, total: int) -> str:
    """:func:`fingerprint` of the first :data:`FINGERPRINT_LIMIT` bytes of ``stream`` (of
    ``total`` bytes), read a MiB at a time."""
    digest = hashlib.sha256(f"{total}:".encode())
    left = FINGERPRINT_LIMIT
    while left > 0 and (chunk := stream.read(min(left, 1 << 20))):
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()


def parse(
    data: bytes, what: str, *, limit: int = RESULT_LIMIT, depth: int = DEPTH_LIMIT
) -> JSONValue:
    """The JSON value in ``data`` (``what`` names it in errors), or :class:`ResultInvalid`:
    more than ``limit`` bytes, not strict UTF-8, nested deeper than ``depth``, not JSON
    (NaN, Infinity and numbers out of range included), or holding a lone surrogate."""
    sha = fingerprint(data)
    if len(data) > limit:
        raise ResultInvalid(
            "size", f"{what} is {len(data)} bytes; a result may have at most {limit}", sha256=sha
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultInvalid(
            "encoding",
            f"{what} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            sha256=sha,
        ) from None
    if nesting(text) > depth:
        raise ResultInvalid("depth", f"{what} nests deeper than {depth} levels", sha256=sha)
    try:
        value: JSONValue = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:  # nesting() miscounted invalid JSON; the parser caught it
        raise ResultInvalid("depth", f"{what} nests deeper than {depth} levels", sha256=sha) \
            from None
    except ValueError as exc:
        raise ResultInvalid("syntax", f"{what} is not JSON: {_first_line(exc)}", sha256=sha) \
            from None
    check_text(value, what, sha256=sha)
    return value


def nesting(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (brackets in strings skipped);
    counting stops once past :data:`DEPTH_LIMIT`, so the answer is exact up to there."""
    level = deepest = 0
    for char in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if char in "[{":
            level += 1
            if level > deepest:
                deepest = level
                if deepest > DEPTH_LIMIT:
                    break
        else:
            level -= 1
    return deepest


def check_value(value: object, what: str, *, depth: int = DEPTH_LIMIT) -> None:
    """Refuse a result built in memory (a scripted or model agent's output) that no JSON
    message could carry: nested deeper than ``depth``, a non-finite number, a key that is
    not a string, a value that is no JSON type, or a lone surrogate."""
    todo: list[tuple[object, int]] = [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            if level > depth:
                raise ResultInvalid("depth", f"{what} nests deeper than {depth} levels")
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    raise ResultInvalid("schema", f"{what} has an object key that is not text")
                todo.extend((v, level + 1) for v in item.values())
            else:
                todo.extend((v, level + 1) for v in item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ResultInvalid("syntax", f"{what} holds {item}, which JSON has not")
        elif not (item is None or isinstance(item, str | int | float)):
            raise ResultInvalid("schema", f"{what} holds a {type(item).__name__}")
    check_text(value, what)


def check_text(value: object, what: str, *, sha256: str = "") -> None:
    """Refuse a parsed value holding a lone surrogate in a string or a key."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        char = exc.object[exc.start] if isinstance(exc.object, str) else "?"
        raise ResultInvalid(
            "encoding",
            f"{what} holds a lone surrogate \\u{ord(char):04x}, which is not Unicode text",
            sha256=sha256,
        ) from None


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text[:40]} is out of range")
    return number


def _first_line(exc: ValueError) -> str:
    text = (str(exc).splitlines() or ["invalid"])[0]
    if "integer string conversion" in text:
        return "a number has too many digits"
    return text[:200]
