"""The diagrams in docs/diagrams: the operation states are the journal's own transition
table, the run states name every RunState, and every SVG shows exactly the nodes and
edges of its Graphviz source (re-render with packaging/render-diagrams.sh)."""

from __future__ import annotations

import html
import importlib.util
import re
import typing
from pathlib import Path

import pytest

from cairn.journal.rows import TERMINAL_RUN_STATES, RunState

DIAGRAMS = Path(__file__).resolve().parents[2] / "docs" / "diagrams"
SOURCES = sorted(DIAGRAMS.glob("*.dot"))
_EDGE = re.compile(r'^\s*"?([\w-]+)"?\s*->\s*"?([\w-]+)"?', re.MULTILINE)
_NODE = re.compile(r'^\s*"?([\w-]+)"?\s*(?:\[[^\]]*\])?\s*;', re.MULTILINE)
_KEYWORDS = {"node", "edge", "graph", "rankdir"}


def graph(source: str) -> tuple[set[str], set[tuple[str, str]]]:
    edges = set(_EDGE.findall(source))
    nodes = {n for n in _NODE.findall(source) if n not in _KEYWORDS}
    for a, b in edges:
        nodes |= {a, b}
    return nodes, edges


def test_op_states_are_the_journals_transition_table() -> None:
    spec = importlib.util.spec_from_file_location("gen", DIAGRAMS / "gen_op_states.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (DIAGRAMS / "op-states.dot").read_text() == gen.dot(), (
        "regenerate: python3 docs/diagrams/gen_op_states.py > docs/diagrams/op-states.dot"
    )


def test_run_states_name_every_state_and_mark_the_final_ones() -> None:
    source = (DIAGRAMS / "run-states.dot").read_text()
    nodes, edges = graph(source)
    assert nodes == set(typing.get_args(RunState))
    for state in TERMINAL_RUN_STATES:
        assert re.search(rf"(^|;)\s*{state} \[peripheries=2\];", source, re.MULTILINE), state
        assert not [e for e in edges if e[0] == state], f"{state} is final"


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_each_svg_shows_its_source(source: Path) -> None:
    svg = source.with_suffix(".svg")
    assert svg.is_file(), f"render it: packaging/render-diagrams.sh ({svg.name} missing)"
    titles = {html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg.read_text())}
    nodes, edges = graph(source.read_text())
    shown = titles - {source.stem.replace("-", "_")}
    assert shown == nodes | {f"{a}->{b}" for a, b in edges}, (
        f"{svg.name} is stale: packaging/render-diagrams.sh"
    )
