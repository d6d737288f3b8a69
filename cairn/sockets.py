"""Listening sockets for the socket-activated services (cairnd, the broker, the proxy).
The forwarders' byte pump is :mod:`cairn.forwarding`."""

from __future__ import annotations

import os
import socket
from pathlib import Path

SD_LISTEN_FDS_START = 3


def systemd_listener() -> socket.socket | None:
    """The first socket systemd passed us (``LISTEN_FDS``), or None if not activated."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    if int(os.environ.get("LISTEN_FDS", "0")) < 1:
        return None
    return socket.socket(fileno=SD_LISTEN_FDS_START)


def listener(path: Path, mode: int) -> socket.socket:
    """Systemd's socket if we were activated; otherwise bind ``path`` ourselves with
    ``mode`` (a service started by hand, e.g. in a test)."""
    activated = systemd_listener()
    if activated is not None:
        return activated
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, mode)
    sock.listen(64)
    return sock

