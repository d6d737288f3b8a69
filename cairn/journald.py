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


def identifier() -> str:
    """The program's name for the journal: ``cairn-coordinator`` for ``python3 -m
    cairn.coordinator`` (whose ``argv[0]`` is a ``__main__.py``), else argv[0]'s name."""
    path = sys.argv[0] if sys.argv and sys.argv[0] else "cairn"
    if os.path.basename(path) == "__main__.py":
        return f"cairn-{os.path.basename(os.path.dirname(path))}"
    return os.path.basename(path)


def send(message: str, *, priority: int = 6, **fields: str) -> None:
    """Write one journal entry with ``MESSAGE`` and upper-case ``fields``."""
    payload = _encode("MESSAGE", message) + _encode("PRIORITY", str(priority))
    payload += _encode("SYSLOG_IDENTIFIER", identifier())
    for key, value in fields.items():
        if value:
            payload += _encode(key, value)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(payload, JOURNAL_SOCKET)
    except OSError:
        log.info("%s %s", message, " ".join(f"{k}={v}" for k, v in fields.items() if v))


# syslog priorities of the logging levels, for journald's "<N>" line prefix.
SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _PriorityPrefix(logging.Formatter):
    """Prefix each record with ``<N>`` so ``journalctl -p err`` selects by level
    (SyslogLevelPrefix=, on by default, strips it)."""

    def format(self, record: logging.LogRecord) -> str:
        priority = SYSLOG_PRIORITY.get(record.levelno, 6)
        return f"<{priority}>{super().format(record)}"


def stderr_is_journal() -> bool:
    """True when stderr is the journal stream systemd connected (``$JOURNAL_STREAM``)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


def setup_logging() -> None:
    """stderr logging (journald captures it under systemd, with each record's priority);
    level from CAIRN_LOG_LEVEL."""
    level = os.environ.get("CAIRN_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _PriorityPrefix(LOG_FORMAT) if stderr_is_journal() else logging.Formatter(LOG_FORMAT)
    )
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler])
