"""The one byte pump of the two forwarders (the allowlist proxy and the worker's model
shim): a threaded accept loop and a two-way bridge between two sockets."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self

CHUNK = 65536


class ThreadedServer:
    """Accept on ``listener`` and serve each connection with :meth:`handle` in its own
    thread: in the background from :meth:`start` until :meth:`close`, or in the calling
    thread with :meth:`serve_forever`."""

    def __init__(self, listener: socket.socket, name: str) -> None:
        self.listener = listener
        self._lock = threading.Lock()
        self._open = 0
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def handle(self, client: socket.socket) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(timeout=5)

    def serve_forever(self, idle_exit: float | None = None) -> None:
        """Serve until the listener closes or, with ``idle_exit``, until that many seconds
        pass with no connection open (systemd's socket starts us again on the next one)."""
        self._accept(idle_exit)

    def _accept(self, idle_exit: float | None = None) -> None:
        self.listener.settimeout(idle_exit)
        while True:
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                with self._lock:
                    if self._open == 0:
                        return
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=self._serve_one, args=(client,), daemon=True).start()

    def _serve_one(self, client: socket.socket) -> None:
        with self._lock:
            self._open += 1
        try:
            self.handle(client)
        finally:
            with self._lock:
                self._open -= 1


def bridge(near: socket.socket, far: socket.socket) -> None:
    """Copy bytes both ways between two connected sockets until each side has ended."""
    back = threading.Thread(target=pump, args=(far, near), daemon=True)
    back.start()
    pump(near, far)
    back.join()


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until EOF, then half-close ``dst`` so the peer sees the end of the request."""
    with contextlib.suppress(OSError):
        while chunk := src.recv(CHUNK):
            dst.sendall(chunk)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
