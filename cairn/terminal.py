"""Text that did not come from Cairn itself, made safe to show on a terminal.

An agent is an adversary, and what it wrote reaches people: file names, summaries,
handoffs, questions and prompts a workflow built from them, notes, log lines, diff lines,
errors quoting any of these. A terminal obeys control characters in what it prints (an
OSC sequence retitles the window or, with ``\\x1b]52;``, writes the clipboard; a CSI one
clears the screen or moves the cursor to overwrite what was shown), so every human
renderer passes such text through :func:`printable` (a body of lines through
:func:`printable_lines`) and nothing else. ``--json`` output keeps the exact string:
``json.dumps`` escapes every control character itself.

Shown escaped, as ``git`` (core.quotePath) and ``journalctl`` do: every C0 control and
DEL as ``\\xNN`` (newline, carriage return and tab as ``\\n``, ``\\r``, ``\\t``), every C1
control (U+0080-U+009F, which some terminals read as ESC + a letter) as ``\\xNN``; the
line and paragraph separators and the bidirectional overrides that make text read in
another order than it is (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069) as
``\\uNNNN``; a lone surrogate (text that was not valid UTF-8) as ``\\udcNN``. Everything
else, é and CJK included, is kept. A backslash is kept as it is.
"""

from __future__ import annotations

TYPE_CHECKING = False  # re is loaded only for a text that needs escaping (_escaped)
if TYPE_CHECKING:
    import re

_CONTROLS = (
    "\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_compiled: dict[bool, re.Pattern[str]] = {}


def _escaped(*, tabs: bool) -> re.Pattern[str]:
    """What :func:`printable` escapes (tabs too unless ``tabs``), compiled when first
    needed: most text needs no pass, and a launch then loads no ``re`` (6 ms of CPU)."""
    pattern = _compiled.get(tabs)
    if pattern is None:
        import re

        pattern = _compiled[tabs] = re.compile(f"[{_CONTROLS}]" if tabs else f"[\t{_CONTROLS}]")
    return pattern


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, tabs: bool = False) -> str:
    """``text`` (``str()`` of it; bytes decoded as UTF-8, an invalid byte as ``\\xNN``)
    with every control character shown escaped, newlines too: one line, safe on a
    terminal. With ``tabs``, a tab stays a tab (diff and log bodies)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", "backslashreplace")
    text = str(text)
    # Every character escaped here is one Python does not call printable (a control, a
    # format character, a line or paragraph separator, a surrogate): most text is shown
    # as it is without a regular expression's pass.
    if text.isprintable():
        return text
    return _escaped(tabs=tabs).sub(_escape, text)


def printable_lines(text: str) -> str:
    """A body of lines (a diff, log entries, a review) as :func:`printable` shows each
    line: its line ends kept, tabs kept, every other control character escaped."""
    return "\n".join(printable(line, tabs=True) for line in text.split("\n"))
