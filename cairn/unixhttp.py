"""HTTP over a Unix socket: how the agent's model client and ``cairn provider test``
talk to a model relay."""

from __future__ import annotations

import http.client
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """An :class:`http.client.HTTPConnection` to the Unix socket at ``path``."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("relay", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock
