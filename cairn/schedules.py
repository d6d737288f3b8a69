"""Schedules: a reviewed launch saved for later, with a visible, finite permission.

This module holds what both sides share: the boundary models, calendar handling through
``systemd-analyze`` (systemd decides what a calendar means, so systemd validates it),
the timer unit a schedule installs, and the admission rules as a pure function over facts
that cairnd reads from its store under the schedule and machine-wide locks.
"""

from __future__ import annotations

import math
import os
import re
from datetime import UTC, datetime
from typing import Literal

from pydantic import ConfigDict, Field, JsonValue

from cairn import paths
from cairn.canonical import canonical_json, sha256_hex
from cairn.config import Problems, load_file
from cairn.errors import UsageError
from cairn.proc import run
from cairn.protocol.base import Frozen
from cairn.protocol.launch import ProfileSpec

SCHEDULE_ID_RE = re.compile(r"^[0-9a-f]{12}$")
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
CHALLENGE_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TIMEZONE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$")

DEFAULT_MAX_LAUNCH_FAILURES = 3
DEFAULT_MACHINE_LIMIT = 4
# a queued run (waiting for a machine-wide slot, cairn/admission.py) counts as active here
ACTIVE_RUN_STATES = ("queued", "pending", "running", "waiting")

_ELAPSE_RE = re.compile(
    # systemd < 257 labels later elapses "Iter. #N", newer ones "Iteration #N".
    r"^\s*(?:Next elapse|Iter(?:\.|ation) #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$",
    re.M,
)
_NORMALIZED_RE = re.compile(r"^\s*Normalized form: (.+)$", re.M)
_TIMESPAN_RE = re.compile(r"^\s*μs: (\d+)$", re.M)
_PAGE = 1000
_MAX_PAGES = 20

CatchUp = Literal["once", "none"]
Overlap = Literal["skip", "queue-one"]
Status = Literal["paused", "enabled", "blocked", "deleted"]
Action = Literal["create", "replace"]


class ScheduleCreate(Frozen):
    """What ``cairn schedule create`` sends; cairnd turns it into a :class:`ScheduleSpec`."""

    name: str = Field(pattern=NAME_PATTERN)
    definition: str
    args: dict[str, JsonValue] = {}
    calendar: str = Field(min_length=1, max_length=200)
    timezone: str = Field(min_length=1, max_length=64)
    catch_up: CatchUp
    max_runs: int = Field(ge=1, le=100_000)
    valid_until: str
    min_spacing: str = "0"
    overlap: Overlap = "skip"
    scripted: dict[str, ProfileSpec] = {}
    replace: bool = False


class ScheduleConfirm(Frozen):
    action: Action


class ScheduleSpec(Frozen):
    """One reviewed revision of a schedule: everything an occurrence is launched from.

    Its review challenge covers every field, so a person confirms exactly this.
    """

    name: str = Field(pattern=NAME_PATTERN)
    owner_uid: int
    definition: str
    review_hash: str
    args: dict[str, JsonValue]
    project: str
    project_dev: int
    project_ino: int
    calendar: str
    timezone: str
    catch_up: CatchUp
    max_runs: int = Field(ge=1)
    valid_until: float
    min_spacing_sec: int = Field(ge=0)
    overlap: Overlap
    profiles: dict[str, ProfileSpec]
    max_launch_failures: int = Field(default=DEFAULT_MAX_LAUNCH_FAILURES, ge=1)


def review_challenge(schedule_id: str, revision: int, action: Action, spec: ScheduleSpec) -> str:
    """The exact string a person confirms: a hash over the action and the whole revision."""
    body = {
        "action": action,
        "schedule_id": schedule_id,
        "revision": revision,
        "spec": spec.model_dump(mode="json"),
    }
    return "sha256:" + sha256_hex(canonical_json(body))


def timer_name(schedule_id: str) -> str:
    return f"cairn-schedule@{schedule_id}.timer"


def service_name(schedule_id: str) -> str:
    return f"cairn-schedule@{schedule_id}.service"


def render_timer(schedule_id: str, revision: int, spec: ScheduleSpec) -> str:
    """The user timer of one schedule. It names only the schedule ID (through its unit
    name): no source, arguments, paths or executable choice."""
    return (
        "# Written by cairn for one schedule; 'cairn schedule doctor' checks it and\n"
        "# 'cairn schedule repair' rewrites it. Edit the schedule, not this file.\n"
        "[Unit]\n"
        f"Description=Cairn schedule {spec.name} ({schedule_id}, revision {revision})\n"
        "\n"
        "[Timer]\n"
        f"OnCalendar={spec.calendar}\n"
        f"Persistent={'true' if spec.catch_up == 'once' else 'false'}\n"
        "AccuracySec=1min\n"
        "RandomizedDelaySec=0\n"
        "WakeSystem=no\n"
        f"Unit={service_name(schedule_id)}\n"
        "\n"
        "[Install]\n"
        "WantedBy=timers.target\n"
    )


# --- calendar, time spans, instants ---------------------------------------------------


def _analyze(argv: list[str]) -> str:
    proc = run(["systemd-analyze", *argv], env={"TZ": "UTC"}, check=False, timeout=30)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(
            err[-1] if err else f"systemd-analyze {argv[0]} failed",
            hint="see man systemd.time for the syntax",
        )
    return proc.stdout.decode(errors="replace")


def normalize_calendar(calendar: str, timezone: str) -> str:
    """The calendar in systemd's normalized form, evaluated in ``timezone``."""
    if "\n" in calendar or "\r" in calendar:
        raise UsageError("the calendar must be one line")
    if not TIMEZONE_RE.match(timezone):
        raise UsageError(f"invalid timezone {timezone!r}", hint="e.g. UTC or Europe/Berlin")
    try:
        out = _analyze(["calendar", f"{calendar.strip()} {timezone}"])
    except UsageError:
        try:
            _analyze(["calendar", calendar])
        except UsageError as plain:
            raise UsageError(
                f"invalid calendar {calendar!r}: {plain.message}",
                hint="e.g. '*-*-* 09:00:00' or 'Mon..Fri 18:00'; see man systemd.time",
            ) from None
        raise UsageError(
            f"calendar {calendar!r} does not combine with timezone {timezone!r}",
            hint="give the timezone only with --timezone, and a zone systemd knows",
        ) from None
    match = _NORMALIZED_RE.search(out)
    if match is None:
        raise UsageError(f"systemd-analyze gave no normalized form for {calendar!r}")
    return match.group(1).strip()


def elapses_after(calendar: str, base: float, count: int) -> list[float]:
    """Up to ``count`` elapse instants (epoch seconds) strictly after ``base``."""
    out = _analyze(
        ["calendar", f"--iterations={count}", f"--base-time=@{math.floor(base)}", calendar]
    )
    instants = [
        datetime.strptime(m, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        for m in _ELAPSE_RE.findall(out)
    ]
    return [t for t in instants if t > base]


def latest_elapse(calendar: str, after: float, now: float) -> float | None:
    """The latest elapse in ``(after, now]``, or None if the calendar had none there.

    This is the nominal fire time of a trigger: a timer fires at or after its elapse, and
    a catch-up trigger stands for the latest missed elapse.
    """
    base = after
    best: float | None = None
    for _ in range(_MAX_PAGES):
        batch = elapses_after(calendar, base, _PAGE)
        due = [t for t in batch if t <= now]
        if due:
            best = due[-1]
        if len(due) < _PAGE:
            return best
        base = due[-1]
    # A dense calendar over a long gap: its latest elapse is surely within the last hour.
    return latest_elapse(calendar, max(base, now - 3600), now)


def parse_timespan(text: str) -> int:
    """A systemd time span (``90s``, ``5min``, ``1h 30min``) in whole seconds."""
    if text.strip() in ("", "0"):
        return 0
    match = _TIMESPAN_RE.search(_analyze(["timespan", text]))
    if match is None:
        raise UsageError(f"invalid time span {text!r}", hint="e.g. 30s, 5min, 2h")
    return math.ceil(int(match.group(1)) / 1_000_000)


def parse_instant(text: str) -> float:
    """An ISO 8601 instant with an explicit offset (``2028-01-01T00:00:00Z``)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"invalid instant {text!r}", hint="use ISO 8601, e.g. 2028-01-01T00:00:00Z"
        ) from None
    if when.tzinfo is None:
        raise UsageError(f"instant {text!r} has no UTC offset", hint="e.g. 2028-01-01T00:00:00Z")
    return when.timestamp()


def format_instant(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def project_identity(fd: int) -> tuple[int, int]:
    """(st_dev, st_ino) of the project directory the caller opened."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


# --- admission ------------------------------------------------------------------------


class AdmissionFacts(Frozen):
    """What cairnd read from its store, the journal and the caller's fd for one trigger."""

    now: float
    status: Status
    blocked_reason: str | None = None
    confirmed: bool
    definition_review_hash: str | None
    # why the definition does not have the pinned hash (changed, unreadable), if known
    definition_problem: str | None = None
    project_matches: bool
    duplicate: bool
    used_in_revision: int
    own_active_runs: list[str]
    own_queued: int
    last_launch_at: float | None
    machine_active: int
    machine_limit: int


class Decision(Frozen):
    outcome: Literal["admit", "queue", "refuse", "duplicate"]
    reason: str
    # the refusal stands until a person renews the schedule: it is blocked with the reason
    blocks: bool = False


def decide(spec: ScheduleSpec, facts: AdmissionFacts) -> Decision:
    """Whether one occurrence may become a run. The order matters only for which reason
    is reported; every rule must hold for an admission."""
    if facts.duplicate:
        return Decision(outcome="duplicate", reason="this occurrence was already decided")
    if facts.status == "blocked":
        return Decision(outcome="refuse", reason=f"schedule is blocked: {facts.blocked_reason}")
    if facts.status != "enabled":
        return Decision(outcome="refuse", reason=f"schedule is {facts.status}")
    if not facts.confirmed:
        return Decision(outcome="refuse", reason="the current revision is not confirmed")
    if facts.definition_review_hash != spec.review_hash:
        return Decision(
            outcome="refuse",
            reason=facts.definition_problem
            or f"definition {spec.definition} changed since the schedule was reviewed",
            blocks=True,
        )
    if not facts.project_matches:
        return Decision(
            outcome="refuse", reason=f"project {spec.project} is not the reviewed directory"
        )
    if facts.now >= spec.valid_until:
        return Decision(
            outcome="refuse", reason=f"valid-until {format_instant(spec.valid_until)} has passed"
        )
    if facts.used_in_revision >= spec.max_runs:
        return Decision(outcome="refuse", reason=f"max-runs {spec.max_runs} reached")
    if facts.own_active_runs:
        if spec.overlap == "queue-one" and facts.own_queued == 0:
            return Decision(
                outcome="queue",
                reason=f"queued behind active run {', '.join(facts.own_active_runs)}",
            )
        return Decision(
            outcome="refuse",
            reason=f"overlaps active run {', '.join(facts.own_active_runs)}"
            + (" and one occurrence is already queued" if facts.own_queued else ""),
        )
    if facts.last_launch_at is not None and facts.now - facts.last_launch_at < spec.min_spacing_sec:
        return Decision(
            outcome="refuse",
            reason=f"min-spacing {spec.min_spacing_sec}s: last launch "
            f"{int(facts.now - facts.last_launch_at)}s ago",
        )
    if facts.machine_active >= facts.machine_limit:
        return Decision(
            outcome="refuse",
            reason=f"machine-wide limit of {facts.machine_limit} active scheduled runs reached",
        )
    return Decision(outcome="admit", reason="admitted")


class HostScheduleConfig(Frozen):
    """``/etc/cairn/schedules.toml``."""

    model_config = ConfigDict(defer_build=True, strict=True)

    max_active_scheduled_runs: int = Field(default=DEFAULT_MACHINE_LIMIT, ge=0)


SCHEDULES_FIX = (
    "its only key is max_active_scheduled_runs, a whole number (0 admits no scheduled run); "
    "fix the file or remove it to use the defaults"
)


def host_config(*, problems: Problems | None = None) -> HostScheduleConfig:
    """The host's schedule settings; every problem of the file raised as one
    :class:`cairn.config.ConfigError`, or, given ``problems``, recorded there (and the
    defaults returned)."""
    file = paths.config_dir() / "schedules.toml"
    if problems is not None:
        return problems.load(file, HostScheduleConfig, fix=SCHEDULES_FIX) or HostScheduleConfig()
    return load_file(file, HostScheduleConfig, fix=SCHEDULES_FIX) or HostScheduleConfig()
