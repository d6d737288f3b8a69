"""How a person names a run, and the options of a journal query, with the checks cairnd
and the CLI both make of them, as plain patterns and functions. Standard library only, no
pydantic: every ``cairn`` start imports these (the CLI checks a RUN or ``--priority`` as it
parses it) and builds no model for it; the request models (:mod:`cairn.protocol.daemon`)
type their fields with them.
"""

from __future__ import annotations

import re
import typing
from typing import Literal

# How a request names a run: its ID (``flow_`` and 32 hex digits), a prefix of it of at
# least MIN_RUN_PREFIX hex digits with or without ``flow_``, or ``@last`` (the caller's
# newest run). cairnd resolves it, among the runs the caller may see, before any handler.
MIN_RUN_PREFIX = 4
LAST_RUN = "@last"
RUN_REF_RE = re.compile(rf"^(?:{LAST_RUN}|(?:flow_)?[0-9a-f]{{{MIN_RUN_PREFIX},32}})$")
RUN_REF_HELP = (
    f"The run: its ID, a unique prefix of it (at least {MIN_RUN_PREFIX} hex digits, "
    f"with or without flow_), or {LAST_RUN} for your newest run."
)


def run_ref_problem(ref: str) -> str | None:
    """Why ``ref`` cannot name a run (one line), or None when it can."""
    if RUN_REF_RE.fullmatch(ref):
        return None
    if not ref:
        return "no run given"
    shown = repr(ref if len(ref) <= 40 else ref[:40] + "…")
    if re.fullmatch(rf"(?:flow_)?[0-9a-f]{{0,{MIN_RUN_PREFIX - 1}}}", ref):
        return (
            f"run prefix {shown} is too short: give at least {MIN_RUN_PREFIX} hex digits "
            f"of the run ID, or {LAST_RUN}"
        )
    return (
        f"{shown} does not name a run: give its ID (flow_ and 32 lowercase hex digits), "
        f"a unique prefix of at least {MIN_RUN_PREFIX} hex digits, or {LAST_RUN}"
    )


# The output formats of journalctl that ``cairn logs -o`` passes on (export is binary).
LogOutput = Literal[
    "short",
    "short-full",
    "short-iso",
    "short-iso-precise",
    "short-precise",
    "short-monotonic",
    "short-unix",
    "with-unit",
    "verbose",
    "cat",
    "json",
    "json-pretty",
    "json-seq",
    "json-sse",
]
LOG_OUTPUTS: tuple[str, ...] = typing.get_args(LogOutput)
LOG_PRIORITIES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")
_LEVEL = rf"(?:{'|'.join(LOG_PRIORITIES)}|[0-7])"
LOG_PRIORITY_RE = re.compile(rf"^{_LEVEL}(?:\.\.{_LEVEL})?$")
# A journald cursor as journalctl prints it (s=…;i=…;b=…;m=…;t=…;x=…).
LOG_CURSOR_RE = re.compile(r"^[a-z]=[0-9a-f]{1,64}(?:;[a-z]=[0-9a-f]{1,64}){0,9}$")
MAX_LOG_SINCE = 64
MAX_LOG_LINES = 10_000
MAX_LOG_GREP = 256


def log_priority_problem(value: str) -> str | None:
    """Why ``value`` is not a journal priority or range (one line), or None."""
    if LOG_PRIORITY_RE.fullmatch(value):
        return None
    return (
        f"priority {value[:40]!r} is not a syslog level: give one of "
        f"{', '.join(LOG_PRIORITIES)} (or 0-7), or a range such as err..warning"
    )


def log_since_problem(value: str) -> str | None:
    """Why ``value`` cannot be a ``--since`` time for journalctl (one line), or None.
    Whether journalctl can read it as a time is journalctl's to say."""
    return _log_time_problem(value, "--since")


def log_until_problem(value: str) -> str | None:
    """Why ``value`` cannot be an ``--until`` time for journalctl (one line), or None."""
    return _log_time_problem(value, "--until")


def _log_time_problem(value: str, option: str) -> str | None:
    if 0 < len(value) <= MAX_LOG_SINCE and value.isprintable():
        return None
    return f"{option} takes a time of at most {MAX_LOG_SINCE} printable characters"


def log_grep_problem(value: str) -> str | None:
    """Why ``value`` cannot be a ``--grep`` pattern (one line), or None. Whether it is a
    regular expression is journalctl's to say."""
    if 0 < len(value) <= MAX_LOG_GREP and value.isprintable():
        return None
    return f"--grep takes a pattern of at most {MAX_LOG_GREP} printable characters"
