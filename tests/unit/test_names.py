"""The identifier checks without a regular expression accept exactly what their patterns
(the models' field patterns) accept, and refuse a trailing newline, which ``re.match`` on
a ``$`` pattern lets through."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn.protocol import names

CHECKS: list[tuple[str, Callable[[object], bool]]] = [
    (names.RUN_ID_PATTERN, names.is_run_id),
    (names.OP_ID_PATTERN, names.is_op_id),
    (names.LANE_KEY_PATTERN, names.is_lane_key),
    (names.VERIFIER_NAME_PATTERN, names.is_verifier_name),
    (names.HASH_PATTERN, names.is_hash),
    (names.PROFILE_NAME_PATTERN, names.is_profile_name),
]
ALPHABET = "abcfz059-._\nA_ é/:"


@pytest.mark.parametrize(("pattern", "check"), CHECKS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_each_check_accepts_what_its_pattern_accepts(
    pattern: str, check: Callable[[object], bool], data: st.DataObject
) -> None:
    text = data.draw(st.from_regex(pattern, fullmatch=True) | st.text(ALPHABET, max_size=140))
    assert check(text) == bool(re.fullmatch(pattern, text)), text


@pytest.mark.parametrize(("pattern", "check"), CHECKS)
def test_each_check_holds_its_bounds(pattern: str, check: Callable[[object], bool]) -> None:
    fixed = {names.is_run_id: "flow_" + "0" * 32, names.is_hash: "sha256:" + "0" * 64}
    if check in fixed:
        good = fixed[check]
    else:
        good = "a" * (int(pattern.rsplit(",", 1)[1].split("}", maxsplit=1)[0]) + 1)
    assert check(good) and re.fullmatch(pattern, good)
    for bad in (good + "\n", good + "a", good[:-1] + "A", "", "-" + good[1:], None, 5,
                good.encode()):
        assert not check(bad), bad
        assert not (isinstance(bad, str) and re.fullmatch(pattern, bad)), bad
