"""leanjson, the launch's JSON without the json package: the same text as json, both ways,
for every value JSON has (the canonical form every hash is taken over included)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn import leanjson
from cairn.canonical import canonical_json

REPO = str(Path(__file__).resolve().parents[2])

scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equal, NaN included (NaN != NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(values, st.booleans())
def test_written_as_json_writes_it_compact_and_utf8(value: Any, sort_keys: bool) -> None:
    assert leanjson.dumps(value, sort_keys=sort_keys) == json.dumps(
        value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=False)


@settings(max_examples=400, deadline=None)
@given(values, st.sampled_from([None, 2]), st.sampled_from(["", " \n", "\t\r "]))
def test_read_as_json_reads_it(value: Any, indent: int | None, pad: str) -> None:
    text = pad + json.dumps(value, indent=indent, ensure_ascii=indent is None) + pad
    assert same(leanjson.loads(text), json.loads(text))
    assert same(leanjson.loads(text.encode()), json.loads(text))


@pytest.mark.parametrize("text", [
    "", "  ", "{", '{"a": 1,}', "[1 2]", "tru", '"\x01"', '{"a": 1} x', "[1] [2]", "01",
    '"\\ud800', "\ufeff{}", "NaN x", '{"a"\n: }',
])
def test_what_json_refuses_it_refuses_with_jsons_message_and_place(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    with pytest.raises(leanjson.JSONError) as mine:
        leanjson.loads(text)
    assert (mine.value.msg, mine.value.pos, mine.value.lineno, mine.value.colno) == (
        theirs.value.msg, theirs.value.pos, theirs.value.lineno, theirs.value.colno)
    assert isinstance(mine.value, ValueError)


def test_what_json_cannot_write_or_read_deeply_enough_is_the_same_error() -> None:
    with pytest.raises(TypeError, match="Object of type bytes is not JSON serializable"):
        leanjson.dumps({"a": b"x"})
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        leanjson.dumps(looped)
    with pytest.raises(RecursionError):
        leanjson.loads("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UnicodeDecodeError):
        leanjson.loads(b'"\xff"')


def test_using_it_loads_neither_json_nor_re() -> None:
    code = "\n".join([
        f"import sys; sys.path.insert(0, {REPO!r})",
        "from cairn import leanjson, canonical",
        "value = {'a': [1.5, None, 'é']}",
        "assert leanjson.loads(canonical.canonical_json(value)) == value",
        "print(sorted({'json', 're'} & set(sys.modules)))",
    ])
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_utf8_bytes_are_read_as_json_reads_them() -> None:
    for raw in (b'\xef\xbb\xbf{"a": "\xc3\xa9"}', b'["\xe2\x80\xae"]'):
        assert leanjson.loads(raw) == json.loads(raw)
