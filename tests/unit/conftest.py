"""Fixtures shared by unit tests of more than one process."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator

import pytest

from cairn.daemon import attest


@pytest.fixture
def owner_channel() -> Iterator[queue.Queue[bytes]]:
    """cairnd serving requests that carry their owner's attestation channel (as the CLI
    passes it); yields what cairnd showed the owner there, one description a line."""
    mine, theirs = socket.socketpair()
    shown: queue.Queue[bytes] = queue.Queue()

    def owner() -> None:
        pending = b""
        while chunk := mine.recv(1 << 16):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                shown.put(line)

    reader = threading.Thread(target=owner, daemon=True)
    reader.start()
    with attest.serving(theirs.fileno()):
        yield shown
    theirs.close()
    reader.join(timeout=10)
    mine.close()
