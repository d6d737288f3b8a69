"""The CLI's one client of cairnd, and how every command reports: :func:`request` sends
one request over the daemon socket, :func:`emit` prints JSON, :func:`fail` prints an error
and exits.

The protocol's models (pydantic) are imported by the commands that send a request, when
they run, never at a ``cairn`` start: ``cairn --help``, ``--version`` and the shell's
completion of a command name build no model and do not load pydantic."""

from __future__ import annotations

import array
import json
import socket
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from cairn import paths
from cairn.cli.attest import Expected, exchange
from cairn.errors import CairnError, Unavailable
from cairn.terminal import printable

if TYPE_CHECKING:
    from cairn.protocol.daemon import OpRequest


def fail(message: str, hint: str | None = None, code: int = 1) -> NoReturn:
    """Print ``cairn: MESSAGE`` and ``hint: HINT`` on stderr, each one line with every
    control character escaped (they may quote a name an agent chose), and exit."""
    typer.echo(f"cairn: {printable(message)}", err=True)
    if hint:
        typer.echo(f"hint: {printable(hint)}", err=True)
    raise typer.Exit(code)


def request(
    body: OpRequest,
    *,
    fd: int | None = None,
    timeout: float | None = None,
    expect: Expected | None = None,
) -> Any:
    """Send one request to cairnd and return its result (errors become CairnError).
    ``fd``: a directory passed along (the project). ``expect``: the request may start a
    run, which this process attests if its description is what was asked for
    (:mod:`cairn.cli.attest`). ``timeout`` bounds each socket operation (an OSError when it
    runs out)."""
    from cairn.protocol.daemon import DaemonReply, request_line

    message = request_line(body)
    path = str(paths.daemon_socket())
    mine, theirs = socket.socketpair() if expect is not None else (None, None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            for end in (mine, theirs):
                if end is not None:
                    end.close()
            raise Unavailable(
                f"cannot reach cairnd at {path}: {exc.strerror}",
                hint="is the cairn package installed and cairn.socket active?",
            ) from exc
        passed = [f for f in (fd, theirs.fileno() if theirs else None) if f is not None]
        if passed:
            fds = array.array("i", passed).tobytes()
            sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        else:
            sock.sendall(message)
        if theirs is not None:
            theirs.close()  # cairnd has its copy
        if mine is not None and expect is not None:
            raw = exchange(sock, mine, expect)
        else:
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
            raw = b"".join(chunks)
    if not raw:
        raise CairnError(
            "cairnd closed the connection without an answer",
            hint="see 'journalctl -u cairn.service'",
        )
    reply = DaemonReply.model_validate_json(raw)
    if not reply.ok:
        assert reply.error is not None
        error = CairnError(reply.error.message, hint=reply.error.hint)
        error.code = reply.error.code
        raise error
    return reply.result


def emit(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))
