"""``cairn artifacts``: the files a run's agents published in ``/outputs/artifacts/``, and
one of them saved. An artifact's bytes are the agent's: they go to a file or a pipe,
never raw to a terminal."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from cairn.cli.client import emit, fail, list_or_empty, object_or_empty, request, typed
from cairn.cli.options import argument, columns, human_size, json_flag, run_argument
from cairn.terminal import printable

if TYPE_CHECKING:
    from cairn.protocol.replies import ArtifactContent, ArtifactsReply

SHOWN = 5  # artifact names cairn show names on an operation's line


def register(app: click.Group) -> None:
    app.command("artifacts")(artifacts)


@run_argument
@argument("op_id", metavar="[OP]", required=False)
@argument("name", metavar="[NAME]", required=False)
@click.option("--output", "-o", metavar="FILE", type=click.Path(dir_okay=False),
              help="Save the artifact NAME as FILE (a new file; an existing one is kept).")
@json_flag
def artifacts(run_id: str, op_id: str | None = None, name: str | None = None,
              output: str | None = None, json_out: bool = False) -> None:
    """The artifacts a run's agents published (of operation OP only), with size and
    SHA-256; with OP and NAME, that artifact's content on standard output (a file or a
    pipe, never a terminal) or in --output FILE (with --json: base64 in the reply).

    Example: cairn artifacts @last root-1 report.md -o report.md
    """
    from cairn.protocol.daemon import ArtifactsRequest
    from cairn.protocol.replies import ArtifactContent, ArtifactsReply

    if name is None and output is not None:
        fail("--output saves one artifact: name it with OP and NAME",
             hint=f"cairn artifacts {run_id} OP NAME -o {output}", code=2)
    if name is not None:
        content = ArtifactsRequest(run_id=run_id, op_id=op_id, name=name)
        if json_out:
            emit(request(content))
            return
        if output is None and stdout_is_terminal():
            fail("an artifact's bytes are the agent's and are not shown on a terminal",
                 hint=f"save it: cairn artifacts {run_id} {op_id} {name} -o FILE "
                 "(or redirect standard output)", code=2)
        _save(typed(ArtifactContent, request(content)), output)
        return
    listed = request(ArtifactsRequest(run_id=run_id, op_id=op_id))
    if json_out:
        emit(listed)
        return
    _print_list(typed(ArtifactsReply, listed))


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _save(data: ArtifactContent, output: str | None) -> None:
    content = base64.b64decode(data.content_base64, validate=True)
    if hashlib.sha256(content).hexdigest() != data.sha256:
        fail(f"artifact {data.name} arrived damaged (its SHA-256 differs)",
             hint="try again; see 'journalctl -u cairn.service'")
    if output is None:
        sys.stdout.buffer.write(content)
        sys.stdout.buffer.flush()
        return
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        fail(f"{output} exists; nothing was written", hint="remove it or name another file",
             code=2)
    except OSError as exc:
        fail(f"cannot create {output}: {exc.strerror}")
    with os.fdopen(fd, "wb") as out:
        out.write(content)
    click.echo(f"saved {printable(data.name)} of {printable(data.op_id)} as "
               f"{printable(output)} ({human_size(data.size)}, sha256 {data.sha256[:12]}…)",
               err=True)


def summary(run_id: str, op_id: str, recorded: Mapping[str, object]) -> str:
    """``artifacts report.md, notes/a.txt (2 files, 1.2 KiB); 1 left behind``: one line of
    ``cairn show``, the first names only."""
    files = [object_or_empty(a) for a in list_or_empty(recorded.get("files"))]
    names = ", ".join(printable(a["name"]) for a in files[:SHOWN])
    more = f" and {len(files) - SHOWN} more" if len(files) > SHOWN else ""
    size = human_size(sum(n for a in files if isinstance(n := a["size"], int)))
    text = (f"artifacts {names}{more} ({len(files)} file{'s' if len(files) != 1 else ''}, "
            f"{size})" if files else "no artifacts")
    if recorded.get("refused_total"):
        text += (f"; {recorded['refused_total']} left behind, see "
                 f"'cairn artifacts {run_id} {printable(op_id)}'")
    return text


def _print_list(listed: ArtifactsReply) -> None:
    rows = [["OP", "NAME", "SIZE", "SHA256"]]
    left: list[str] = []
    for op in listed.operations:
        rows += [[op.op_id, a.name, human_size(a.size), a.sha256[:12]] for a in op.files]
        left += [f"{printable(op.op_id)}: {printable(r.name)}: {printable(r.reason)}"
                 for r in op.refused]
        more = op.refused_total - len(op.refused)
        if more > 0:
            left.append(f"{printable(op.op_id)}: and {more} more")
    if len(rows) == 1 and not left:
        click.echo(f"no artifacts in {listed.run_id}: an agent publishes one by writing it "
                   "below /outputs/artifacts/")
        return
    if len(rows) > 1:
        for line in columns(rows):
            click.echo(line)
    if left:
        click.echo("left behind (not collected):")
        for line in left:
            click.echo(f"  {line}")
