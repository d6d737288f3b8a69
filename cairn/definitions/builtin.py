"""``builtin:NAME``: the workflows that ship with Cairn (``cairn/builtin/workflows/``)."""

from __future__ import annotations

from importlib import resources

from cairn.errors import NotFound


def builtin_names() -> list[str]:
    """Every builtin definition's name (``implement``, …), sorted."""
    folder = resources.files("cairn.builtin") / "workflows"
    return sorted(p.name[:-3].replace("_", "-") for p in folder.iterdir() if p.name.endswith(".py"))


def builtin_source(name: str) -> tuple[str, str]:
    """(source, file name) of ``builtin:NAME``; :class:`NotFound` listing the builtins."""
    file = resources.files("cairn.builtin") / "workflows" / f"{name.replace('-', '_')}.py"
    if not file.is_file():
        raise NotFound(
            f"unknown definition 'builtin:{name}'",
            hint=f"builtin definitions: {', '.join('builtin:' + n for n in builtin_names())}",
        )
    return file.read_text(), f"{name}.py"
