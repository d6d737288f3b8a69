"""The CLI's one client of cairnd, and how every command reports: :func:`request` sends
one request over the daemon socket, :func:`emit` prints JSON, :func:`fail` prints an error
and exits.

The protocol's models (pydantic) are imported by the commands that send a request, when
they run, never at a ``cairn`` start: ``cairn --help``, ``--version`` and the shell's
completion of a command name build no model and do not load pydantic. ``cairn launch``
sends its request as plain JSON and reads the reply without a model, and this module
imports no click, so a launch loads none of them
(:mod:`cairn.cli.launching`)."""

from __future__ import annotations

# The C module beneath socket: socket.py builds four enums and loads selectors, 1.5 ms of
# every launch, and its wrapper class adds nothing this one request uses.
import _socket
import sys

from cairn import leanjson, paths
from cairn.cli.attest import Expected, exchange
from cairn.errors import CairnError, Unavailable
from cairn.terminal import printable

TYPE_CHECKING = False  # typing is for type checkers only: every launch imports this module
if TYPE_CHECKING:
    from typing import NoReturn, TypeVar

    from cairn.protocol.daemon import OpRequest
    from cairn.protocol.jsonvalue import JSONObject, JSONValue
    from cairn.protocol.replies import Reply

    ReplyT = TypeVar("ReplyT", bound=Reply)


def fail(message: str, hint: str | None = None, code: int = 1) -> NoReturn:
    """Print ``cairn: MESSAGE`` and ``hint: HINT`` on stderr, each one line with every
    control character escaped (they may quote a name an agent chose), and exit."""
    print(f"cairn: {printable(message)}", file=sys.stderr, flush=True)
    if hint:
        print(f"hint: {printable(hint)}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def request(
    body: OpRequest | dict[str, object],
    *,
    fd: int | None = None,
    timeout: float | None = None,
    expect: Expected | None = None,
) -> JSONValue:
    """Send one request to cairnd and return its result (errors become CairnError).
    ``fd``: a directory passed along (the project). ``expect``: the request may start a
    run, which this process attests if its description is what was asked for
    (:mod:`cairn.cli.attest`). ``timeout`` bounds each socket operation (an OSError when it
    runs out). A plain dict is sent as it is (cairnd validates every request)."""
    if isinstance(body, dict):
        message = leanjson.dumps(body).encode() + b"\n"
    else:
        from cairn.protocol.daemon import request_line

        message = request_line(body)
    path = paths.daemon_address()
    mine, theirs = _socket.socketpair() if expect is not None else (None, None)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
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
            # as array("i", passed).tobytes() would, without array (which loads collections)
            fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in passed)
            sock.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
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
    finally:
        sock.close()
    return reply_result(raw)


def reply_result(raw: bytes) -> JSONValue:
    """The result of cairnd's reply ``raw`` (:class:`cairn.protocol.daemon.DaemonReply`),
    read as JSON; an error reply is raised as the CairnError it names, and a reply that is
    not one is a CairnError saying so."""
    if not raw:
        raise CairnError(
            "cairnd closed the connection without an answer",
            hint="see 'journalctl -u cairn.service'",
        )
    try:
        reply = leanjson.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's
        reply = None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise _unreadable()
    if reply["ok"]:
        return reply.get("result")
    body = reply.get("error")
    if not isinstance(body, dict):
        raise _unreadable()
    code, message, hint = body.get("code"), body.get("message"), body.get("hint")
    if not (isinstance(code, str) and isinstance(message, str)):
        raise _unreadable()
    error = CairnError(message, hint=hint if isinstance(hint, str) else None)
    error.code = code
    raise error


def typed(model: type[ReplyT], result: object) -> ReplyT:
    """``result`` (what :func:`request` returned) as the reply model ``model``; a reply
    that does not fit is a CairnError saying so, never a traceback."""
    from pydantic import ValidationError

    try:
        return model.model_validate(result)
    except ValidationError:
        raise _unreadable() from None


def object_or_empty(value: object) -> JSONObject:
    """``value``, a JSON object of a reply, read as one; anything else as an empty one."""
    return value if isinstance(value, dict) else {}


def list_or_empty(value: object) -> list[JSONValue]:
    """``value``, a JSON array of a reply, read as one; anything else as an empty one."""
    return value if isinstance(value, list) else []


def _unreadable() -> CairnError:
    return CairnError(
        "cairnd sent a reply this CLI cannot read",
        hint="is the cairn package the same version as cairnd? see 'cairn doctor'",
    )


def emit(data: object) -> None:
    import json  # only for --json: a launch loads leanjson, not json

    print(json.dumps(data, indent=2, sort_keys=True), flush=True)
