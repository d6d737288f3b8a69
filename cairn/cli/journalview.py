"""``cairn logs`` on a terminal: journal entries in journalctl's ``short-iso`` lines,
each message coloured by its priority as journalctl colours it. cairnd sends the entries
as journalctl's JSON (one object a line); every field shown is escaped
(:func:`~cairn.terminal.printable`), and the only escape sequences written are the
colours chosen here, so an entry can neither move the cursor nor fake a colour."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

from cairn.terminal import printable

# systemd's colours for journalctl (emerg, alert, crit and err red; warning yellow;
# notice bold; info plain; debug grey).
ERROR_STYLE = "\x1b[1;31m"
WARNING_STYLE = "\x1b[1;33m"
NOTICE_STYLE = "\x1b[1m"
DEBUG_STYLE = "\x1b[38;5;245m"
RESET = "\x1b[0m"
STYLE_OF_PRIORITY = {
    0: ERROR_STYLE, 1: ERROR_STYLE, 2: ERROR_STYLE, 3: ERROR_STYLE,
    4: WARNING_STYLE, 5: NOTICE_STYLE, 7: DEBUG_STYLE,
}


def _field(entry: Mapping[str, object], name: str) -> str | None:
    """A field as text: journalctl's JSON gives a field that is not valid UTF-8 as a list
    of byte values, and a field set more than once as a list of them (the first shown)."""
    value = entry.get(name)
    if isinstance(value, list) and value and isinstance(value[0], (list, str)):
        value = value[0]
    if isinstance(value, list):
        octets = [b for b in value if isinstance(b, int) and 0 <= b < 256]
        if len(octets) != len(value):
            return None
        return bytes(octets).decode("utf-8", "backslashreplace")
    return value if isinstance(value, str) else None


def _timestamp(entry: Mapping[str, object]) -> str:
    micros = _field(entry, "__REALTIME_TIMESTAMP")
    if micros is None or not micros.isdigit():
        return "-"
    moment = datetime.fromtimestamp(int(micros) / 1_000_000, tz=UTC).astimezone()
    return moment.isoformat(timespec="seconds")


def _priority(entry: Mapping[str, object]) -> int | None:
    value = _field(entry, "PRIORITY")
    return int(value) if value is not None and value.isdigit() and len(value) == 1 else None


def entry_lines(entry: Mapping[str, object], *, colour: bool) -> list[str]:
    """One entry as journalctl's short-iso prints it: ``TIME HOST IDENT[PID]: MESSAGE``,
    a message's further lines indented under its first."""
    identifier = _field(entry, "SYSLOG_IDENTIFIER") or _field(entry, "_COMM") or "unknown"
    pid = _field(entry, "_PID") or _field(entry, "SYSLOG_PID")
    prefix = " ".join(
        printable(part)
        for part in (_timestamp(entry), _field(entry, "_HOSTNAME") or "-",
                     f"{identifier}[{pid}]:" if pid else f"{identifier}:")
    )
    message = _field(entry, "MESSAGE")
    lines = (message if message is not None else "[blob data]").split("\n")
    style = STYLE_OF_PRIORITY.get(_priority(entry) or 6, "") if colour else ""
    shown = [printable(line, tabs=True) for line in lines]
    if style:
        shown = [f"{style}{line}{RESET}" for line in shown]
    indent = " " * (len(prefix) + 1)
    return [f"{prefix} {shown[0]}", *(f"{indent}{line}" for line in shown[1:])]


def render(text: str, *, colour: bool) -> str:
    """journalctl's JSON lines (what cairnd sent for ``--output=json``) as short-iso
    lines; a line that is no JSON object is shown escaped, as it came."""
    out: list[str] = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            out += entry_lines(entry, colour=colour)
        else:
            out.append(printable(line, tabs=True))
    return "".join(f"{line}\n" for line in out)
