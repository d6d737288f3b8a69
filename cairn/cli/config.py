"""``cairn config``: the host's configuration. ``check`` is local: it reads every file of
``/etc/cairn`` with the loaders cairnd uses (:mod:`cairn.hostconfig`), as the caller."""


import typer

from cairn import paths
from cairn.cli.client import emit
from cairn.cli.options import CairnGroup, JsonFlag

config_app = typer.Typer(cls=CairnGroup, help="Host configuration.", no_args_is_help=True)


@config_app.command("check")
def config_check(json_out: JsonFlag = False) -> None:
    """Check every file in /etc/cairn; report every problem with its file, line or field
    and the fix; exit 1 if there is one.

    Example: cairn config check
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.hostconfig import check_host_config

    problems = check_host_config()
    if json_out:
        emit([
            {"file": str(p.file), "where": p.where, "message": p.message, "fix": p.fix}
            for p in problems
        ])
    elif not problems:
        typer.echo(f"{paths.config_dir()}: no problems")
    else:
        for problem in problems:
            typer.echo(str(problem))
            if problem.fix:
                typer.echo(f"  fix: {problem.fix}")
        files = len({p.file for p in problems})
        typer.echo(f"{len(problems)} error{'s' if len(problems) != 1 else ''} in {files} "
                   f"config file{'s' if files != 1 else ''}")
    if problems:
        raise typer.Exit(1)
