"""``cairn logs``: the journal of every unit of a run, as journalctl prints it, once or
followed (``-f``). cairnd reads the journal (:mod:`cairn.runlogs`), so what a person sees
is selected by fields journald and PID 1 set, never by what a process wrote. On a
terminal the default format is drawn here, coloured by priority
(:mod:`cairn.cli.journalview`); ``--json`` is journalctl's ``-o json``."""


import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from cairn.cli.client import request, typed
from cairn.cli.options import (
    Decorator,
    json_flag,
    no_pager_flag,
    paged,
    run_argument,
    value_check,
)
from cairn.protocol.names import is_op_id
from cairn.protocol.requestchecks import (
    LOG_OUTPUTS,
    MAX_LOG_LINES,
    log_grep_problem,
    log_priority_problem,
    log_since_problem,
    log_until_problem,
)
from cairn.terminal import printable_lines

if TYPE_CHECKING:
    from cairn.protocol.daemon import LogsRequest
    from cairn.protocol.view_replies import LogsReply

# journalctl's format unless -o names another; on a terminal cairn prints it itself, in
# colour (cairn.cli.journalview).
DEFAULT_OUTPUT = "short-iso"
# Entries shown without -n: everything would be unbounded for a long run.
DEFAULT_LINES = 2000
# Entries shown before following, as journalctl -f does.
FOLLOW_LINES = 10
FOLLOW_INTERVAL = 0.5


def _checked_option(
    *decls: str, metavar: str, help: str, problem: Callable[[str], str | None]
) -> Decorator:
    """An option whose value ``problem`` checks (one line, or None when fine)."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        trouble = None if value is None else problem(value)
        if trouble is not None:
            raise click.BadParameter(trouble)
        return value

    return click.option(*decls, metavar=metavar, help=help, callback=check)


def _op_problem(value: str) -> str | None:
    if is_op_id(value):
        return None
    return f"{value[:40]!r} is not an operation ID (cairn show RUN lists them, e.g. root-1)"


def _check_output(value: str) -> str:
    if value not in LOG_OUTPUTS:
        raise click.BadParameter(f"{value!r} is not one of {', '.join(LOG_OUTPUTS)}")
    return value


@run_argument
@click.option(
    "--follow",
    "-f",
    help="Keep printing new entries; ends when the run has ended (exit 0) or "
        "on Ctrl-C (exit 130).",
    is_flag=True,
)
@_checked_option(
    "--since",
    metavar="WHEN",
    help="Entries from this time on, as journalctl reads it: '1 hour ago', "
        "today, '2026-01-02 10:00'.",
    problem=log_since_problem,
)
@_checked_option(
    "--until",
    metavar="WHEN",
    help="Entries up to this time, as journalctl reads it.",
    problem=log_until_problem,
)
@_checked_option(
    "--grep",
    "-g",
    metavar="PATTERN",
    help="Only entries whose message matches PATTERN (journalctl's PCRE2; "
        "case-insensitive when all lower case).",
    problem=log_grep_problem,
)
@_checked_option(
    "--op",
    "op_id",
    metavar="OP",
    help="Only the agent units of operation OP (as cairn show names it), every "
        "attempt.",
    problem=_op_problem,
)
@click.option(
    "--reverse",
    "-r",
    help="Newest entries first (not with -f).",
    is_flag=True,
)
@no_pager_flag
@_checked_option(
    "--priority",
    "-p",
    metavar="PRIO",
    help="Only this level and more severe (err, warning, … or 0-7), or a range "
        "such as err..warning.",
    problem=log_priority_problem,
)
@click.option(
    "--output",
    "-o",
    metavar="FORMAT",
    help=f"journalctl's format: {', '.join(LOG_OUTPUTS)}.",
    callback=value_check(_check_output),
    default=DEFAULT_OUTPUT,
)
@click.option(
    "--lines",
    "-n",
    type=click.IntRange(0, MAX_LOG_LINES),
    metavar="N",
    help=f"The last N entries (default {DEFAULT_LINES}; {FOLLOW_LINES} with -f "
        "and no --since).",
    show_default=False,
)
@json_flag
def logs(
    run_id: str,
    follow: bool = False,
    since: str | None = None,
    until: str | None = None,
    grep: str | None = None,
    op_id: str | None = None,
    reverse: bool = False,
    no_pager: bool = False,
    priority: str | None = None,
    output: str = DEFAULT_OUTPUT,
    lines: int | None = None,
    json_out: bool = False,
) -> None:
    """The systemd journal of every unit of a run (matched by unit, never by a field
    a process could set).

    Example: cairn logs @last --op root-1 -g 'error|warning' --since '1 hour ago'
    """
    from cairn.protocol.daemon import LogsRequest

    if reverse and follow:
        raise click.BadParameter("-r shows the newest first; -f follows what comes after "
                                 "them: give one", param_hint="--reverse")
    if json_out and output != DEFAULT_OUTPUT:
        raise click.BadParameter(f"--json is -o json; -o {output} asks for another format: "
                                 "give one", param_hint="--json")
    colour = output == DEFAULT_OUTPUT and not json_out and colour_wanted()
    show = _shown_in_colour if colour else printable_lines
    first = LogsRequest.model_validate(
        {
            "run_id": run_id,
            "since": since,
            "until": until,
            "priority": priority,
            "grep": grep,
            "op_id": op_id,
            "reverse": reverse,
            "output": "json" if json_out or colour else output,
            "lines": lines if lines is not None else default_lines(follow, since),
        }
    )
    if not follow:
        with paged(no_pager):
            # color: click would strip the colours for the pager, which is no terminal
            click.echo(show(_asked(request, first).text), nl=False, color=colour)
        return
    try:
        follow_logs(first, ask=request,
                    show=lambda text: click.echo(show(text), nl=False, color=colour))
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None


def colour_wanted() -> bool:
    """Colours on a terminal that shows them, unless ``NO_COLOR`` asks for none."""
    return (
        sys.stdout.isatty() and "NO_COLOR" not in os.environ
        and os.environ.get("TERM", "dumb") != "dumb"
    )


def _shown_in_colour(text: str) -> str:
    from cairn.cli.journalview import render

    return render(text, colour=True)


def default_lines(follow: bool, since: str | None) -> int:
    """Entries shown without -n: the last :data:`DEFAULT_LINES`; following, the last
    :data:`FOLLOW_LINES` as journalctl -f does, unless --since asks for more."""
    return FOLLOW_LINES if follow and since is None else DEFAULT_LINES


def follow_logs(
    first: "LogsRequest",
    *,
    ask: Callable[["LogsRequest"], object],
    show: Callable[[str], None],
    pause: Callable[[float], None] = time.sleep,
    interval: float = FOLLOW_INTERVAL,
) -> None:
    """Print ``first``'s entries, then every entry after the last one printed, until the
    run has ended and a further ``interval`` brought nothing (its units' last lines, such
    as PID 1's "Deactivated successfully", come after the run's state changed).

    Asks again at once while entries keep coming, else after ``interval``."""
    from cairn.protocol.daemon import LogsRequest

    query = first
    quiet_since_end = 0
    while True:
        reply = _asked(ask, query)
        show(reply.text)
        cursor = reply.cursor or query.after_cursor
        advanced = cursor is not None and cursor != query.after_cursor
        if cursor is not None:
            query = LogsRequest(
                run_id=reply.run_id,
                until=query.until,
                priority=query.priority,
                grep=query.grep,
                op_id=query.op_id,
                output=query.output,
                after_cursor=cursor,
            )
        else:
            # Nothing matched yet: from now on every entry is new, so ask for all of them.
            query = query.model_copy(update={"run_id": reply.run_id, "lines": None})
        if advanced:
            quiet_since_end = 0
            continue
        if reply.finished:
            quiet_since_end += 1
            if quiet_since_end > 1:
                return
        pause(interval)


def _asked(ask: Callable[["LogsRequest"], object], query: "LogsRequest") -> "LogsReply":
    """cairnd's reply to ``query``, read as :class:`LogsReply`."""
    from cairn.protocol.view_replies import LogsReply

    return typed(LogsReply, ask(query))
