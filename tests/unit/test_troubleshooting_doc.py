"""docs/troubleshooting.md covers every error code the code defines, and every ``cairn``
command it tells a person to run exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click

from cairn.cli.commands import app

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "troubleshooting.md"
PACKAGES = ("cairn", "daemon", "broker", "coordinator", "worker")


def _codes(file: Path) -> dict[str, str]:
    """``code = "…"`` class attributes of the classes in ``file``: code -> class."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if (
                isinstance(item, ast.Assign)
                and [getattr(t, "id", None) for t in item.targets] == ["code"]
                and isinstance(item.value, ast.Constant)
                and isinstance(item.value.value, str)
            ):
                found[item.value.value] = node.name
    return found


def _all_codes() -> dict[str, str]:
    found: dict[str, str] = {}
    for package in PACKAGES:
        for file in sorted((REPO / package).rglob("*.py")):
            found.update({code: f"{file.relative_to(REPO)}:{cls}"
                          for code, cls in _codes(file).items()})
    return found


def _sections() -> set[str]:
    return set(re.findall(r"^### `([a-z-]+)`$", DOC.read_text(), re.MULTILINE))


def test_every_code_of_cairn_errors_has_a_section() -> None:
    codes = _codes(REPO / "cairn" / "errors.py")
    assert {"error", "usage", "broker-refused", "process-failed"} <= set(codes)  # parse found them
    missing = sorted(set(codes) - _sections())
    assert not missing, f"docs/troubleshooting.md has no section for: {missing}"


def test_every_code_anywhere_has_a_section() -> None:
    codes = _all_codes()
    # Errors of one concern live with it (cairn/errors.py says so), and are found there.
    assert {"config", "policy", "blocked", "budget-spent", "busy", "run-ended", "stale",
            "already-answered", "lease-lost"} <= set(codes)
    assert {"review", "lease-lost", "illegal-transition", "nondeterminism",
            "operation-failed"} <= set(codes)
    missing = {code: where for code, where in codes.items() if code not in _sections()}
    assert not missing, f"docs/troubleshooting.md has no section for: {missing}"


def test_no_section_names_a_code_that_does_not_exist() -> None:
    unknown = _sections() - set(_all_codes()) - {"internal"}
    assert not unknown, f"sections for codes no class defines: {sorted(unknown)}"


def _commands() -> dict[str, set[str]]:
    """Top-level commands, and each group's subcommands."""
    root = app
    assert isinstance(root, click.Group)
    tree: dict[str, set[str]] = {}
    for name, command in root.commands.items():
        tree[name] = set(command.commands) if isinstance(command, click.Group) else set()
    return tree


def test_every_cairn_command_the_doc_names_exists() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```.*?```", text, re.DOTALL)
    inline = [" ".join(span.split()) for span in re.findall(r"`[^`]+`", re.sub(
        r"```.*?```", "", text, flags=re.DOTALL))]  # a code span may wrap across lines
    spans = blocks + inline
    named = [
        (first, second)
        for span in spans
        for first, second in re.findall(
            r"(?:^|[`']|sudo )cairn ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", span, re.MULTILINE
        )
    ]
    assert ("storage", "init") in named  # the pattern finds group commands too
    tree = _commands()
    wrong = []
    for first, second in named:
        if first not in tree:
            wrong.append(first)
        elif tree[first] and second not in tree[first]:
            wrong.append(f"{first} {second}")
    assert not wrong, f"docs/troubleshooting.md names cairn commands that do not exist: {wrong}"
    assert {"show", "logs", "doctor"} <= {first for first, _ in named}
