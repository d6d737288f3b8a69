"""The allowlist proxy: the only way out of an ``allowlist`` agent's network namespace,
and (in ``cairn-egress@.service``) the coordinator's only way to its model providers.

For agents it accepts on a socket that lives inside the run's namespace (the run's
``cairn-proxy-RUN.socket``, ``PrivateNetwork=yes``; agent units join it with
``JoinsNamespaceOf=``) and connects out from the host's namespace, only to reviewed
destinations. It speaks HTTP ``CONNECT host:port`` (HTTPS and anything
else tunnelled) and absolute-form plain HTTP requests (``GET http://host/...``).

An allowlist entry is ``host`` (ports 80 and 443), ``host:port`` (that port only) or
``*.domain`` (every subdomain of ``domain``, ports 80 and 443). IP literals are admitted
only when listed. Names are resolved here, on the host, never by the agent.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
from collections.abc import Callable

from cairn import journald
from cairn.forwarding import ThreadedServer, bridge
from cairn.sockets import systemd_listener

log = logging.getLogger(__name__)

HEAD_LIMIT = 16 << 10
CONNECT_TIMEOUT = 15.0
DEFAULT_PORTS = (80, 443)
IDLE_EXIT = 300.0

Resolver = Callable[[str, int], tuple[str, int]]


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


class AllowlistProxy(ThreadedServer):
    """Serve ``listener`` until :meth:`close`; every connection gets its own thread."""

    def __init__(
        self, listener: socket.socket, allow: Allowlist, resolve: Resolver = _system_resolve
    ) -> None:
        super().__init__(listener, "allowlist-proxy")
        self.allow = allow
        self.resolve = resolve
        self.refused: list[str] = []

    def handle(self, client: socket.socket) -> None:
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
                bridge(client, upstream)


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
    with contextlib.suppress(OSError):
        client.sendall(
            f"HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )


def main(argv: list[str] | None = None) -> int:
    """``python3 -I -m cairn.proxy --allow D...``, socket-activated.

    Serves the listening socket systemd passes: the run's ``cairn-proxy-RUN.socket``,
    bound inside the run's namespace with ``NetworkNamespacePath=`` while this process
    stays in the host's namespace, unprivileged (``DynamicUser=``).
    """
    parser = argparse.ArgumentParser(prog="cairn.proxy", description=__doc__)
    parser.add_argument("--allow", action="append", default=[])
    args = parser.parse_args(argv)
    journald.setup_logging()
    listener = systemd_listener()
    if listener is None:
        print("cairn.proxy: no listening socket; start it through its socket unit", file=sys.stderr)
        return 2
    log.info("allowlist proxy for %s", ", ".join(args.allow) or "nothing")
    AllowlistProxy(listener, Allowlist(args.allow)).serve_forever(idle_exit=IDLE_EXIT)
    log.info("allowlist proxy idle for %.0f s; exiting until the next connection", IDLE_EXIT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
