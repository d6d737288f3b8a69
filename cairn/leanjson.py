"""JSON written and read by CPython's C codec (``_json``) without the ``json`` package.

``json`` imports ``re``, and with it ``enum``, ``functools`` and ``collections``: 6 ms of
CPU at every ``cairn launch``, whose whole start is about three times that, and a burst of
launches pays it once per launch. These are the C functions ``json.dumps`` and
``json.loads`` call, with the settings those pass them, so the text is byte for byte
``json``'s (a test holds the two to each other). CPython, which Cairn runs on, always has
``_json``. Standard library only: the root broker hashes through it too
(:mod:`cairn.canonical`) and reads nothing with it.
"""

from __future__ import annotations

from _json import encode_basestring, make_encoder, make_scanner

TYPE_CHECKING = False  # typing is for type checkers only: a launch imports this module
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"
# What json.loads reads for these words (json.decoder._CONSTANTS).
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class JSONError(ValueError):
    """A text that is not JSON: what is wrong, and where (1-based line and column)."""

    def __init__(self, msg: str, text: str, pos: int) -> None:
        self.msg, self.pos = msg, pos
        self.lineno = text.count("\n", 0, pos) + 1
        self.colno = pos - text.rfind("\n", 0, pos)
        super().__init__(f"{msg}: line {self.lineno} column {self.colno} (char {pos})")


class _Settings:
    """What the C scanner reads of a ``json.JSONDecoder()``: ``json.loads``'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _unserializable(value: object) -> object:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


_scan = make_scanner(_Settings())  # type: ignore[arg-type]


def dumps(value: object, *, sort_keys: bool = False) -> str:
    """``json.dumps(value, sort_keys=sort_keys, separators=(",", ":"),
    ensure_ascii=False)``: compact, UTF-8 text kept as it is. A value JSON has no form for
    is a TypeError."""
    if isinstance(value, str):
        return encode_basestring(value)
    # (markers for the cycle check, default, string encoder, indent, key and item
    # separators, sort_keys, skipkeys, allow_nan): what JSONEncoder.iterencode passes.
    encode = make_encoder({}, _unserializable, encode_basestring, None, ":", ",", sort_keys,
                          False, True)
    return "".join(encode(value, 0))


def loads(text: str | bytes) -> Any:
    """``json.loads(text)`` for UTF-8 text; a text that is not JSON is a :class:`JSONError`
    (bytes that are not UTF-8 a UnicodeDecodeError, nesting past the parser's depth a
    RecursionError)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8-sig")  # as json.loads reads UTF-8 bytes
    if text.startswith("\ufeff"):
        raise JSONError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as stop:  # nothing the scanner could start a value with
        raise JSONError("Expecting value", text, stop.value) from None
    except ValueError as exc:  # json.JSONDecodeError, which the scanner imports to raise
        raise JSONError(getattr(exc, "msg", str(exc)), text, getattr(exc, "pos", 0)) from None
    rest = text[end:]
    if rest.strip(_WHITESPACE):
        raise JSONError("Extra data", text, len(text) - len(rest.lstrip(_WHITESPACE)))
    return value
