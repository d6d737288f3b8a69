"""``cairn project``: the person's trust decisions about projects' own definitions
(``PROJECT/.cairn/workflows/``). Local, like ``cairn workflow``: cairnd never reads them."""


from pathlib import Path

import click

from cairn.cli.client import emit
from cairn.cli.options import CairnGroup, argument, json_flag
from cairn.terminal import printable, printable_lines

project_app = CairnGroup("project", help="Trust a project's own definitions.", no_args_is_help=True)


@project_app.command("trust")
@argument("path", type=click.Path(path_type=Path), help="The project directory.")
@click.option("--confirm", help="The trust hash you confirmed (printed without --confirm).")
@json_flag
def project_trust(
    path: Path,
    confirm: str | None = None,
    json_out: bool = False,
) -> None:
    """Without --confirm: review every definition in PATH/.cairn/workflows/ and print the
    trust hash. With it: trust them as they are now (a definition that changes later is
    refused until you confirm again).

    Example: cairn project trust ~/src/demo --confirm sha256:...
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import trust
    from cairn.protocol.definitions import trust_hash
    from cairn.workflow.review import render_review

    root = trust.project_root(path)
    if confirm is not None:
        record = trust.trust(root, confirm)
        if json_out:
            emit({"project": root, "trusted": True, "trust_hash": record.trust_hash,
                  "definitions": {f"project:{n}": h for n, h in record.definitions.items()}})
            return
        names = ", ".join(f"project:{n}" for n in record.definitions)
        click.echo(printable(f"trusted {root}: {names}"))
        return
    with trust.open_project(root) as fd:
        reviews = trust.review_project(fd, root)
    hashes = {n: r.review_hash for n, r in reviews.items()}
    if json_out:  # printing decides nothing: "trusted" is false until --confirm
        emit({"project": root, "trusted": False, "trust_hash": trust_hash(root, hashes),
              "definitions": {f"project:{n}": h for n, h in hashes.items()}})
        return
    for name, review in reviews.items():
        click.echo(printable(f"== project:{name}"))
        click.echo(printable_lines(render_review(review)))
        click.echo("")
    expected = trust_hash(root, hashes)
    click.echo(f"trust_hash: {expected}")
    click.echo(printable(f"to trust them: cairn project trust {root} --confirm {expected}"))


@project_app.command("untrust")
@argument("path", type=click.Path(path_type=Path))
def project_untrust(path: Path) -> None:
    """Forget the trust decision for PATH: its project: definitions cannot be launched.

    Example: cairn project untrust ~/src/demo
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions import trust

    root = trust.project_root(path)
    trust.untrust(root)
    click.echo(printable(f"untrusted {root}"))
