"""Log records and entries (``CAIRN_RUN=``…) in journald's native protocol, with priority
and code location; why hand-written: /usr/share/doc/cairn/docs/decisions/journal-logging.md."""

from __future__ import annotations

import logging
import os
import socket
import sys
import traceback

JOURNAL_SOCKET = "/run/systemd/journal/socket"
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
SYSLOG_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6}


def syslog_priority(levelno: int) -> int:
    """Syslog priority of a level (ERROR 3); a level between two takes the lower's; DEBUG 7."""
    return next((p for lvl, p in SYSLOG_PRIORITY.items() if levelno >= lvl), 7)


def _encode(key: str, value: str) -> bytes:
    raw = value.encode(errors="replace")
    if b"\n" in raw:
        return key.encode() + b"\n" + len(raw).to_bytes(8, "little") + raw + b"\n"
    return key.encode() + b"=" + raw + b"\n"


def identifier() -> str:
    """argv[0]'s name (``cairnd``); ``cairn-proxy``, ``cairn-coordinator`` for ``-m``."""
    path = sys.argv[0] if sys.argv and sys.argv[0] else "cairn"
    if path.endswith(".py"):  # a module file, or a package's __main__.py
        return "cairn-" + os.path.basename(path.removesuffix("/__main__.py").removesuffix(".py"))
    return os.path.basename(path)


def _send(fields: dict[str, str]) -> None:
    """One entry; OSError where the socket is out of reach (an agent unit) or too small."""
    fields = {"SYSLOG_IDENTIFIER": identifier(), **fields}
    payload = b"".join(_encode(k, v) for k, v in fields.items() if v)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(payload, JOURNAL_SOCKET)


def send(message: str, *, priority: int = 6, **fields: str) -> None:
    """Write one journal entry with ``MESSAGE``, ``PRIORITY`` and upper-case ``fields``."""
    try:
        _send({"MESSAGE": message, "PRIORITY": str(priority), **fields})
    except OSError:
        detail = " ".join(f"{k}={v}" for k, v in fields.items() if v)
        logging.getLogger("cairn").info("%s %s", message, detail)


class JournalHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Each record as one entry with its priority and code location; where that fails, a
    stderr line with a ``<N>`` prefix, which journald reads as the same priority."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{syslog_priority(record.levelno)}>{super().format(record)}"

    def emit(self, record: logging.LogRecord) -> None:
        message = f"{record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        try:
            _send({"MESSAGE": message, "PRIORITY": str(syslog_priority(record.levelno)),
                   "CODE_FILE": record.pathname, "CODE_LINE": str(record.lineno),
                   "CODE_FUNC": record.funcName, "LOGGER": record.name})
        except OSError:
            super().emit(record)


def stderr_is_journal() -> bool:
    """True when stderr is the journal stream systemd connected (``$JOURNAL_STREAM``)."""
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return os.environ.get("JOURNAL_STREAM", "") == f"{st.st_dev}:{st.st_ino}"


def setup_logging() -> None:
    """Journal entries under systemd, plain stderr lines elsewhere; level CAIRN_LOG_LEVEL."""
    level = os.environ.get("CAIRN_LOG_LEVEL", "INFO").upper()
    handler = JournalHandler() if stderr_is_journal() else logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler])
