"""The allowlist proxy: the only way out of an ``allowlist`` agent's network namespace.

It accepts on a socket that lives inside the agent's namespace (:func:`listen_in_netns`)
and connects out from the host's namespace,
only to reviewed destinations. It speaks HTTP ``CONNECT host:port`` (HTTPS and anything
else tunnelled) and absolute-form plain HTTP requests (``GET http://host/...``).

An allowlist entry is ``host`` (ports 80 and 443), ``host:port`` (that port only) or
``*.domain`` (every subdomain of ``domain``, ports 80 and 443). IP literals are admitted
only when listed. Names are resolved here, on the host, never by the agent.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

HEAD_LIMIT = 16 << 10
CHUNK = 65536
CONNECT_TIMEOUT = 15.0
DEFAULT_PORTS = (80, 443)

Resolver = Callable[[str, int], tuple[str, int]]


CLONE_NEWNET = 0x40000000


def listen_in_netns(netns: Path, host: str, port: int) -> socket.socket:
    """A TCP listener created inside ``netns`` (a socket keeps the namespace it was made
    in), usable from this process in its own namespace. Needs CAP_SYS_ADMIN."""
    result: list[socket.socket | BaseException] = []

    def bind_there() -> None:
        # setns() moves only the calling thread, so a throwaway thread does it.
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            with open(netns) as fh:
                if libc.setns(fh.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            result.append(socket.create_server((host, port), backlog=64))
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=bind_there)
    thread.start()
    thread.join()
    (outcome,) = result
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _system_resolve(host: str, port: int) -> tuple[str, int]:
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    address = info[0][4]
    return str(address[0]), int(address[1])


class Allowlist:
    """Reviewed destinations, matched case-insensitively."""

    def __init__(self, entries: list[str]) -> None:
        self.exact: dict[str, tuple[int, ...]] = {}
        self.suffixes: list[str] = []
        for raw in entries:
            entry = raw.strip().lower().rstrip(".")
            if entry.startswith("*."):
                self.suffixes.append(entry[1:])
                continue
            if entry.startswith("[") and "]:" in entry:
                host, _, port = entry[1:].partition("]:")
            elif entry.count(":") == 1:
                host, _, port = entry.rpartition(":")
            else:
                host, port = entry.strip("[]"), ""
            if port:
                self.exact[host] = (*self.exact.get(host, ()), int(port))
            else:
                self.exact[host] = (*self.exact.get(host, ()), *DEFAULT_PORTS)

    def admits(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        if port in self.exact.get(host, ()):
            return True
        return port in DEFAULT_PORTS and any(host.endswith(s) for s in self.suffixes)


class AllowlistProxy:
    """Serve ``listener`` until :meth:`close`; every connection gets its own thread."""

    def __init__(
        self, listener: socket.socket, allow: Allowlist, resolve: Resolver = _system_resolve
    ) -> None:
        self.listener = listener
        self.allow = allow
        self.resolve = resolve
        self.refused: list[str] = []
        self._thread = threading.Thread(target=self._accept, name="allowlist-proxy", daemon=True)

    def start(self) -> AllowlistProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(timeout=5)

    def serve_forever(self) -> None:
        self._accept()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            client.settimeout(CONNECT_TIMEOUT)
            head = _read_head(client)
            if head is None:
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split(" ")
            if len(parts) != 3:
                _status(client, 400, "Bad Request")
                return
            method, target, _version = parts
            try:
                host, port, forward = _destination(method, target, head)
            except ValueError:
                _status(client, 400, "Bad Request")
                return
            if not self.allow.admits(host, port):
                self.refused.append(f"{host}:{port}")
                log.warning("allowlist proxy refused %s:%d", host, port)
                _status(client, 403, "Forbidden")
                return
            try:
                upstream = socket.create_connection(
                    self.resolve(host, port), timeout=CONNECT_TIMEOUT
                )
            except OSError as exc:
                log.info("allowlist proxy cannot reach %s:%d: %s", host, port, exc)
                _status(client, 502, "Bad Gateway")
                return
            with upstream:
                client.settimeout(None)
                upstream.settimeout(None)
                if forward is None:
                    client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                else:
                    upstream.sendall(forward)
                back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                back.start()
                _pipe(client, upstream)
                back.join()


def _destination(method: str, target: str, head: bytes) -> tuple[str, int, bytes | None]:
    """(host, port, bytes to send upstream or None for a CONNECT tunnel)."""
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        return host.strip("[]"), int(port), None
    if not target.startswith("http://"):
        raise ValueError("only CONNECT and absolute http:// requests")
    rest = target[len("http://") :]
    authority, slash, path = rest.partition("/")
    host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "80")
    origin_form = f"{method} {slash}{path} HTTP/1.1".encode()
    _first, _, headers = head.partition(b"\r\n")
    return host, int(port), origin_form + b"\r\n" + headers


def _read_head(client: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = client.recv(4096)
        except OSError:
            return None
        if not chunk or len(data) > HEAD_LIMIT:
            return None
        data += chunk
    return data


def _status(client: socket.socket, code: int, reason: str) -> None:
    try:
        client.sendall(
            f"HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
    except OSError:
        pass


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """``python3 -I -m cairn.proxy --netns PATH --port N --allow D... --user UID:GID``.

    Binds inside the namespace (needs CAP_SYS_ADMIN), then drops to ``--user`` and serves.
    """
    parser = argparse.ArgumentParser(prog="cairn.proxy", description=__doc__)
    parser.add_argument("--netns", type=Path, required=True)
    parser.add_argument("--port", type=int, default=3128)
    parser.add_argument("--allow", action="append", default=[])
    parser.add_argument("--user", required=True, help="UID:GID to serve as")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    listener = listen_in_netns(args.netns, "127.0.0.1", args.port)
    uid, gid = (int(x) for x in args.user.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    log.info(
        "allowlist proxy in %s on 127.0.0.1:%d for %s", args.netns, args.port, ", ".join(args.allow)
    )
    AllowlistProxy(listener, Allowlist(args.allow)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
