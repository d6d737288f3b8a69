"""cairnd's replies of the run views, typed (the :class:`~cairn.protocol.replies.Reply`
models of the other ops are in :mod:`cairn.protocol.replies`): ``diff`` (built by its
handler through :class:`DiffReply`), ``logs`` (through :class:`LogsReply`), a run's
``doctor`` (:class:`DoctorReply`, read only: cairnd leaves out a run's ``applied`` when
the live project was not checked) and ``show`` (:class:`ShowReply`, read only). Read by
the CLI with ``typed`` in :mod:`cairn.cli.client`; a key a newer cairnd adds is ignored."""

from __future__ import annotations

from typing import Literal

from cairn.protocol.replies import PathReason, Reply, SettlementSummary, StorageState
from cairn.protocol.settlement_record import AppliedPaths


class DiffReply(Reply):
    """``diff``: how the run's settlement ended (``status``: ``not settled`` without one),
    what went into C (``accepted``) and what did not (``refused`` by policy, ``ignored`` by
    a profile's ``settle_ignore``), what reached the live project (``apply``, the
    settlement record's, a key that holds nothing left out; None: not settled) and the
    unified diff of the accepted paths."""

    run_id: str
    status: str
    summary: SettlementSummary | None
    accepted: list[str]
    refused: list[PathReason]
    ignored: list[str]
    apply: AppliedPaths | None
    diff: str


class LogsReply(Reply):
    """``logs``: what the run's units logged, as journalctl formats it, the ``cursor`` of
    the last entry (None: none shown) and whether the run has ended (``finished``)."""

    run_id: str
    state: str
    finished: bool
    text: str
    cursor: str | None


class HostCheckView(Reply):
    """One fact about the host as cairnd saw it (:class:`cairn.hostcheck.HostCheck`)."""

    check: str
    status: Literal["ok", "warn", "fail"]
    detail: str
    fix: str = ""


class AppliedCounts(Reply):
    """How many paths the run applied the live project holds as applied, as before the
    run (reverted), or neither (changed since)."""

    as_applied: int
    reverted: int
    changed: int


class RunDoctor(Reply):
    """One run's cross-checks: its ``problems``, ``warnings`` and ``notes`` (neither of
    which is a problem), and ``applied`` when the live project was checked."""

    run_id: str
    state: str
    problems: list[str]
    warnings: list[str]
    notes: list[str]
    applied: AppliedCounts | None = None


class DoctorReply(Reply):
    """``doctor``: with a run, only its cross-checks (``host`` empty); without, the host's
    checks cairnd can see, the ``credentials`` the CLI looks for as root, and every run the
    caller may see. ``problems`` counts run problems and failed host checks."""

    host: list[HostCheckView]
    credentials: dict[str, str]
    runs: list[RunDoctor]
    problems: int


class ShowReply(Reply):
    """``show`` (:func:`cairn.views.run.run_view`), read only: cairnd sends more keys
    (``events``, ``schedule``, …) and each facet whole, as JSON. Only the keys the CLI reads
    are typed here, and of those only the summary and the storage state inside."""

    run: dict[str, object]
    operations: list[dict[str, object]]
    units: list[str]
    storage: StorageState
    settlement: dict[str, object] | None
    settlement_summary: SettlementSummary | None
    replayed_from: dict[str, object] | None
    replay_through: str | None = None
    worklists: list[dict[str, object]]
    experiments: list[dict[str, object]]
    model: dict[str, object] | None
    question: dict[str, object] | None
    divergence: dict[str, object] | None
    integrity: dict[str, object]
    latest_event: dict[str, object] | None
    events_shown: str
    progress: dict[str, dict[str, object]]
