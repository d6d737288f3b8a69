"""A TCP listener on the unit's own loopback that forwards to the model socket.

Agent CLIs that only speak HTTP over TCP get ``OPENAI_BASE_URL=http://127.0.0.1:PORT/v1``;
each connection is piped byte for byte to ``/run/cairn/model.sock``. The unit's network
namespace has only ``lo``, so nothing else can reach the listener.
"""

from __future__ import annotations

import logging
import socket
import threading

log = logging.getLogger(__name__)

CHUNK = 65536


class TcpShim:
    """Forward ``127.0.0.1:port`` (an ephemeral port unless given) to a Unix socket."""

    def __init__(self, unix_path: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.unix_path = unix_path
        self.listener = socket.create_server((host, port))
        self.port: int = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="model-shim", daemon=True)

    def start(self) -> TcpShim:
        self._thread.start()
        return self

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> TcpShim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.unix_path)
        except OSError as exc:
            log.warning("model shim cannot reach %s: %s", self.unix_path, exc)
            upstream.close()
            client.close()
            return
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
        client.close()
        upstream.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy until EOF, then half-close ``dst`` so the peer sees the end of the request."""
    try:
        while chunk := src.recv(CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
