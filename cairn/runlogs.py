"""A run's journal, read with journald's own reader (``journalctl``) and selected only by
fields that journald or PID 1 set.

Every process that can write to the journal can send ``MESSAGE=``, ``CAIRN_RUN=`` or any
other field it likes, so none of those selects an entry. What does is ``_SYSTEMD_UNIT=``
(journald derives it from the sender's cgroup, and every unit of a run is a system unit
whose name carries the run ID: an agent, even as the run owner, cannot put a process into
another system unit, and a user manager's units are recorded as ``user@UID.service``), and
``_PID=1`` with ``UNIT=`` for what systemd itself logged about those units.

Following is done by the reader asking again after the last entry it has: every answer
ends with journalctl's ``--show-cursor`` line, which the next request passes back as
``--after-cursor``; a cursor only ever positions within the same trusted matches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from cairn.protocol.daemon import LogsRequest
from cairn.protocol.jsonvalue import json_object
from cairn.protocol.requestchecks import LOG_CURSOR_RE
from cairn.unitprops import is_agent_unit_of

# Entries one following request returns at most; the reader asks again at once when it
# got any, so a burst is read in batches, never skipped.
FOLLOW_BATCH = 1000
CURSOR_PREFIX = "-- cursor: "


def run_units(receipts: Sequence[Mapping[str, object]]) -> list[str]:
    """Every unit the broker started for the run, in order (import, agents, candidate,
    apply)."""
    names: list[str] = []
    for receipt in receipts:
        data = json_object(receipt.get("data", {}))
        for holder in (data, json_object(data.get("import") or {})):
            unit = holder.get("unit")
            if isinstance(unit, str) and unit not in names:
                names.append(unit)
    return names


def log_units(run_id: str, receipts: Sequence[Mapping[str, object]]) -> list[str]:
    """The systemd units whose journal entries belong to the run: its coordinator and
    egress, and every unit the broker started for it whose name carries the run ID."""
    units = [f"cairn-coordinator@{run_id}.service", f"cairn-egress@{run_id}.service"]
    for unit in run_units(receipts):
        if not _run_unit_re(run_id).fullmatch(unit):
            continue
        names = [unit]
        if unit.endswith(".socket"):
            # A socket unit's entries come from the service it activates.
            names.append(unit.removesuffix(".socket") + ".service")
        units += [name for name in names if name not in units]
    return units


def operation_units(run_id: str, op_id: str, units: list[str]) -> list[str]:
    """The agent units of operation ``op_id`` among ``units`` (one an attempt)."""
    return [unit for unit in units if is_agent_unit_of(unit, run_id, op_id)]


def _run_unit_re(run_id: str) -> re.Pattern[str]:
    return re.compile(rf"cairn-[a-z]+-{run_id}(-[a-z0-9-]+)?\.(service|socket)")


def journal_matches(units: list[str]) -> list[str]:
    """journalctl matches on fields only journald and PID 1 set, never on a field a
    client can send (``CAIRN_RUN=`` is set by any process that writes to the journal):
    what the run's units logged, or PID 1 logged about them."""
    own = [f"_SYSTEMD_UNIT={u}" for u in units]
    about = ["_PID=1", *(f"UNIT={u}" for u in units)]
    return [*own, "+", *about]


def journalctl_argv(units: list[str], query: LogsRequest) -> list[str]:
    """The journalctl command line that answers ``query`` for a run with ``units``.

    Every value is one ``--option=value`` word (none can be read as another option), and
    the matches come last. With ``after_cursor`` it reads the oldest :data:`FOLLOW_BATCH`
    entries after it (journalctl counts ``--lines`` from a cursor forwards); otherwise
    the last ``lines`` entries (``--since`` still applies), or all of them.
    """
    argv = ["journalctl", "--no-pager", "--quiet", "--show-cursor", f"--output={query.output}"]
    if query.priority is not None:
        argv.append(f"--priority={query.priority}")
    if query.grep is not None:
        argv.append(f"--grep={query.grep}")
    if query.until is not None:
        argv.append(f"--until={query.until}")
    if query.after_cursor is not None:
        argv += [f"--after-cursor={query.after_cursor}", f"--lines={FOLLOW_BATCH}"]
    else:
        if query.reverse:
            argv.append("--reverse")
        if query.since is not None:
            argv.append(f"--since={query.since}")
        if query.lines is not None:
            # With no entries shown journalctl prints no cursor to follow from, so
            # "none of the old ones" asks for the newest and drops it (split_cursor).
            argv.append(f"--lines={max(query.lines, 1)}")
    return [*argv, *journal_matches(units)]


def split_cursor(stdout: str, query: LogsRequest) -> tuple[str, str | None]:
    """The entries journalctl printed and the cursor of the last one (None when it showed
    none). Only the final line can be the cursor: journalctl prints it after every entry,
    so a message that merely looks like one never counts."""
    body, _, last = stdout.rstrip("\n").rpartition("\n")
    if not last.startswith(CURSOR_PREFIX):
        return stdout, None
    cursor = last.removeprefix(CURSOR_PREFIX).strip()
    if not LOG_CURSOR_RE.fullmatch(cursor):
        return stdout, None
    text = body + "\n" if body else ""
    if query.lines == 0 and query.after_cursor is None:
        text = ""
    return text, cursor
