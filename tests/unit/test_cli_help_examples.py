"""Every visible command's help ends with an example, and the example is a command line
that command's own parser accepts (options, arguments and their checks), so no example
can drift from the CLI. Examples need a host and a run to do anything, so they are
parsed here, not run; docs/first-run.md's are run by the system tier."""

from __future__ import annotations

import shlex

import click
import pytest

from cairn.cli.commands import app

ROOT = app


def visible(command: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    if isinstance(command, click.Group):
        found = []
        for name in sorted(command.commands):
            sub = command.commands[name]
            if not sub.hidden:
                found += visible(sub, [*path, name])
        return found
    return [(path, command)]


COMMANDS = visible(ROOT, ["cairn"])


def example_of(command: click.Command) -> str:
    text = " ".join((command.help or "").split())
    assert "Example: " in text, "no example in its help"
    line = text.rsplit("Example: ", 1)[1]
    return line.rsplit(" | ", 1)[-1].removeprefix("sudo ")  # the cairn part of a pipeline


def test_every_visible_command_is_checked() -> None:
    assert len(COMMANDS) > 50
    assert ["cairn", "schedule", "create"] in [path for path, _ in COMMANDS]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_the_example_in_its_help_is_a_command_line_it_accepts(
    path: list[str], command: click.Command
) -> None:
    argv = shlex.split(example_of(command))
    assert argv[: len(path)] == path
    with command.make_context(" ".join(path), argv[len(path):]) as ctx:
        assert ctx.params is not None
