"""A TCP listener on the unit's own loopback that forwards to the model socket.

Agent CLIs that only speak HTTP over TCP get ``OPENAI_BASE_URL=http://127.0.0.1:PORT/v1``;
each connection is piped byte for byte to ``/run/cairn/model.sock``. The unit's network
namespace has only ``lo``, so nothing else can reach the listener.
"""

from __future__ import annotations

import logging
import socket

from cairn.forwarding import ThreadedServer, bridge

log = logging.getLogger(__name__)


class TcpShim(ThreadedServer):
    """Forward ``127.0.0.1:port`` (an ephemeral port unless given) to a Unix socket."""

    def __init__(self, unix_path: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(socket.create_server((host, port)), "model-shim")
        self.unix_path = unix_path
        self.port: int = self.listener.getsockname()[1]

    def __enter__(self) -> TcpShim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def handle(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.unix_path)
        except OSError as exc:
            log.warning("model shim cannot reach %s: %s", self.unix_path, exc)
            upstream.close()
            client.close()
            return
        bridge(client, upstream)
        client.close()
        upstream.close()
