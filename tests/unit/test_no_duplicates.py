"""No block of 10 or more lines stands twice in the project's Python outside the tests:
neither the same lines nor the same shape with other names, strings or numbers.

Each line is reduced to its shape: names become ``N``, strings ``S``, numbers ``0``;
keywords and punctuation stay. Blank lines, comments, lines of lone punctuation and import
statements are passed over. Every run of 10 such lines is compared with every other; two
runs of one shape in two places (or two places of one file that do not overlap) fail.

A run that repeats itself is a table or a list of declarations, not a block of logic: one
whose statements have fewer than four different shapes (the syscall table and the BPF
programs of ``cairn/workflow/sandbox.py``, where every row is part of one statement; the
exception classes of ``cairn/errors.py``; a model's field list), or one made only of
declarations (class headers, docstrings, annotated fields, names bound to a literal: the
one model per daemon op of ``cairn/protocol/daemon.py``), does not count.
"""

from __future__ import annotations

import io
import keyword
import tokenize
from collections import defaultdict

from project_sources import REPO, python_sources

WINDOW = 10
MIN_SHAPES = 4

_SKIP_TOKENS = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python 3.12 and later
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _shape(token: tokenize.TokenInfo) -> str:
    if token.type == tokenize.NAME:
        return token.string if keyword.iskeyword(token.string) else "N"
    if token.type == tokenize.STRING:
        return "S"
    if token.type == tokenize.NUMBER:
        return "0"
    return token.string


_LITERALS = {tokenize.STRING, tokenize.NUMBER}


def _declares(statement: list[tokenize.TokenInfo]) -> bool:
    """A class header, a docstring, an annotated field or a name bound to a literal."""
    first = statement[0]
    if first.string == "class" or (len(statement) == 1 and first.type == tokenize.STRING):
        return True
    if first.type != tokenize.NAME or len(statement) < 3:
        return False
    if statement[1].string == ":":
        return True
    return statement[1].string == "=" and all(
        t.type in _LITERALS or t.string in ("True", "False", "None", "-") for t in statement[2:]
    )


def shaped_lines(source: str) -> list[tuple[int, str, bool, bool]]:
    """(line number, shape, whether a statement starts there, whether that statement only
    declares) of every line that counts."""
    shapes: dict[int, list[str]] = defaultdict(list)
    starts: set[int] = set()
    declarations: set[int] = set()
    statement: list[tokenize.TokenInfo] = []
    fstring_depth = 0

    def flush() -> None:
        if statement and statement[0].string not in ("import", "from"):
            starts.add(statement[0].start[0])
            if _declares(statement):
                declarations.add(statement[0].start[0])
            for token in statement:
                shapes[token.start[0]].append(_shape(token))
        statement.clear()

    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == _FSTRING_START:
            fstring_depth += 1
            if fstring_depth == 1:
                statement.append(token._replace(type=tokenize.STRING))
            continue
        if token.type == _FSTRING_END:
            fstring_depth -= 1
            continue
        if fstring_depth:
            continue
        if token.type == tokenize.NEWLINE:
            flush()
        elif token.type not in _SKIP_TOKENS:
            statement.append(token)
    flush()
    return [
        (number, " ".join(parts), number in starts, number in declarations)
        for number, parts in sorted(shapes.items())
        if any(part[0].isalnum() or part[0] in "\"'_" for part in parts)
    ]


def repeated_blocks(files: dict[str, str]) -> list[str]:
    """Each place a run of ``WINDOW`` shaped lines stands again, as ``a:L-L ~ b:L-L``."""
    places: dict[tuple[str, ...], list[tuple[str, int, int]]] = defaultdict(list)
    for name, source in files.items():
        lines = shaped_lines(source)
        for i in range(len(lines) - WINDOW + 1):
            window = lines[i : i + WINDOW]
            shape = tuple(text for _, text, _, _ in window)
            if len({text for _, text, start, _ in window if start}) < MIN_SHAPES:
                continue
            if all(declares for _, _, start, declares in window if start):
                continue
            places[shape].append((name, window[0][0], window[-1][0]))
    pairs: dict[tuple[str, str], tuple[str, str]] = {}
    for found in places.values():
        for i, (a, a_first, a_last) in enumerate(found):
            for b, b_first, b_last in found[i + 1 :]:
                if a == b and b_first <= a_last:
                    continue  # overlapping windows of one file
                key = (a, b)
                first = pairs.get(key)
                # keep the first place per pair of files: one row names the block
                if first is None:
                    pairs[key] = (f"{a}:{a_first}-{a_last}", f"{b}:{b_first}-{b_last}")
    return [f"{x} ~ {y}" for x, y in pairs.values()]


def test_the_checker_sees_a_renamed_copy_and_passes_over_tables() -> None:
    body = "\n".join(
        [
            "def f(a, b):",
            "    total = 0",
            "    for x in a:",
            "        if x > 3:",
            "            total += x  # a comment",
            "",
            "        elif x < -1:",
            "            total -= b[x]",
            "        else:",
            "            print('neither', x)",
            "    while total > 100:",
            "        total //= 2",
            "    return total",
        ]
    )
    renamed = body.replace("total", "acc").replace("'neither'", "'other'").replace("3", "7")
    table = "T = (\n" + "".join(f"    ('n{i}', {i}, {i + 1}),\n" for i in range(30)) + ")\n"
    models = "".join(
        f'class R{i}(Base):\n    """Doc."""\n\n    op: Literal["r{i}"] = "r{i}"\n'
        f"    n{i}: int | None = None\n    flag = True\n"
        for i in range(6)
    )
    found = repeated_blocks({"a.py": "import os\n" + body, "b.py": renamed, "t.py": table})
    assert found == ["a.py:2-12 ~ b.py:1-11"], found
    assert repeated_blocks({"a.py": body, "t.py": table + table}) == []
    assert repeated_blocks({"m.py": models, "n.py": models}) == []  # declarations only
    with_logic = models.replace("    flag = True\n", "    flag = check(x)\n")
    assert repeated_blocks({"m.py": with_logic, "n.py": with_logic}) != []


def test_no_block_of_ten_lines_stands_twice_outside_the_tests() -> None:
    files = {path.relative_to(REPO).as_posix(): path.read_text() for path in python_sources()}
    assert "cairn/sockets.py" in files  # the walk sees the library
    found = repeated_blocks(files)
    assert not found, (
        f"blocks of {WINDOW} lines that stand twice (same lines or same shape); move each "
        "into one shared helper:\n" + "\n".join(found)
    )
