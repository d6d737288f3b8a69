"""The ``cairn`` command tree: typer assembles the commands of every module into
:data:`app`. One module per concern: ``runs``, ``people`` and ``mcp`` add top-level
commands, ``storage``, ``workflow``, ``schedule``, ``project``, ``notify`` and ``config``
are sub-apps; ``client`` and ``options`` are what they share. This module only assembles
them, and none of them imports it. A command imports the protocol model it sends when it
runs, so a start that only shows help or completes a command's name loads no pydantic.
The modules with commands leave out ``from __future__ import annotations``: typer
evaluates a string annotation again each time it reads a command's parameters, several
times per command at every start.
"""

# ruff: noqa: E402 - typer is imported (without rich) by the call below, before any import

from typing import Annotated

from cairn.cli.lazyrich import import_typer_without_rich

import_typer_without_rich()

import typer

from cairn.cli import completion, mcp, people, runs, storage
from cairn.cli.config import config_app
from cairn.cli.notify import notify_app
from cairn.cli.options import CairnGroup
from cairn.cli.project import project_app
from cairn.cli.provider import provider_app
from cairn.cli.schedule import schedule_app
from cairn.cli.storage import storage_app
from cairn.cli.workflow import workflow_app

__all__ = ["app"]

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
app.add_typer(provider_app, name="provider")
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
