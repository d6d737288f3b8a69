"""What the docs cite exists: every test file (and ``file.py::test``) they name, and every
relative link, so a doc cannot point at a test or a page that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
_TEST = re.compile(r"(tests/[A-Za-z0-9_/.-]+\.py)(?:::([A-Za-z_][A-Za-z0-9_]*))?")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _name(doc: Path) -> str:
    return str(doc.relative_to(REPO))


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_cited_tests_exist(doc: Path) -> None:
    text = " ".join(doc.read_text().split())  # a citation may wrap across lines
    missing = []
    for path, function in _TEST.findall(text):
        file = REPO / path
        if not file.is_file():
            missing.append(path)
        elif function and not re.search(rf"^(async )?def {function}\(", file.read_text(),
                                        re.MULTILINE):
            missing.append(f"{path}::{function}")
    assert not missing, f"{_name(doc)} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_relative_links_resolve(doc: Path) -> None:
    broken = [
        target
        for target in _LINK.findall(doc.read_text())
        if "://" not in target and not target.startswith("mailto:")
        and not (doc.parent / target).exists()
    ]
    assert not broken, f"{_name(doc)} links to what does not exist: {broken}"
