"""The documents that shipped text names (an error's hint, a check's detail, a unit's
comment, an example's header), read from the tree: the unit tier checks they are named
where the packages install them and exist in the tree, the system tier that the built
.deb holds them."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("cairn", "daemon", "broker", "coordinator", "worker", "packaging/libexec", "units",
           "docs/examples")
DOC_DIR = "/usr/share/doc/cairn/"
INSTALLED = re.compile(re.escape(DOC_DIR) + r"((?:docs|examples)/[\w./-]*\w)")
BARE = re.compile(r"(?<![/\w])docs/[\w/-]+\.md")


def shipped_texts() -> list[tuple[Path, str]]:
    """Every text file of the tree that a package installs (or renders from)."""
    texts = []
    for top in SHIPPED:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                try:
                    texts.append((path, path.read_text()))
                except UnicodeDecodeError:
                    continue
    return texts


def installed_names() -> dict[str, list[str]]:
    """``docs/…`` or ``examples/…`` under :data:`DOC_DIR` → the files naming it."""
    names: dict[str, list[str]] = {}
    for path, text in shipped_texts():
        for match in INSTALLED.finditer(text):
            names.setdefault(match.group(1), []).append(str(path.relative_to(REPO)))
    return names


def in_tree(installed: str) -> Path:
    """Where ``/usr/share/doc/cairn/<installed>`` comes from (``examples/`` is
    ``docs/examples/``, as debian/cairn.examples and the spec install it)."""
    return REPO / "docs" / installed.removeprefix("docs/")
