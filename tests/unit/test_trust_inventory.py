"""The trust inventory in docs/architecture.md is the code's: every function of root's
code that parses input is listed with who writes that input, and every test the table
says attacks it exists.

Root's code is ``broker/`` and the library files the "What the root broker loads" table
lists (tests/unit/test_import_rules.py keeps that table equal to the broker's computed
imports).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"

# Calls that turn bytes someone wrote into values root acts on.
PARSERS = frozenset({
    "model_validate_json", "model_validate", "loads", "read_json", "read_bytes", "read_text",
    "recv", "recvmsg", "parse_attestation", "parse_metric_output", "body", "typed_body",
    "unpack", "unpack_from",
})
# Writers with no attacker of their own: their rows may name no test.
TRUSTED_WRITERS = ("PID 1", "the kernel")


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.find("\n### ", start + len(title))
    end2 = text.find("\n## ", start + len(title))
    stops = [e for e in (end, end2) if e != -1]
    return text[start:min(stops)] if stops else text[start:]


def table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[1:]  # without the header


def root_files() -> list[Path]:
    loaded = table_rows(section("### What the root broker loads"))
    library = [REPO / row[0].strip("`") for row in loaded]
    return sorted((REPO / "broker").glob("*.py")) + library


def parse_points() -> set[str]:
    found: set[str] = set()
    for file in root_files():
        tree = ast.parse(file.read_text(), str(file))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    callee = node.func
                    name = (callee.attr if isinstance(callee, ast.Attribute)
                            else callee.id if isinstance(callee, ast.Name) else "")
                    if name in PARSERS:
                        found.add(f"{file.relative_to(REPO)}:{function.name}")
    return found


def inventory() -> list[list[str]]:
    rows = table_rows(section("### Trust inventory"))
    assert rows, "docs/architecture.md has no trust inventory table"
    return rows


def test_every_function_of_root_that_parses_input_is_in_the_inventory() -> None:
    listed = {
        ref.strip("`")
        for row in inventory()
        for ref in re.findall(r"`[^`]+:[^`]+`", row[3])
    }
    found = parse_points()
    assert found - listed == set(), "root parses input here, and the inventory does not say so"
    assert listed - found == set(), "the inventory lists a parser that root's code lacks"


def test_every_input_names_a_test_that_attacks_it() -> None:
    for row in inventory():
        what, writer, attacked = row[0], row[1], row[4]
        tests = re.findall(r"`(tests/[^`:]+)::(\w+)`", attacked)
        if not tests:
            assert attacked == "—" and writer.startswith(TRUSTED_WRITERS), (
                f"{what}: written by {writer}, and no test attacks it"
            )
        for path, name in tests:
            source = (REPO / path).read_text()
            assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} does not exist"
