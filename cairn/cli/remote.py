"""``cairn -H [USER@]HOST COMMAND…``: the command runs on another host's cairn, over SSH,
the way ``systemctl -H`` reaches another host's systemd. ``cairn`` becomes
``ssh [USER@]HOST cairn COMMAND…``: the remote cairn talks to its own cairnd as the user
SSH logged in as, so the remote host's rules hold unchanged, and its output, prompts,
exit status and Ctrl-C come back as they would there (a terminal on both ends when this
one is a terminal). SSH itself (keys, ``~/.ssh/config``, jump hosts) is the person's own;
cairn adds no daemon and no protocol. Paths in the command (``--project``, FILE.py,
``--file``) name the remote host's files.

Read before anything else on the command line, without click (a local launch loads
nothing of it but this module).
"""

from __future__ import annotations

import sys

from cairn.errors import CairnError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

HOST_FLAGS = ("-H", "--host")
MAX_HOST = 255
SSH = "ssh"
REMOTE_PROGRAM = "cairn"


def host_words(argv: list[str]) -> int:
    """How many leading words of ``argv`` name another host: 2 for ``-H HOST`` and
    ``--host HOST`` (1 when the host is not there yet), 1 for ``-HHOST`` and
    ``--host=HOST``, 0 without one."""
    first = argv[0] if argv else ""
    if first in HOST_FLAGS:
        return 2
    if first.startswith("--host=") or (first.startswith("-H") and first != "-H"):
        return 1
    return 0


def split_host(argv: list[str]) -> tuple[str | None, list[str]]:
    """The host of a leading ``-H HOST``, ``-HHOST``, ``--host HOST`` or ``--host=HOST``,
    and the command line after it; ``(None, argv)`` without one."""
    words = host_words(argv)
    if words == 0:
        return None, argv
    if words > len(argv):
        raise UsageError(f"{argv[0]} needs a host: cairn -H [USER@]HOST COMMAND")
    if words == 2:
        return argv[1], argv[2:]
    first = argv[0]
    return first.removeprefix("--host=") if first.startswith("--host=") else first[2:], argv[1:]


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be handed to ssh as its destination, or None. A destination
    that starts with a dash would be read as an ssh option (``-oProxyCommand=…``)."""
    if not host:
        return "the host is empty: cairn -H [USER@]HOST COMMAND"
    if host.startswith("-"):
        return f"{host[:40]!r} is not a host: it would be an option of ssh"
    if len(host) > MAX_HOST or any(c.isspace() or not c.isprintable() for c in host):
        return f"{host[:40]!r} is not a host: [USER@]HOST, as ssh takes it"
    return None


def ssh_argv(host: str, argv: list[str], *, terminal: bool) -> list[str]:
    """``ssh`` running ``cairn ARGV`` on ``host``: with a terminal there when this side
    has one (prompts, the pager, Ctrl-C), without one otherwise (pipes stay byte-exact).
    ssh hands the remote shell one string, so every word is quoted for it."""
    import shlex  # only a remote command pays for it (it loads re)

    remote = shlex.join([REMOTE_PROGRAM, *argv])
    return [SSH, "-t" if terminal else "-T", "-x", "--", host, remote]


def run_remote(host: str, argv: list[str], environ: Mapping[str, str]) -> None:
    """Become ssh running ``cairn ARGV`` on ``host`` (returns only by raising), in the
    person's own ``environ``: ssh reads its agent (SSH_AUTH_SOCK), askpass, TERM and locale
    from it."""
    problem = host_problem(host)
    if problem is not None:
        raise UsageError(problem, hint="see 'cairn --help'")
    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    from cairn import proc

    try:
        proc.replace_process(ssh_argv(host, argv, terminal=terminal), env=environ)
    except OSError as exc:
        raise CairnError(
            f"cannot run ssh for -H {host}: {exc.strerror}",
            hint="install the OpenSSH client (openssh-client)",
        ) from None
