"""``cairn workflow``: workflow definitions. Everything here is local: it reads and writes
the person's own files (``$XDG_CONFIG_HOME/cairn/``, :mod:`cairn.definitions`), reviews
statically, never runs a workflow and never asks cairnd."""


import os
import sys
import time
from pathlib import Path

import click

from cairn.cli.client import emit, fail
from cairn.cli.options import (
    CairnGroup,
    argument,
    confirm_or_stop,
    dry_run_flag,
    emit_or_empty,
    hidden_alias,
    json_flag,
    would,
    yes_flag,
)
from cairn.errors import UsageError
from cairn.terminal import printable, printable_lines

workflow_app = CairnGroup("workflow", help="Workflow definitions.", no_args_is_help=True)


def _user_name(definition: str) -> str:
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import resolve

    namespace, name = resolve.split(definition)
    if namespace != "user":
        raise UsageError(f"{definition} is not a user: definition", hint="name it user:NAME")
    return name


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


@workflow_app.command("draft")
@argument("name")
def workflow_draft(name: str) -> None:
    """Start (or reopen) an inert draft NAME.py in your config; opened in $EDITOR on a
    terminal, its path printed otherwise. A draft is never listed, launched or exposed.

    Example: cairn workflow draft fix-flaky
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import user

    path = user.create_draft(name)
    editor = os.environ.get("EDITOR", "").strip()
    if editor and sys.stdin.isatty() and sys.stdout.isatty():
        try:  # the CLI framework's editor launcher: $EDITOR may hold arguments, as in git
            click.edit(filename=str(path), editor=editor)
        except click.ClickException as exc:
            fail(f"{exc.message}; the draft is {path}")
    click.echo(str(path))


@workflow_app.command("review")
@argument("file", type=click.Path(path_type=Path))
@json_flag
def workflow_review(file: Path, json_out: bool = False) -> None:
    """Review a workflow statically: effect manifest and review hash (never runs it).

    Example: cairn workflow review ~/.config/cairn/drafts/fix-flaky.py
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.workflow.review import render_review, review_source

    try:
        source = file.read_text()
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}", code=2)
    review = review_source(source, filename=file.name)
    if json_out:
        emit(review.model_dump(mode="json"))
    else:
        click.echo(printable_lines(render_review(review)))


@workflow_app.command("install")
@argument("file", type=click.Path(path_type=Path))
@click.option(
    "--confirm",
    help="The review hash you confirmed (sha256:…, from 'workflow review').",
    required=True,
)
@click.option("--name", help="Install as user:NAME.")
@click.option(
    "--replace",
    help="Replace an installed definition of that name.",
    is_flag=True,
)
def workflow_install(
    file: Path,
    confirm: str,
    name: str | None = None,
    replace: bool = False,
) -> None:
    """Install a reviewed FILE.py as user:NAME (NAME: the file's stem) if its review hash
    is the one you confirmed.

    Example: cairn workflow install ~/.config/cairn/drafts/fix-flaky.py --confirm sha256:...
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import user

    record = user.install(file, confirm, name=name, replace=replace)
    click.echo(f"installed user:{record.name}  {record.review_hash}")


@workflow_app.command("list")
@json_flag
def workflow_list(json_out: bool = False) -> None:
    """Definitions: builtin, installed user: and project: of trusted projects (drafts are
    not listed: they cannot be launched).

    Example: cairn workflow list
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import resolve

    rows = resolve.listing()
    if emit_or_empty(rows, json_out, empty="no definitions"):
        return
    width = max(len(r["definition"]) for r in rows)
    for row in rows:
        extra = "  ".join(
            part
            for part in (
                row["status"],
                f"exposed={row['exposed']}" if row["exposed"] else "",
                row["where"],
            )
            if part
        )
        click.echo(printable(
            f"{row['definition']:<{width}}  {row['review_hash'] or '-':<71}  {extra}"
        ))


@workflow_app.command("show")
@argument("definition")
@json_flag
def workflow_show(definition: str, json_out: bool = False) -> None:
    """An installed user:NAME: its manifest, hash, when and by whom it was installed, and
    its source.

    Example: cairn workflow show user:fix-flaky
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import user
    from cairn.workflow.review import render_review

    record = user.installed(_user_name(definition), purpose="shown")
    review = user.checked_review(record)
    if json_out:
        emit({**record.model_dump(mode="json"), "review": review.model_dump(mode="json")})
        return
    click.echo(f"definition    user:{record.name}")
    click.echo(f"installed     {_when(record.installed_at)} by {printable(record.installed_by)}")
    click.echo(f"from          {printable(record.installed_from)}")
    click.echo(printable_lines(render_review(review)))
    click.echo("source")
    for line in record.source.splitlines():
        click.echo(f"  {printable(line, tabs=True)}")


@workflow_app.command("diff")
@argument("definition")
@argument("file", type=click.Path(path_type=Path))
@json_flag
def workflow_diff(
    definition: str,
    file: Path,
    json_out: bool = False,
) -> None:
    """What installing FILE over user:NAME would change in its manifest.

    Example: cairn workflow diff user:fix-flaky ~/.config/cairn/drafts/fix-flaky.py
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import user

    record = user.installed(_user_name(definition), purpose="compared")
    new_hash, lines = user.manifest_diff(record, file)
    if json_out:
        emit({"definition": f"user:{record.name}", "file": str(file),
              "installed_hash": record.review_hash, "review_hash": new_hash,
              "changed": new_hash != record.review_hash, "manifest_diff": lines})
        return
    if new_hash == record.review_hash:
        click.echo(printable(f"no change: {file} is user:{record.name} as installed ({new_hash})"))
        return
    click.echo(f"review hash   {record.review_hash} -> {new_hash}")
    if not lines:
        click.echo("manifest unchanged; only the source differs")
    for line in lines:
        click.echo(printable(line, tabs=True))
    click.echo(printable(
        f"to install it: cairn workflow install {file} --name {record.name} --replace "
        f"--confirm {new_hash}"
    ))


@workflow_app.command("rm")
@argument("definition")
@dry_run_flag
@yes_flag
def workflow_rm(definition: str, dry_run: bool = False, yes: bool = False) -> None:
    """Remove an installed user:NAME (and its exposure, if it was exposed); also
    'workflow remove'.

    Example: cairn workflow rm user:fix-flaky
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import registry, user

    name = _user_name(definition)
    registry.load_registry()  # a malformed registry refuses before anything is removed
    record = user.installed(name, purpose="removed")
    if dry_run:
        would(f"remove user:{record.name} ({record.review_hash}) and its exposure")
    confirm_or_stop(
        f"Remove user:{record.name} ({record.review_hash}) and its exposure? Installing it "
        "again takes a new review.",
        yes=yes,
    )
    record = user.remove(name)
    registry.unexpose(f"user:{name}", missing_ok=True)
    click.echo(f"removed user:{record.name}  {record.review_hash}")


# One removal verb everywhere (rm); the word people also type stays, hidden.
hidden_alias(workflow_app, workflow_rm, "remove")


@workflow_app.command("expose")
@argument("definition")
def workflow_expose(definition: str) -> None:
    """Expose an installed user:NAME (or a builtin:NAME) to models, at its current
    review hash.

    Example: cairn workflow expose user:fix-flaky
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import registry, resolve

    review_hash = resolve.exposable_hash(definition)
    registry.expose(definition, review_hash)
    click.echo(f"exposed {definition}  {review_hash}")


@workflow_app.command("unexpose")
@argument("definition")
def workflow_unexpose(definition: str) -> None:
    """Stop exposing a definition to models (a person can still launch it).

    Example: cairn workflow unexpose user:fix-flaky
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import registry

    registry.unexpose(definition)
    click.echo(f"unexposed {definition}")
