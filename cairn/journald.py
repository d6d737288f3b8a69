"""Structured records for the systemd journal, without libsystemd.

``send()`` speaks journald's native datagram protocol so fields such as ``CAIRN_RUN=``
are indexed (``journalctl CAIRN_RUN=flow_…``). Outside systemd it logs instead.
"""

from __future__ import annotations

import logging
import os
import socket
import sys

JOURNAL_SOCKET = "/run/systemd/journal/socket"

log = logging.getLogger("cairn")


def _encode(key: str, value: str) -> bytes:
    raw = value.encode()
    if b"\n" in raw:
        return key.encode() + b"\n" + len(raw).to_bytes(8, "little") + raw + b"\n"
    return key.encode() + b"=" + raw + b"\n"


def send(message: str, *, priority: int = 6, **fields: str) -> None:
    """Write one journal entry with ``MESSAGE`` and upper-case ``fields``."""
    payload = _encode("MESSAGE", message) + _encode("PRIORITY", str(priority))
    payload += _encode("SYSLOG_IDENTIFIER", os.path.basename(sys.argv[0]) or "cairn")
    for key, value in fields.items():
        if value:
            payload += _encode(key, value)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(payload, JOURNAL_SOCKET)
    except OSError:
        log.info("%s %s", message, " ".join(f"{k}={v}" for k, v in fields.items() if v))


def setup_logging() -> None:
    """stderr logging (journald captures it under systemd); level from SYSTEMD_LOG_LEVEL."""
    level = os.environ.get("CAIRN_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
