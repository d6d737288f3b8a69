"""The two byte forwarders over one threaded server and pump (:mod:`cairn.forwarding`): the
allowlist proxy and the agent worker's model shim, on loopback and a Unix socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.proxy import Allowlist, AllowlistProxy
from cairn.worker.shim import TcpShim


def _echo(listener: socket.socket) -> None:
    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    def one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(100):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()


@pytest.fixture
def echo_tcp() -> Iterator[tuple[str, int]]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        _echo(listener)
        yield listener.getsockname()
        listener.shutdown(socket.SHUT_RDWR)


def _exchange(address: tuple[str, int], first: bytes, then: bytes) -> list[bytes]:
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(first)
        got = [conn.recv(200)]
        conn.sendall(then)
        got.append(conn.recv(200))
        conn.shutdown(socket.SHUT_WR)  # the far side sees the end, and so do we
        got.append(conn.recv(200))
        return got


def test_the_proxy_tunnels_an_admitted_destination_and_refuses_others(
    echo_tcp: tuple[str, int],
) -> None:
    host, port = echo_tcp
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = AllowlistProxy(listener, Allowlist([f"{host}:{port}"]), resolve=lambda h, p: (h, p))
    proxy.start()
    try:
        connect = f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode()
        assert _exchange(listener.getsockname(), connect, b"hello") == [
            b"HTTP/1.1 200 Connection Established\r\n\r\n",
            b"hello",
            b"",
        ]
        with socket.create_connection(listener.getsockname(), timeout=10) as conn:
            conn.sendall(b"CONNECT elsewhere.example:443 HTTP/1.1\r\n\r\n")
            assert conn.recv(200).startswith(b"HTTP/1.1 403 Forbidden")
    finally:
        proxy.close()
    assert proxy.refused == ["elsewhere.example:443"]


def test_the_proxy_serving_in_the_foreground_exits_when_idle() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        AllowlistProxy(listener, Allowlist([])).serve_forever(idle_exit=0.01)


def test_the_shim_forwards_tcp_to_the_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "model.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        upstream.bind(str(path))
        upstream.listen()
        _echo(upstream)
        with TcpShim(str(path)) as shim:
            assert _exchange(("127.0.0.1", shim.port), b"one", b"two") == [b"one", b"two", b""]
        upstream.shutdown(socket.SHUT_RDWR)
