"""Every refusal root can give is asserted by a test.

Walks ``broker/`` and the library modules root loads (the coverage include list of
pyproject.toml, which ``test_broker_coverage.py`` keeps equal to the documented closure)
with ``ast``, collects the message of every ``raise BrokerRefused(...)`` (an f-string by its
literal parts), and requires some test under ``tests/`` to hold a string that matches it
(as a regular expression or a substring) over at least a few words of its literal text.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
import warnings
from pathlib import Path
from typing import NamedTuple, cast

REPO = Path(__file__).resolve().parents[2]
HOLE = "\x00"  # stands for a formatted value of an f-string
MIN_LITERAL = 12  # characters of the message's own text a test must match


class Refusal(NamedTuple):
    where: str
    message: str  # literal text, HOLE where a value is formatted in


def root_files() -> list[Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    found: set[Path] = set()
    for pattern in config["tool"]["coverage"]["run"]["include"]:
        found |= set(REPO.glob(pattern))
    return sorted(found)


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            text = _literal(value)
            parts.append(HOLE if text is None else text)
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        return (left or HOLE) + (right or HOLE)
    return None


def refusals(path: Path) -> list[Refusal]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
            continue
        call = node.exc
        if not (isinstance(call.func, ast.Name) and call.func.id == "BrokerRefused"):
            continue
        where = f"{path.relative_to(REPO)}:{node.lineno}"
        message = _literal(call.args[0]) if call.args else None
        assert message is not None and message.strip(HOLE), (
            f"{where}: a refusal's message must be a string or an f-string with text"
        )
        found.append(Refusal(where, message))
    return found


def strings_in_tests() -> list[str]:
    """Every string constant of the tests (f-strings' literal parts too), and every
    f-string with ``…`` for its values."""
    found: set[str] = set()
    here = Path(__file__).resolve()
    for path in (REPO / "tests").rglob("*.py"):
        if path.resolve() == here:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                found.add("".join(cast(str, v.value) if isinstance(v, ast.Constant) else "…"
                                  for v in node.values))
    return sorted(found)


class Pattern(NamedTuple):
    text: str
    regex: re.Pattern[str] | None


def compiled(text: str) -> Pattern:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return Pattern(text, re.compile(text))
        except re.error:
            return Pattern(text, None)


def asserts(pattern: Pattern | str, message: str) -> bool:
    """Whether a test's string ``pattern`` matches at least MIN_LITERAL characters of the
    message's own text (or all of it when it has fewer), as a substring or a regex, or
    is an instance of the whole message."""
    if isinstance(pattern, str):
        pattern = compiled(pattern)
    need = min(MIN_LITERAL, max(len(part) for part in message.split(HOLE)))
    spans = []
    start = message.find(pattern.text)
    if start >= 0:
        spans.append((start, start + len(pattern.text)))
    if pattern.regex is not None:
        spans += [m.span() for m in pattern.regex.finditer(message)]
    if any(len(message[a:b].replace(HOLE, "")) >= need for a, b in spans):
        return True
    # or the test's string is an instance of the whole message, values and all
    return template(message).search(pattern.text) is not None


@functools.cache
def template(message: str) -> re.Pattern[str]:
    return re.compile(".+?".join(re.escape(part) for part in message.split(HOLE)))


def unasserted() -> list[Refusal]:
    patterns = [compiled(s) for s in strings_in_tests() if 4 <= len(s.strip()) <= 200]
    return [
        r for path in root_files() for r in refusals(path)
        if not any(asserts(p, r.message) for p in patterns)
    ]


def test_the_walk_finds_the_refusals_of_every_broker_module() -> None:
    by_file = {r.where.split(":")[0] for p in root_files() for r in refusals(p)}
    for name in ("verbs", "remint", "spare", "units", "capsule", "pins", "hostfiles", "server"):
        assert f"broker/{name}.py" in by_file


def test_matching_needs_the_refusals_own_words() -> None:
    message = f"project {HOLE} is not owned by the run's owner"
    assert asserts("is not owned by the run", message)
    assert asserts(r"project .* is not owned", message)
    assert not asserts("project ", message)  # too little of its own text
    assert not asserts("project is not owned by root", message)
    message = f"{HOLE} is pinned; an upgrade changes only its source, not {HOLE}"
    assert asserts("… is pinned; an upgrade changes only its source, not limits", message)
    assert not asserts("an upgrade changes only its source, not limits", message)


def test_every_broker_refusal_is_asserted_by_a_test() -> None:
    missing = unasserted()
    assert not missing, "refusals no test asserts:\n" + "\n".join(
        f"  {r.where}: {r.message.replace(HOLE, '{…}')!r}" for r in missing
    )
