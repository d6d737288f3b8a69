"""``cairn config``: the host's configuration. ``check`` is local: it reads every file of
``/etc/cairn`` with the loaders cairnd uses (:mod:`cairn.hostconfig`), as the caller."""


import click

from cairn import paths
from cairn.cli.client import emit
from cairn.cli.options import CairnGroup, json_flag

config_app = CairnGroup("config", help="Host configuration.", no_args_is_help=True)


@config_app.command("check")
@json_flag
def config_check(json_out: bool = False) -> None:
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
        click.echo(f"{paths.config_dir()}: no problems")
    else:
        for problem in problems:
            click.echo(str(problem))
            if problem.fix:
                click.echo(f"  fix: {problem.fix}")
        files = len({p.file for p in problems})
        click.echo(f"{len(problems)} error{'s' if len(problems) != 1 else ''} in {files} "
                   f"config file{'s' if files != 1 else ''}")
    if problems:
        raise click.exceptions.Exit(1)
