"""``cairn workflow``: workflow definitions. ``review`` is local: it reads the file and
reviews it statically, never runs it and never asks cairnd."""

from __future__ import annotations

from pathlib import Path

import typer

from cairn.cli.client import emit, fail
from cairn.cli.options import JsonFlag
from cairn.workflow.review import render_review, review_source

workflow_app = typer.Typer(help="Workflow definitions.", no_args_is_help=True)


@workflow_app.command("review")
def workflow_review(file: Path, json_out: JsonFlag = False) -> None:
    """Review a workflow statically: effect manifest and review hash (never runs it)."""
    try:
        source = file.read_text()
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}", code=2)
    review = review_source(source, filename=file.name)
    if json_out:
        emit(review.model_dump(mode="json"))
    else:
        typer.echo(render_review(review))
