"""The ``cairn`` command. It talks only to cairnd (:mod:`cairn.cli.client`); it never
touches the journal or storage (except ``storage init``, which is local by nature).
``workflow`` and ``project`` keep the person's own definitions in their config, locally.

One module per concern: ``runs``, ``people`` and ``mcp`` add top-level commands, ``storage``,
``workflow``, ``schedule``, ``project``, ``notify`` and ``config`` are sub-apps; ``client``
and ``options`` are what they share. This module only assembles them, and none of them
imports it. A command imports the protocol model it sends when it runs, so a start that
only shows help or completes a command's name loads no pydantic. The modules with commands
leave out ``from __future__ import annotations``: typer evaluates a string annotation again
each time it reads a command's parameters, several times per command at every start.
"""

# ruff: noqa: E402 - typer is imported (without rich) by the call below, before any import

import signal
import sys
from typing import Annotated

from cairn.cli.lazyrich import import_typer_without_rich

import_typer_without_rich()

import click
import typer

from cairn.cli import completion, mcp, people, runs, storage
from cairn.cli.config import config_app
from cairn.cli.notify import notify_app
from cairn.cli.options import CairnGroup
from cairn.cli.project import project_app
from cairn.cli.schedule import schedule_app
from cairn.cli.storage import storage_app
from cairn.cli.workflow import workflow_app
from cairn.errors import CairnError
from cairn.terminal import printable

__all__ = ["app", "main"]

app = typer.Typer(
    name="cairn",
    cls=CairnGroup,
    help="Run reviewed, durable AI-agent workflows on systemd and Btrfs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Typer lists a group's own commands first, then its sub-apps, each in the order added.
runs.register(app)
people.register(app)
storage.register(app)
mcp.register(app)
app.add_typer(storage_app, name="storage")
app.add_typer(workflow_app, name="workflow")
app.add_typer(schedule_app, name="schedule")
app.add_typer(project_app, name="project")
app.add_typer(notify_app, name="notify")
app.add_typer(config_app, name="config")
completion.register(app)


def version() -> str:
    """The installed package's version ("unknown" when run from a tree not installed)."""
    # here, not at the top: every cairn command would pay for this import
    from importlib import metadata

    try:
        return metadata.version("cairn")
    except metadata.PackageNotFoundError:
        return "unknown"


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"cairn {version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Run reviewed, durable AI-agent workflows on systemd and Btrfs."""


class Interrupted(BaseException):
    """Ctrl-C, raised past click (which would turn it into "Aborted!" and status 1)."""


def _on_sigint(signum: int, frame: object) -> None:
    raise Interrupted


def main() -> None:
    """Exit status: 0 success, 2 usage (or a refused request), 1 other error, 130 Ctrl-C.
    Every error is one line (``cairn: …``) with a ``hint:`` line, usage errors too."""
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        status = app(standalone_mode=False)
    except Interrupted:
        sys.exit(130)
    except click.UsageError as exc:
        typer.echo(f"cairn: {printable(exc.format_message())}", err=True)
        if exc.ctx is not None:
            typer.echo(f"hint: see '{exc.ctx.command_path} --help'", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        typer.echo(f"cairn: {printable(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(1)
    except CairnError as exc:
        # cairnd's errors quote runs, paths and answers: names an agent may have chosen
        typer.echo(f"cairn: {printable(exc.message)}", err=True)
        if exc.hint:
            typer.echo(f"hint: {printable(exc.hint)}", err=True)
        sys.exit(2 if exc.code in ("usage", "invalid", "review", "not-found") else 1)
    sys.exit(status if isinstance(status, int) else 0)
