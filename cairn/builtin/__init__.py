"""The workflows and agent profiles that ship with Cairn (``builtin:NAME``)."""

from __future__ import annotations

from importlib import resources


def workflow_names() -> list[str]:
    """The NAME of every ``builtin:NAME`` workflow, sorted."""
    folder = resources.files("cairn.builtin") / "workflows"
    return sorted(p.name[:-3] for p in folder.iterdir() if p.name.endswith(".py"))
