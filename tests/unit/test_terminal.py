"""The one rule for hostile text on a terminal (:mod:`cairn.terminal`): every control
character shown escaped, everything else kept."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairn import terminal
from cairn.settle.diff import quoted_path, unified_diff
from cairn.terminal import printable, printable_lines

NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@pytest.mark.parametrize("code", [*range(0x20), 0x7F, *range(0x80, 0xA0)])
def test_every_c0_and_c1_control_and_del_is_shown_escaped(code: int) -> None:
    char = chr(code)
    shown = printable(f"a{char}b")
    expected = NAMED.get(char, f"\\x{code:02x}")
    assert shown == f"a{expected}b"
    assert all(c.isprintable() for c in shown)


def test_escape_sequences_come_out_as_text() -> None:
    assert printable("evil\x1b]0;pwned\x07\nname.txt") == "evil\\x1b]0;pwned\\x07\\nname.txt"
    assert printable("\x1b]52;c;aGk=\x07\x1b[2J") == "\\x1b]52;c;aGk=\\x07\\x1b[2J"
    assert printable("\x9b2J") == "\\x9b2J"  # a C1 CSI: one character on some terminals


def test_a_newline_in_a_name_keeps_it_on_one_line() -> None:
    assert printable("a\nb\r\nc") == "a\\nb\\r\\nc"
    assert "\n" not in printable("x\n" * 5)


def test_tabs_stay_only_when_asked() -> None:
    assert printable("a\tb") == "a\\tb"
    assert printable("a\tb\x1b", tabs=True) == "a\tb\\x1b"


@pytest.mark.parametrize(
    "text",
    ["café", "naïve résumé", "日本語のファイル.txt", "한국어", "emoji 🎉", "a b\\x1b", "→ ✓ ● ·"],
)
def test_normal_text_is_kept_as_it_is(text: str) -> None:
    assert printable(text) == text


@pytest.mark.parametrize("code", [0x061C, 0x200E, 0x200F, *range(0x2028, 0x202F),
                                  *range(0x2066, 0x206A)])
def test_line_separators_and_bidi_overrides_are_shown_escaped(code: int) -> None:
    assert printable(f"x{chr(code)}y") == f"x\\u{code:04x}y"


def test_lone_surrogates_are_shown_escaped_and_can_be_printed() -> None:
    text = json.loads('"bad\\udc80 and \\ud800"')  # JSON may carry text no UTF-8 encodes
    shown = printable(text)
    assert shown == "bad\\udc80 and \\ud800"
    shown.encode("utf-8")  # strict: a terminal gets it whole


def test_invalid_utf8_bytes_are_shown_as_hex() -> None:
    assert printable(b"ok \xff\xfe \xc3\xa9 \x1b") == "ok \\xff\\xfe é \\x1b"


def test_anything_is_shown_through_str() -> None:
    assert printable(None) == "None"
    assert printable(42) == "42"


def test_a_body_of_lines_keeps_its_line_ends_and_tabs() -> None:
    body = "--- a/evil\x1b]0;x\x07\n+\tindented\r\n-\x1b[2Jgone\n"
    assert printable_lines(body) == "--- a/evil\\x1b]0;x\\x07\n+\tindented\\r\n-\\x1b[2Jgone\n"
    assert printable_lines("") == ""


@given(st.text())
def test_no_control_character_survives(text: str) -> None:
    shown = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown)
    assert not any(0xD800 <= ord(c) < 0xE000 for c in shown)
    lines = printable_lines(text)
    assert not any(
        (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in lines
    )


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf"))))
def test_text_without_controls_is_unchanged(text: str) -> None:
    assert printable(text) == text


def test_a_patch_names_a_hostile_file_as_git_does_and_git_apply_reads_it(
    tmp_path: Path,
) -> None:
    name = "evil\x1b]0;pwned\x07\nname \"q\" \\ \x9b é.txt"
    q, f = tmp_path / "q", tmp_path / "f"
    q.mkdir()
    f.mkdir()
    (f / name).write_text("line\x1b[2J\n")
    patch = unified_diff(q, f, "", [name])
    labels = [line for line in patch.splitlines() if line.startswith(("diff ", "--- ", "+++ "))]
    assert labels == [
        'diff --git "a/evil\\033]0;pwned\\a\\nname \\"q\\" \\\\ \\302\\233 é.txt" '
        '"b/evil\\033]0;pwned\\a\\nname \\"q\\" \\\\ \\302\\233 é.txt"',
        '--- /dev/null',
        '+++ "b/evil\\033]0;pwned\\a\\nname \\"q\\" \\\\ \\302\\233 é.txt"',
    ]
    assert quoted_path("a/plain é.txt") == "a/plain é.txt"
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "apply", "-"], cwd=work, input=patch.encode(), check=True)
    assert (work / name).read_text() == "line\x1b[2J\n"


def test_every_character_it_escapes_is_one_python_does_not_call_printable() -> None:
    # printable() shows text Python calls printable as it is, without its regular
    # expression: that is right only if the expression matches no such character
    pattern = terminal._escaped(tabs=False)
    escaped = [chr(c) for c in range(0x110000) if pattern.fullmatch(chr(c))]
    assert len(escaped) > 2048 + 64  # the surrogates, C0, C1, and more
    assert [c for c in escaped if c.isprintable()] == []
    assert printable("tab\there", tabs=True) == "tab\there"
