"""Every ``cairn`` command line the documentation shows is one the CLI accepts, and says
whether a test runs it: in docs/*.md and the README, each code block with one is run word
for word by the system test named in :data:`EXECUTED` or is marked ```` ```illustrative````
(it needs a run, a hash or a host of the reader's); in the man pages, the EXAMPLES
section says it is illustrative. Placeholders (RUN, NEW, ``flow_…``) stand for a run and
are read as ``@last``; the rest of each line goes through the command's own parser,
options, arguments and their checks, as typed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from cairn.cli.commands import app

REPO = Path(__file__).resolve().parents[2]
# (document, heading) of the blocks the system tier runs word for word, and the test.
EXECUTED = {
    ("docs/first-run.md", "### A local OpenAI-compatible server"): "tests/system/test_providers.py",
}
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^(?:\$ )?(?:sudo )?(cairn [a-z].*)$")
RUN_PLACEHOLDERS = {"RUN", "NEW", "flow_…", "flow_..."}


def _commands(block: str) -> list[str]:
    """The ``cairn`` command lines of ``block``: continuations joined, a comment, a
    pipe or a redirection after the command left off."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        match = COMMAND.match(line.strip())
        if match:
            code = re.split(r"\s+#\s", match.group(1))[0]
            found.append(re.split(r"\s(?:\||&&|;|2?>)\s", code)[0].strip())
    return found


def _blocks() -> list[tuple[str, str, str, list[str]]]:
    """(document, heading, info string, command lines) of every fenced block with one."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            commands = _commands(match.group(2))
            if commands:
                headings = re.findall(r"^(#+ .*)$", text[: match.start()], re.M)
                found.append((str(doc.relative_to(REPO)), headings[-1] if headings else "",
                              match.group(1), commands))
    return found


def _man_examples() -> list[tuple[str, str, list[str]]]:
    """(page, its EXAMPLES text, command lines of its indented blocks) of every man page."""
    found = []
    for page in sorted((REPO / "docs" / "man").glob("*.md")):
        text = page.read_text()
        indented = "\n".join(line[4:] for line in text.splitlines() if line.startswith("    "))
        commands = _commands(indented)
        if commands:
            examples = text.split("\n# EXAMPLES\n", 1)[1].split("\n# ", 1)[0]
            found.append((page.name, examples, commands))
    return found


BLOCKS = _blocks()
MAN = _man_examples()
LINES = sorted({line for *_, lines in BLOCKS for line in lines}
               | {line for *_, lines in MAN for line in lines})


def test_the_documentation_is_read() -> None:
    assert len(BLOCKS) > 25 and len(MAN) >= 4 and len(LINES) > 80


@pytest.mark.parametrize("line", LINES)
def test_the_command_line_is_one_the_cli_accepts(line: str) -> None:
    argv = ["@last" if word in RUN_PLACEHOLDERS else word for word in shlex.split(line)][1:]
    while argv[:1] == ["-H"]:
        argv = argv[2:]
    command: click.Command = app
    path = ["cairn"]
    while isinstance(command, click.Group) and argv:
        sub = command.commands.get(argv[0])
        assert sub is not None, f"{line}: no command {argv[0]!r}"
        command, path, argv = sub, [*path, argv[0]], argv[1:]
    assert not isinstance(command, click.Group), f"{line}: names a group, not a command"
    try:
        with command.make_context(" ".join(path), argv):
            pass
    except click.exceptions.Exit:  # --help
        pass


@pytest.mark.parametrize(("doc", "heading", "info", "commands"), BLOCKS,
                         ids=[f"{d}:{h}" for d, h, *_ in BLOCKS])
def test_a_block_is_run_by_a_test_or_marked_illustrative(
    doc: str, heading: str, info: str, commands: list[str]
) -> None:
    test = EXECUTED.get((doc, heading))
    if test is None:
        assert "illustrative" in info.split(), f"{doc} {heading}: {commands[0]}"
        return
    assert "illustrative" not in info.split()
    assert heading in (REPO / test).read_text(), f"{test} no longer runs {doc} {heading}"


@pytest.mark.parametrize(("page", "examples", "commands"), MAN, ids=[p for p, *_ in MAN])
def test_a_man_page_says_its_examples_are_illustrative(
    page: str, examples: str, commands: list[str]
) -> None:
    assert "illustrative" in examples.split("\n\n", 1)[0], page
