#!/usr/bin/env python3
"""Expand the man page sources into pandoc Markdown, ready for packaging/render-man.sh.

    python3 packaging/gen-man.py --out DIR

Sources: ``docs/man/NAME.SECTION.md``, pandoc Markdown with a ``% NAME(SECTION) …``
title block whose date line is ``% @DATE@``: the month of the newest entry of
``packaging/debian/changelog``, so every page carries the same date. In ``cairn.1.md`` the
line ``@COMMANDS@`` becomes every visible command of the click CLI
(``cairn.cli.commands.app``): its usage, help text and options, so the page cannot drift
from the CLI. Writes ``DIR/NAME.SECTION.md`` for each source.
"""

from __future__ import annotations

import argparse
import re
import string
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "docs" / "man"
SOURCE_RE = re.compile(r"^[a-z][a-z0-9.-]*\.[1578]\.md$")


def md_text(text: str) -> str:
    """Plain text as pandoc Markdown: every ASCII punctuation character escaped."""
    text = " ".join(text.replace("\b", " ").split())  # click's no-rewrap marks
    return "".join("\\" + c if c in string.punctuation else c for c in text)


def _walk(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """Every visible leaf command under ``command`` (the CLI's click command tree)."""
    found: list[tuple[list[str], Any]] = []
    if getattr(command, "hidden", False):
        return found
    subcommands = getattr(command, "commands", None)
    if subcommands is not None:
        for sub_name in sorted(subcommands):
            found.extend(_walk(subcommands[sub_name], [*path, sub_name]))
    else:
        found.append((path, command))
    return found


def visible_commands() -> list[str]:
    """``cairn launch``, ``cairn storage init``, …: every command the page lists."""
    from cairn.cli.commands import app

    return [" ".join(["cairn", *path]) for path, _ in _walk(app, [])]


def cli_commands() -> str:
    """Markdown for every visible leaf command of the CLI: usage, help, options."""
    from cairn.cli.commands import app

    parts: list[str] = []
    for path, command in _walk(app, []):
        name = " ".join(["cairn", *path])
        ctx = command.context_class(command, info_name=name)
        usage = " ".join(command.collect_usage_pieces(ctx))
        parts += [f"## {name}", "", f"**{md_text(name)}** {md_text(usage)}", ""]
        if command.help:
            parts += [md_text(command.help), ""]
        for param in command.params:
            record = param.get_help_record(ctx)
            if record is not None:
                flags, help_text = record
                parts += [f"**{md_text(flags)}**", f":   {md_text(help_text or '')}", ""]
    return "\n".join(parts)


def release_date() -> str:
    """The month and year of the newest entry of the Debian changelog (the version the
    pages describe): every page's date, from this one source. The .deb's build moves
    packaging/debian to debian/ (with an entry of its own for --version)."""
    import email.utils

    moved = REPO / "debian" / "changelog"
    changelog = (moved if moved.exists() else REPO / "packaging/debian/changelog").read_text()
    found = re.search(r"^ -- .+?  (.+)$", changelog, re.M)
    if found is None:
        raise SystemExit("gen-man: packaging/debian/changelog has no trailer line with a date")
    return email.utils.parsedate_to_datetime(found.group(1)).strftime("%B %Y")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    commands = cli_commands()
    date = release_date()
    args.out.mkdir(parents=True, exist_ok=True)
    for source in sorted(SOURCES.iterdir()):
        if not SOURCE_RE.match(source.name):
            raise SystemExit(
                f"gen-man: {source.name} is not NAME.SECTION.md (section 1, 5, 7 or 8)"
            )
        text = source.read_text().replace("@COMMANDS@", commands)
        if text.split("\n")[2:3] != ["% @DATE@"]:
            raise SystemExit(f"gen-man: {source.name}'s title block must end with % @DATE@")
        text = text.replace("% @DATE@", f"% {date}", 1)
        target = args.out / source.name
        target.write_text(text)
        print(target)


if __name__ == "__main__":
    main()
