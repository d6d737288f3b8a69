#!/usr/bin/env python3
"""Generate the man pages into a build directory.

    python3 packaging/gen-man.py --out DIR

Sources: ``docs/man/*.md`` (a small Markdown subset: a ``% name(section) | title`` line,
``# HEADING``, paragraphs, ``- `` items, ``code`` spans). In ``cairn.1.md`` the line
``@COMMANDS@`` is replaced by every command of the typer CLI (``cairn.cli.app``): its
usage, help text and options, so the page cannot drift from the CLI.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "docs" / "man"
HEADER_RE = re.compile(r"^% (\S+)\((\d)\) \| (.+)$")
DATE = "2025-12-02"


def roff_text(text: str) -> str:
    """Escape text for roff and render ``code`` spans in bold."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line
                     for line in text.splitlines())


def markdown_to_roff(markdown: str, commands: str) -> tuple[str, str, str]:
    """(name, section, roff) of one page source."""
    lines = markdown.splitlines()
    header = HEADER_RE.match(lines[0])
    if header is None:
        raise SystemExit("gen-man: the first line must be '% name(section) | title'")
    name, section, title = header.groups()
    out = [f'.TH "{name.upper()}" "{section}" "{DATE}" "Cairn" "{title}"']
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.extend([".PP", roff_text(" ".join(paragraph))])
            paragraph.clear()

    for line in lines[1:]:
        if line.startswith("# "):
            flush()
            out.append(f".SH {line[2:].strip()}")
        elif line.strip() == "@COMMANDS@":
            flush()
            out.append(commands)
        elif line.startswith("- "):
            flush()
            out.extend([".IP \\(bu 2", roff_text(line[2:].strip())])
        elif line.startswith("  ") and out and not paragraph and out[-2:-1] == [".IP \\(bu 2"]:
            out[-1] += "\n" + roff_text(line.strip())
        elif not line.strip():
            flush()
        else:
            paragraph.append(line.strip())
    flush()
    return name, section, "\n".join(out) + "\n"


def _walk(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """Every visible leaf command under ``command`` (typer's click objects, reached through
    typer so that click need not be imported: typer releases differ in how they ship it)."""
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


def cli_commands() -> str:
    """roff for every leaf command of the CLI: usage, help, options."""
    import typer

    from cairn.cli import app

    root = typer.main.get_command(app)
    parts: list[str] = []
    for path, command in _walk(root, []):
        ctx = command.context_class(command, info_name=" ".join(["cairn", *path]))
        usage = " ".join(command.collect_usage_pieces(ctx))
        parts.append(f".SS {roff_text(' '.join(['cairn', *path]))}")
        parts.append(f".B {roff_text(' '.join(['cairn', *path]))}\n{roff_text(usage)}")
        if command.help:
            parts.extend([".PP", roff_text(" ".join(command.help.split()))])
        for param in command.params:
            record = param.get_help_record(ctx)
            if record is None:
                continue
            flags, help_text = record
            help_text = (help_text or "").replace("\\[", "[")  # rich markup escapes
            parts.extend([".TP", f"\\fB{roff_text(flags)}\\fR", roff_text(help_text or "")])
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    commands = cli_commands()
    args.out.mkdir(parents=True, exist_ok=True)
    for source in sorted(SOURCES.glob("*.md")):
        name, section, roff = markdown_to_roff(source.read_text(), commands)
        target = args.out / f"{name}.{section}"
        target.write_text(roff)
        print(target)


if __name__ == "__main__":
    main()
