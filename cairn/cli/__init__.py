"""The ``cairn`` command: :func:`main`. It talks only to cairnd (:mod:`cairn.cli.client`);
it never touches the journal or storage (except ``storage init``, which is local by
nature). ``workflow`` and ``project`` keep the person's own definitions in their config,
locally.

The commands are click's (:mod:`cairn.cli.commands`), except that a launch whose command
line :func:`cairn.cli.launching.read_argv` reads as click would runs without loading
click or pydantic: many launches at once then cost little more than as many
interpreters.
"""

from __future__ import annotations

import os
import sys

from cairn.errors import CairnError
from cairn.terminal import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["Interrupted", "main"]


class Interrupted(BaseException):
    """Ctrl-C under click, raised past it (click would turn a KeyboardInterrupt into
    "Aborted!" and status 1)."""


def _on_sigint(signum: int, frame: object) -> None:
    raise Interrupted


def main() -> None:
    """Exit status: 0 success, 2 usage (or a refused request), 1 other error, 130 Ctrl-C.
    Every error is one line (``cairn: …``) with a ``hint:`` line, usage errors too."""
    try:
        status = _dispatch(sys.argv[1:])
    except (Interrupted, KeyboardInterrupt):
        sys.exit(130)
    except CairnError as exc:
        # cairnd's errors quote runs, paths and answers: names an agent may have chosen
        print(f"cairn: {printable(exc.message)}", file=sys.stderr, flush=True)
        if exc.hint:
            print(f"hint: {printable(exc.hint)}", file=sys.stderr, flush=True)
        sys.exit(2 if exc.code in ("usage", "invalid", "review", "not-found") else 1)
    sys.exit(status)


def _dispatch(argv: list[str]) -> int:
    from cairn.cli import launching, remote

    host, argv = remote.split_host(argv)
    if host is not None:
        remote.run_remote(host, argv, os.environ)
    keywords = launching.read_argv(argv, os.environ)
    if keywords is not None:
        launching.launch(**keywords)
        _exit_at_once()
    return _with_click(argv)


def _exit_at_once() -> NoReturn:
    """Exit 0 with what was printed flushed and without the interpreter's teardown: a
    launch has nothing left to clean up, and the teardown would cost every launch 3 ms of
    CPU (a tenth of it) when many start at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _with_click(argv: list[str]) -> int:
    """Run the command tree on ``argv``; click's own errors become ``cairn:`` lines."""
    # Not at the start: the signal module loads enum, which a launch does without.
    import signal

    signal.signal(signal.SIGINT, _on_sigint)
    import click

    from cairn.cli.commands import app

    try:
        status = app.main(argv, prog_name="cairn", standalone_mode=False)
    except click.UsageError as exc:
        print(f"cairn: {printable(exc.format_message())}", file=sys.stderr, flush=True)
        if any(arg in ("-H", "--host") or arg.startswith("--host=") for arg in argv):
            print("hint: -H comes first: cairn -H [USER@]HOST COMMAND…", file=sys.stderr,
                  flush=True)
        elif exc.ctx is not None:
            print(f"hint: see '{exc.ctx.command_path} --help'", file=sys.stderr, flush=True)
        return exc.exit_code
    except click.ClickException as exc:
        print(f"cairn: {printable(exc.format_message())}", file=sys.stderr, flush=True)
        return exc.exit_code
    except click.Abort:
        return 1
    return status if isinstance(status, int) else 0
