"""Option types and option parsers shared by several commands."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import io
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, Protocol, TypeVar

import click
from click.shell_completion import CompletionItem

from cairn.cli.client import emit
from cairn.cli.completion import definition_candidates, run_candidates
from cairn.errors import UsageError
from cairn.protocol.requestchecks import RUN_REF_HELP, run_ref_problem
from cairn.terminal import printable

CallbackT = TypeVar("CallbackT", bound=Callable[..., object])
ValueT = TypeVar("ValueT")
CheckedT = TypeVar("CheckedT")


class Decorator(Protocol):
    """What ``click.argument`` and ``click.option`` return: the command's function back,
    with the parameter attached."""

    def __call__(self, function: CallbackT, /) -> CallbackT: ...


def check_run_ref(ref: str | None) -> str | None:
    """A RUN argument as typed, refused at once when it cannot name a run (cairnd checks
    it again and resolves a prefix or ``@last`` among the runs the caller may see)."""
    problem = None if ref is None else run_ref_problem(ref)
    if problem is not None:
        raise click.BadParameter(problem)
    return ref


def value_check(
    check: Callable[[ValueT], CheckedT],
) -> Callable[[click.Context, click.Parameter, ValueT], CheckedT]:
    """``check`` (the value in, the value out or :class:`click.BadParameter`) as the
    callback click calls with its context and the parameter."""
    return lambda ctx, param, value: check(value)


def completes(
    candidates: Callable[[str], list[tuple[str, str]]],
) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    """``candidates`` (the word being typed in, ``(value, description)`` pairs out) as a
    parameter's shell completion."""

    def complete(
        ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        return [CompletionItem(value, help=about) for value, about in candidates(incomplete)]

    return complete


class DescribedArgument(click.Argument):
    """A positional argument with a line of help, which :class:`CairnCommand` lists."""

    def __init__(self, param_decls: list[str], help: str | None = None, **kwargs: Any) -> None:
        super().__init__(param_decls, **kwargs)
        self.help = help


class CairnCommand(click.Command):
    """A ``cairn`` command: its help lists the arguments, with their help, before the
    options, and prints its examples (paragraphs that start ``Example:`` or ``cairn ``) as
    written, never rewrapped, so that each stays a line one can copy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = "\n\n".join(
                f"\b\n{paragraph}" if paragraph.startswith(("Example:", "cairn ")) else paragraph
                for paragraph in inspect.cleandoc(self.help).split("\n\n")
            )

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (param.metavar or (param.name or "").upper(), param.help or "")
            for param in self.get_params(ctx)
            if isinstance(param, DescribedArgument) and param.help
        ]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)


class CairnGroup(click.Group):
    """The ``cairn`` command group and its sub-groups: their commands are
    :class:`CairnCommand`, listed in the order added; a mistyped command is answered with
    the closest one."""

    command_class = CairnCommand

    def list_commands(self, ctx: click.Context) -> list[str]:
        """In the order they were added, as help lists them (click would sort them)."""
        return list(self.commands)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # A group named alone prints its help and exits 0 on every click (8.2 made it a
        # usage error, exit 2, with the help on stderr).
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        return super().parse_args(ctx, args)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError:
            typed = args[0] if args else ""
            close = closest_command(self, ctx, typed)
            if close is None:
                raise
            raise click.UsageError(
                f"No such command {typed!r}. Did you mean {close!r}?", ctx
            ) from None


def closest_command(group: click.Group, ctx: click.Context, typed: str) -> str | None:
    """The visible command of ``group`` closest to ``typed``, if one is close enough."""
    import difflib  # only a mistyped command pays for it

    names = [
        name
        for name in group.list_commands(ctx)
        if (command := group.get_command(ctx, name)) is not None and not command.hidden
    ]
    close = difflib.get_close_matches(typed, names, n=1, cutoff=0.6)
    return close[0] if close else None


def argument(name: str, **attrs: object) -> Decorator:
    """A positional argument, with ``help=`` (click's own arguments take none)."""
    return click.argument(name, cls=DescribedArgument, **attrs)


json_flag = click.option("--json", "json_out", is_flag=True, help="Print machine-readable JSON.")
yes_flag = click.option(
    "--yes", "-y", is_flag=True,
    help="Do it without asking (needed where there is no terminal to ask).",
)
run_argument = argument(
    "run_id",
    metavar="RUN",
    help=RUN_REF_HELP,
    callback=value_check(check_run_ref),
    shell_complete=completes(run_candidates),
)
definition_argument = argument(
    "definition",
    help="e.g. builtin:implement, or a reviewed FILE.py",
    shell_complete=completes(definition_candidates),
)
# A launch's and a schedule's own workflow options.
args_option = click.option(
    "--args", default="{}", help="Workflow arguments as a JSON object."
)
scripted_option = click.option(
    "--scripted", multiple=True, help="PROFILE=FILE.json: run that profile as a scripted agent."
)
dry_run_flag = click.option(
    "--dry-run", is_flag=True, help="Only print what it would do; change nothing."
)
no_pager_flag = click.option(
    "--no-pager", is_flag=True,
    help="Print straight to the terminal, without a pager.",
)


# What a pager needs of the caller's environment (everything else stays out).
PAGER_ENV = ("TERM", "LESS", "LESSCHARSET", "HOME", "COLUMNS", "LINES")
DEFAULT_PAGER = "less -FRX"


@contextlib.contextmanager
def paged(no_pager: bool) -> Iterator[None]:
    """Send what the block prints through a pager when standard output is a terminal
    and it is longer than the screen: ``$PAGER`` (split as a shell would, run without
    one), else ``less -FRX``. ``no_pager``, a pipe or an empty ``$PAGER`` prints as is.
    Every text is escaped before it is printed, so the pager never gets a raw control."""
    if no_pager or not sys.stdout.isatty():
        yield
        return
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        _page(buffer.getvalue())


def _page(text: str) -> None:
    import shlex
    import shutil

    try:
        command = shlex.split(os.environ.get("PAGER", DEFAULT_PAGER))
    except ValueError:  # unbalanced quotes: no pager to run
        command = []
    if not command or text.count("\n") < shutil.get_terminal_size().lines - 1:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from cairn import proc

    env = {name: os.environ[name] for name in PAGER_ENV if name in os.environ}
    # Ctrl-C is the pager's (less clears its prompt); the command waits for it to quit
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.run(command, input=text.encode(), env=env, check=False, capture=False)
    except OSError:  # no such pager: the text still reaches the terminal
        sys.stdout.write(text)
        sys.stdout.flush()
    finally:
        signal.signal(signal.SIGINT, previous)


def asks(yes: bool) -> bool:
    """Whether a command that cannot be undone asks first: True on a terminal, False with
    ``--yes``. Without either (a script, a timer, a pipe) the command is refused here,
    before it changes anything: a script says ``--yes`` once, where a reader sees it."""
    if yes:
        return False
    if sys.stdin.isatty() and sys.stderr.isatty():
        return True
    ctx = click.get_current_context(silent=True)
    command = ctx.command_path if ctx is not None else "this command"
    raise UsageError(
        f"{command} cannot be undone and there is no terminal to ask; nothing was changed",
        hint="give --yes (-y) to do it without asking",
    )


def confirm_or_stop(question: str, *, yes: bool) -> None:
    """Ask a person at a terminal ``question`` before something that cannot be undone:
    anything but ``y`` or ``yes`` stops the command (exit 1) with nothing changed. With
    ``yes`` it goes on unasked; without a terminal and without ``yes`` it is refused
    (:func:`asks`)."""
    if not asks(yes):
        return
    sys.stderr.write(f"{printable(question)} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        if not answer.endswith("\n"):
            sys.stderr.write("\n")
        echo("cairn: not confirmed; nothing was changed (--yes does it without asking)",
             err=True)
        raise click.exceptions.Exit(1)


def would(action: str) -> NoReturn:
    """End a ``--dry-run``: say what the command would do, change nothing, exit 0."""
    echo(f"would {action}; nothing was changed (--dry-run)")
    raise click.exceptions.Exit(0)


def echo(line: object, *, err: bool = False) -> None:
    """Print one line whose fields may quote what someone else chose (a schedule's name,
    a run's error, a path), with every control character escaped
    (:func:`~cairn.terminal.printable`)."""
    click.echo(printable(line), err=err)


def human_size(size: int | None) -> str:
    """Bytes as people read them (binary multiples); None is ``unknown``."""
    if size is None:
        return "unknown"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def columns(rows: list[list[str]]) -> list[str]:
    """``rows`` (a header first) as aligned lines: every cell escaped
    (:func:`~cairn.terminal.printable`), two spaces between columns, the last unpadded."""
    cells = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        for row in cells
    ]


def emit_or_empty(items: Sequence[object], json_out: bool, *, empty: str) -> bool:
    """With ``--json`` print ``items`` as JSON; without it print ``empty`` when there are
    none. True when that is all a listing command has to print."""
    if json_out:
        emit(items)
        return True
    if not items:
        click.echo(empty)
        return True
    return False


def add_commands(app: click.Group, *commands: Callable[..., None]) -> None:
    """Add ``commands`` to ``app`` as top-level commands, in the order help lists them."""
    for command in commands:
        app.command()(command)


def hidden_alias(
    group: click.Group, command: click.Command, name: str, *, help: str | None = None
) -> None:
    """``command`` also under ``name`` in ``group``: it works the same, and help lists
    only the command's own name."""
    alias = copy.copy(command)
    alias.hidden = True
    if help is not None:
        alias.help = help
    group.add_command(alias, name)


def renamed(group: click.Group, command: click.Command, old: str, new: str) -> None:
    """``command`` under its ``old`` name too, hidden: it works as before and says on
    stderr what it is called now (the old name goes in a later release)."""
    run = command.callback
    assert run is not None

    @functools.wraps(run)
    def say_new_name(*args: object, **kwargs: object) -> object:
        click.echo(
            f"cairn: '{old}' is now '{new}'; the old name goes in a later release", err=True
        )
        return run(*args, **kwargs)

    alias = copy.copy(command)
    alias.callback = say_new_name
    hidden_alias(group, alias, old.rsplit(maxsplit=1)[-1])


def render_waiting(run_id: str, item: Mapping[str, object]) -> str:
    """One line for what a run waits on: a question or an approval request, and the
    command that answers it (``cairn watch`` and ``cairn show``)."""
    if item["kind"] == "question":
        return (
            f"{printable(item['op_id'])} asks: {printable(item['question'])} "
            f"(cairn answer {run_id} --challenge {printable(item['challenge'])} VALUE)"
        )
    if item["request_id"] == "apply":
        return f"the proposal waits to be applied (cairn diff {run_id}; cairn apply {run_id})"
    request_id = printable(item["request_id"])
    return (
        f"{request_id} needs approval "
        f"(cairn approve {run_id} {request_id} --fingerprint {printable(item['fingerprint'])})"
    )
