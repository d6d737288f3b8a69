"""typer without rich until help is shown. typer imports rich (its Markdown, syntax
highlighting and tables) with itself, only to render help: about a third of every
``cairn`` start. :func:`import_typer_without_rich`, called before anything imports typer,
imports it with rich hidden, then gives typer stand-ins that load rich and typer's help
renderer the first time typer uses them.

Help looks as before: typer 0.15 hands every command the app's ``rich_markup_mode`` as
given, its default placeholder, and only compares it with None, "rich" and "markdown"; a
placeholder of None (what typer takes without rich) compares as one of "rich" does.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

# Help marks a required parameter with its "*" column alone, never also "[required]".
REQUIRED_LONG_STRING = ""


def load_rich() -> ModuleType:
    """typer's help renderer, rich loaded, put in place in typer and set to cairn's style."""
    rich_utils = importlib.import_module("typer.rich_utils")
    setattr(rich_utils, "REQUIRED_LONG_STRING", REQUIRED_LONG_STRING)  # noqa: B010
    core = sys.modules["typer.core"]
    setattr(core, "rich", importlib.import_module("rich"))  # noqa: B010 - not typer's stub
    setattr(core, "rich_utils", rich_utils)  # noqa: B010
    return rich_utils


class _OnFirstUse:
    """Stands in for ``typer.core.rich`` or ``typer.core.rich_utils`` until typer first
    reaches into it (to render help); then loads the real ones and answers from them."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        load_rich()
        return getattr(importlib.import_module(self.module), name)


def import_typer_without_rich() -> None:
    """Import typer, deferring rich to the first help shown. When typer or rich is already
    imported (a test, the man page generator), only set cairn's help style."""
    if "typer" in sys.modules or "rich" in sys.modules or not importlib.util.find_spec("rich"):
        importlib.import_module("typer")
        if importlib.util.find_spec("rich"):
            load_rich()
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # typer's "import rich" fails
    try:
        importlib.import_module("typer")
    finally:
        del sys.modules["rich"]
    core = sys.modules["typer.core"]
    setattr(core, "rich", _OnFirstUse("rich"))  # noqa: B010
    setattr(core, "rich_utils", _OnFirstUse("typer.rich_utils"))  # noqa: B010
