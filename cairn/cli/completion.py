"""Shell completion: what the shipped bash, zsh and fish scripts ask ``cairn`` for.

The scripts (``cairn/cli/shells/``: the packages install them, ``cairn completion SHELL``
prints them) run the hidden command
``cairn __complete -- WORD… CURRENT`` with the words of the command line before the cursor
and the word being completed. It answers one candidate a line, ``VALUE<TAB>DESCRIPTION``,
or ``:file`` when the shell should complete a file name itself. Commands and options come
from the CLI's own definition (click's completion over the command tree), so they never
drift from it; run IDs and schedule IDs come from cairnd (what the caller may see),
definitions from the installed builtins. Nothing here reaches further than the local daemon socket.
After ``-H HOST`` the command runs on HOST, whose runs, schedules and files this side
cannot see without SSH (which may ask for a password at a keystroke), so of those only
``@last`` is offered; commands, options and builtins complete as here.
"""


from collections.abc import Iterable, Mapping
from contextvars import ContextVar

import click
from click.shell_completion import CompletionItem, ShellComplete

from cairn.cli.client import list_or_empty, object_or_empty, request, typed
from cairn.cli.remote import host_words
from cairn.definitions.builtin import builtin_names
from cairn.errors import CairnError
from cairn.protocol.requestchecks import LAST_RUN

# Run IDs are offered by a unique prefix of at least this many hex digits (git's habit).
SHORT_ID = 8
# A completion waits at most this long for cairnd: a slow daemon must not hang a shell.
DAEMON_TIMEOUT = 2.0
FILE = ":file"
# Set while completing a command that runs on another host (``cairn -H HOST …``).
_ELSEWHERE: ContextVar[bool] = ContextVar("completing_for_another_host", default=False)
# The description that marks "and file names too" in a parameter's own completion.
FILES_TOO = "\x1efiles"


def short_ids(run_ids: Iterable[str]) -> dict[str, str]:
    """Each run ID's shortest unique prefix among ``run_ids`` (at least :data:`SHORT_ID`
    hex digits, without ``flow_``)."""
    hexes = sorted({run_id.removeprefix("flow_") for run_id in run_ids})

    def common(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    short: dict[str, str] = {}
    for i, hex_digits in enumerate(hexes):
        shared = max(
            common(hex_digits, hexes[i - 1]) if i > 0 else 0,
            common(hex_digits, hexes[i + 1]) if i + 1 < len(hexes) else 0,
        )
        short["flow_" + hex_digits] = hex_digits[: max(SHORT_ID, shared + 1)]
    return short


def run_candidates(incomplete: str) -> list[tuple[str, str]]:
    """Runs to offer for a RUN being typed: ``@last``, then the caller's runs by short ID
    (by full ID once ``flow_`` is typed), newest first, each with state and definition."""
    offered: list[tuple[str, str]] = []
    if LAST_RUN.startswith(incomplete):
        offered.append((LAST_RUN, "your newest run"))
    if incomplete.startswith("@") or _ELSEWHERE.get():
        return offered
    from cairn.protocol.daemon import PsRequest  # a command's name completes without it

    try:
        sent = request(PsRequest(all_users=True), timeout=DAEMON_TIMEOUT)
    except (CairnError, OSError):
        return offered
    runs = [object_or_empty(r) for r in list_or_empty(sent)]
    short = short_ids(str(r["run_id"]) for r in runs)
    full = incomplete.startswith("flow_")
    for run in sorted(runs, key=_created_at, reverse=True):
        run_id = str(run["run_id"])
        value = run_id if full else short[run_id]
        if value.startswith(incomplete):
            offered.append((value, f"{run['state']} {run['definition']}"))
    return offered


def _created_at(run: Mapping[str, object]) -> float:
    at = run["created_at"]
    return at if isinstance(at, (int, float)) else 0.0


def schedule_candidates(incomplete: str) -> list[tuple[str, str]]:
    """The caller's schedules (from cairnd), each with its name and status."""
    if _ELSEWHERE.get():
        return []
    # a command's name completes without these
    from cairn.protocol.daemon import ScheduleListRequest
    from cairn.protocol.replies import ScheduleListReply

    try:
        sent = request(ScheduleListRequest(), timeout=DAEMON_TIMEOUT)
        schedules = typed(ScheduleListReply, {"schedules": sent}).schedules
    except (CairnError, OSError):
        return []
    return [
        (s.schedule_id, f"{s.name} {s.status}")
        for s in schedules
        if s.schedule_id.startswith(incomplete)
    ]


def definition_candidates(incomplete: str) -> list[tuple[str, str]]:
    """``builtin:NAME`` of the installed workflows, and workflow files (FILE.py)."""
    offered = [(f"builtin:{name}", "builtin workflow") for name in builtin_names()]
    return [*offered, (incomplete, FILES_TOO)]


def lines(items: Iterable[CompletionItem]) -> list[str]:
    """The answer to the scripts: ``VALUE<TAB>DESCRIPTION`` or :data:`FILE`, once each."""
    out: list[str] = []
    for item in items:
        if item.type in ("file", "dir") or item.help == FILES_TOO:
            line = FILE
        else:
            line = f"{item.value}\t{' '.join((item.help or '').split())}"
        if line not in out:
            out.append(line)
    return out


def complete(root: click.Command, words: list[str]) -> list[str]:
    """The candidates for the last of ``words`` (the command line up to the cursor, the
    program's name first)."""
    args, incomplete = words[1:-1], words[-1] if len(words) > 1 else ""
    skipped = host_words(args)
    if skipped > len(args):
        return []  # the host itself is being typed: the shell's own host completion
    shell = ShellComplete(root, {}, "cairn", "_CAIRN_COMPLETE")
    elsewhere = _ELSEWHERE.set(skipped > 0)
    try:
        found = lines(shell.get_completions(args[skipped:], incomplete))
    finally:
        _ELSEWHERE.reset(elsewhere)
    # the paths of a command run on another host are that host's: none offered from here
    return [line for line in found if line != FILE] if skipped else found



@click.argument("words", nargs=-1)
@click.pass_context
def complete_command(ctx: click.Context, words: tuple[str, ...] = ()) -> None:
    """Completion candidates for the shell scripts (``cairn __complete -- WORD…``)."""
    for line in complete(ctx.find_root().command, list(words) or ["cairn"]):
        click.echo(line)


# Each shell's script in cairn/cli/shells/.
SCRIPTS = {"bash": "cairn.bash", "zsh": "_cairn", "fish": "cairn.fish"}


@click.argument("shell", metavar="SHELL")
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish): the one the packages
    install, for an install from PyPI or a checkout. Save it where the shell looks:

    cairn completion bash > ~/.local/share/bash-completion/completions/cairn

    cairn completion zsh > ~/.zfunc/_cairn  (a directory on $fpath, before compinit)

    cairn completion fish > ~/.config/fish/completions/cairn.fish

    Example: cairn completion fish
    """
    from importlib.resources import files  # only this command reads package data

    name = SCRIPTS.get(shell)
    if name is None:
        raise click.BadParameter(f"{shell!r} is not one of {', '.join(SCRIPTS)}",
                                 param_hint="SHELL")
    click.echo(files("cairn.cli").joinpath("shells", name).read_text(encoding="utf-8"),
               nl=False)


def register(app: click.Group) -> None:
    """Add ``completion`` and the hidden ``__complete`` command to ``app`` (the main
    ``cairn`` app)."""
    app.command("completion")(completion)
    app.command(
        "__complete",
        hidden=True,
        context_settings={"ignore_unknown_options": True, "help_option_names": []},
    )(complete_command)
