"""Every document that shipped text names is named where the packages install it,
``/usr/share/doc/cairn/...``, and exists in the tree that becomes it. The system tier
checks the same names against the built .deb (``tests/system/test_packages.py``)."""

from __future__ import annotations

from docrefs import BARE, REPO, in_tree, installed_names, shipped_texts


def test_shipped_text_names_documents_where_they_are_installed() -> None:
    bare = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for path, text in shipped_texts()
        for match in BARE.finditer(text)
    ]
    assert bare == [], "name them as /usr/share/doc/cairn/docs/…"


def test_every_installed_document_named_exists_in_the_tree() -> None:
    names = installed_names()
    assert {"docs/agents.md", "docs/people.md", "examples/profiles.d"} <= set(names)
    missing = {name: where for name, where in names.items() if not in_tree(name).exists()}
    assert missing == {}
