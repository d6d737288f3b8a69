"""The ``cairn`` command tree: :data:`app`, click's group of the commands of every
module. One module per concern: ``runs``, ``artifacts``, ``people``, ``storage``, ``mcp``
and ``completion`` add top-level commands; ``storage``, ``workflow``, ``schedule``,
``project``, ``notify``, ``config`` and ``provider`` are sub-groups; ``client`` and
``options`` are what they share. This module assembles them (and holds ``cairn
version``), and none of them imports it. A command imports the protocol model it sends
when it runs, so a start that only shows help or completes a command's name loads no
pydantic.
"""

import click

from cairn.cli import artifacts, completion, mcp, people, runs, storage
from cairn.cli.config import config_app
from cairn.cli.notify import notify_app
from cairn.cli.options import CairnGroup, json_flag
from cairn.cli.project import project_app
from cairn.cli.provider import provider_app
from cairn.cli.schedule import schedule_app
from cairn.cli.storage import storage_app
from cairn.cli.workflow import workflow_app

__all__ = ["app"]


def version() -> str:
    """The installed package's version ("unknown" when run from a tree not installed)."""
    # here, not at the top: every cairn command would pay for this import
    from importlib import metadata

    try:
        return metadata.version("cairn")
    except metadata.PackageNotFoundError:
        return "unknown"


def _host_comes_first(ctx: click.Context, param: click.Parameter, host: str | None) -> None:
    # cairn.cli.main reads a leading -H before click; anywhere else it is a mistake
    if host is not None:
        raise click.UsageError("-H comes first: cairn -H [USER@]HOST COMMAND…", ctx)


def _print_version(ctx: click.Context, param: click.Parameter, wanted: bool) -> None:
    if wanted:
        click.echo(f"cairn {version()}")
        ctx.exit()


app = CairnGroup(
    "cairn",
    help="Run reviewed, durable AI-agent workflows on systemd and Btrfs.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["--help", "-h"], "show_default": True},
    params=[
        click.Option(
            ["--version"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
        click.Option(
            ["-H", "--host"],
            metavar="[USER@]HOST",
            expose_value=False,
            callback=_host_comes_first,
            help="Run the command on HOST's cairn, over ssh (as systemctl -H does); paths "
            "in it name HOST's files.",
        ),
    ],
)
runs.register(app)
artifacts.register(app)
people.register(app)
storage.register(app)
mcp.register(app)
for group in (
    storage_app, workflow_app, schedule_app, project_app, notify_app, config_app, provider_app
):
    app.add_command(group)
completion.register(app)


@app.command("version")
@json_flag
def version_command(json_out: bool = False) -> None:
    """Print the version, and the version of the schema of every command's --json output
    (docs/json-schema.json).

    Example: cairn version --json
    """
    from cairn.cli.client import emit
    from cairn.protocol.jsonschema import JSON_SCHEMA_VERSION

    if json_out:
        emit({"version": version(), "json_schema": JSON_SCHEMA_VERSION})
    else:
        click.echo(f"cairn {version()}")
        click.echo(f"--json schema {JSON_SCHEMA_VERSION}")
