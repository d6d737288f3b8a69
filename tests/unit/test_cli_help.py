"""Help text says what a person needs: a default only where there is one, a required
option marked once (``[required]``), on every command and sub-command."""

from __future__ import annotations

import click
import pytest
from clirunner import CliRunner

from cairn.cli.commands import app


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every visible command under ``command``, as the words that name it."""
    found = [path]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            if not sub.hidden:
                found += command_paths(sub, (*path, name))
    return found


PATHS = command_paths(app)


def test_every_command_is_checked() -> None:
    assert {("launch",), ("logs",), ("schedule", "create"), ("storage", "init")} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_has_no_default_none_and_no_required_noise(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "[default: None]" not in result.output
    assert "[default: False]" not in result.output
    required = [
        param for param in _command(path).params
        if isinstance(param, click.Option) and param.required
    ]
    assert result.output.count("[required]") == len(required)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = app
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def test_real_defaults_and_required_marks_still_show() -> None:
    launch = CliRunner().invoke(app, ["launch", "--help"], terminal_width=100).output
    assert "[default: {}]" in launch and "(the current directory)" in launch
    assert "Usage: cairn launch [OPTIONS] DEFINITION" in launch
    upgrade = CliRunner().invoke(app, ["upgrade", "--help"], terminal_width=100).output
    assert "[required]" in upgrade.split("\n  --to ", 1)[1].split("\n  -", 1)[0]
    logs = CliRunner().invoke(app, ["logs", "--help"], terminal_width=100).output
    assert "[default: short-iso]" in logs
