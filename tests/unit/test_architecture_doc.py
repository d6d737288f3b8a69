"""The "Where things live" section of docs/architecture.md names files that exist, and
names every ``cairn`` command and every broker intent kind.

A path is any backticked text in that section with a ``/`` in it that does not start with
one (``/workspace`` and the like are paths inside an agent's unit, not in this repository).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click

from cairn.cli.commands import app

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
HEADING = "## Where things live"
_PATH = re.compile(r"[A-Za-z0-9_.-]+/(?:[A-Za-z0-9_.-]+/?)*")


def _section() -> str:
    text = DOC.read_text()
    assert HEADING in text, f"{DOC.relative_to(REPO)} has no section {HEADING!r}"
    after = text.split(HEADING, 1)[1]
    following = re.search(r"^## ", after, flags=re.MULTILINE)
    return after[: following.start()] if following else after


def _backticked(section: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", section)


def _paths(section: str) -> set[str]:
    return {text for text in _backticked(section) if _PATH.fullmatch(text)}


def _commands(group: click.Group, prefix: str) -> list[str]:
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix} {name}")
        else:
            found.append(f"{prefix} {name}")
    return found


def _intent_kinds() -> set[str]:
    """The keys of ``HANDLERS`` in broker/verbs.py, read without importing the broker."""
    tree = ast.parse((REPO / "broker" / "verbs.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "HANDLERS" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return {ast.literal_eval(key) for key in node.value.keys if key is not None}
    raise AssertionError("broker/verbs.py has no HANDLERS table")


def test_every_path_in_the_table_exists() -> None:
    paths = _paths(_section())
    assert len(paths) > 50, sorted(paths)  # the section was read
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"{DOC.relative_to(REPO)} names paths that do not exist: {missing}"


def test_the_path_pattern_leaves_out_what_is_not_a_repository_path() -> None:
    sample = "`cairn/proxy.py` `/workspace` `launch-v1` `cairn schedule fire` `daemon/`"
    assert _paths(sample) == {"cairn/proxy.py", "daemon/"}


def test_every_cli_command_has_a_row() -> None:
    named = set(_backticked(_section()))
    commands = _commands(app, "cairn")
    assert "cairn schedule run-now" in commands
    missing = [command for command in commands if command not in named]
    assert not missing, f"commands without a row in {DOC.relative_to(REPO)}: {missing}"


def test_every_broker_intent_kind_has_a_row() -> None:
    named = set(_backticked(_section()))
    kinds = _intent_kinds()
    assert "start-agent" in kinds
    missing = sorted(kinds - named)
    assert not missing, f"intent kinds without a row in {DOC.relative_to(REPO)}: {missing}"
