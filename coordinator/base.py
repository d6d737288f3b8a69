"""What every concern of the coordinator shares: the run's state, its journal connection,
its events and failpoints, the broker's intents and the reviewed manifest of calls.

:class:`CoordinatorBase` declares the attributes :class:`cairn.coordinator.core.Coordinator`
sets up. Each concern is a mixin over it — :mod:`~cairn.coordinator.lease`,
:mod:`~cairn.coordinator.replay`, :mod:`~cairn.coordinator.lanes`,
:mod:`~cairn.coordinator.agentop`, :mod:`~cairn.coordinator.recovery`,
:mod:`~cairn.coordinator.experiments`, :mod:`~cairn.coordinator.restores`,
:mod:`~cairn.coordinator.settlement` — and ``Coordinator`` puts them together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import BaseModel

from cairn import journald, paths
from cairn.brokerclient import call_broker
from cairn.coordinator.budget import MoneyBudget, TokenBudget
from cairn.errors import CairnError
from cairn.failpoints import failpoint
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.operations import spec_of
from cairn.progress_relay import NoteGate, ProgressRelay, prepare_progress_dir
from cairn.protocol.broker import Intent, Receipt, Verb
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription
from cairn.protocol.progress import ProgressPhase
from cairn.providers import today

MAX_ATTEMPTS = 3  # of a settlement step; an agent's are its profile's agent_attempts
EXIT_RESTART = 75  # systemd restarts the unit (Restart=on-failure) and recovery resumes


class RunBlocked(CairnError):
    """The run cannot go on without a person's decision (an uncertain effect)."""

    code = "blocked"


class Nondeterminism(CairnError):
    """A replayed operation differs from the one in the journal."""

    code = "nondeterminism"


class OperationError(CairnError):
    """An operation failed for good (refused, or no result within its attempts): the
    workflow sees it as ``OperationFailed`` and may handle it, e.g. as a failed lane."""

    code = "operation-failed"


class CommandFailed(OperationError):
    """A command profile's CLI exited with a status another attempt would only repeat
    (:data:`cairn.protocol.agent.DETERMINISTIC_EXIT_STATUSES`)."""

    code = "command-failed"


class ReviewedAgent(TypedDict, total=False):
    """One agent of the reviewed manifest, as the launch description's JSON holds it
    (:class:`cairn.workflow.review.AgentEntry` dumped)."""

    profile: str
    access: Literal["read", "write"]
    network: str
    output: str
    allowlist: list[str]


class ReviewedSite(TypedDict, total=False):
    """One call site of the reviewed manifest, as the launch description's JSON holds it
    (:class:`cairn.workflow.review.CallSite` dumped)."""

    kind: str
    line: int
    col: int
    descriptor: str | None
    answer_schema: str | None
    capabilities: list[str]


class CoordinatorBase:
    """One run's coordinator: the state ``Coordinator.__init__`` sets up, and the plumbing
    every concern uses."""

    run_id: str
    desc: LaunchDescription
    review: dict[str, Any]
    models: dict[str, type[BaseModel]]
    holder: str
    token: int
    state_dir: Path
    w_gen: dict[str, int]
    agent_slots: threading.BoundedSemaphore
    always_replay: bool
    budget: TokenBudget
    money: MoneyBudget
    usage: dict[str, dict[str, int]]
    committed: dict[tuple[str, int], OpRow]
    sites: dict[tuple[str, int, str | None], ReviewedSite]
    _local: threading.local
    _stop_heartbeat: threading.Event
    _gen_lock: threading.Lock
    _cancel_lock: threading.Lock

    @property
    def journal(self) -> Journal:
        """This thread's journal connection (SQLite connections stay in their thread)."""
        journal: Journal | None = getattr(self._local, "journal", None)
        if journal is None:
            journal = self._local.journal = Journal(paths.journal_path())
        return journal

    def event(self, name: str, *, op_id: str | None = None, **data: object) -> None:
        """One structured journal entry for the run (``journalctl CAIRN_RUN=…``)."""
        detail = " ".join(f"{k}={v}" for k, v in data.items())
        journald.send(
            f"{self.run_id}: {name}"
            + (f" {op_id}" if op_id else "")
            + (f" {detail}" if detail else ""),
            CAIRN_RUN=self.run_id,
            CAIRN_EVENT=name,
            CAIRN_OP=op_id or "",
        )

    def failpoint(self, name: str) -> None:
        failpoint(name, self.state_dir)

    def broker(self, verb: Verb, intents: list[Intent], *, queued: bool = False) -> list[Receipt]:
        """Have the broker carry out the run's pending ``verb`` intents; return the receipts
        of ``intents`` in their order. ``queued``: they are already in the journal."""
        if intents and not queued:
            self.journal.add_intents(self.run_id, intents, token=self.token)
        reply = call_broker(verb, self.run_id)
        self.journal.record_receipts(
            self.run_id, [r.model_dump(mode="json") for r in reply.receipts]
        )
        by_id = {r.intent_id: r for r in reply.receipts}
        missing = [i.intent_id for i in intents if i.intent_id not in by_id]
        if missing:
            raise CairnError(f"broker gave no receipt for {', '.join(missing)}")
        return [by_id[i.intent_id] for i in intents]

    def intent(self, kind: str, intent_id: str, **fields: object) -> Intent:
        return Intent(intent_id=intent_id, run_id=self.run_id, kind=kind, **fields)  # type: ignore[arg-type]

    def check_manifest(self, call: CallRequest) -> ReviewedSite:
        """The call must be one the review listed: same kind, descriptor and line. The
        per-item markers of ``flow.unroll`` belong to its reviewed call site
        (:attr:`cairn.operations.OperationSpec.site_kinds`)."""
        _file, line, col = call.location.rsplit(":", 2)
        descriptor = call.request.get("descriptor")
        for kind in spec_of(call.kind).manifest_kinds:
            site = self.sites.get((kind, int(line), descriptor))
            if site is not None:
                return site.copy()
        raise Nondeterminism(
            f"call {call.kind} at line {line}:{col} is not in the reviewed manifest"
        )

    def outputs_dir(self, op_id: str, attempt: int) -> Path:
        return self.state_dir / "ops" / op_id / f"outputs.{attempt}"

    def progress_relay(self, phase: ProgressPhase) -> ProgressRelay:
        """A fresh progress directory for the phase's helper, relayed into the journal as
        ``progress`` events while the returned context is open."""
        directory = prepare_progress_dir(self.state_dir, phase)
        return ProgressRelay(
            directory,
            phase,
            self.desc.owner_uid,
            lambda data: self.journal.append_event(self.run_id, "progress", data),
        )

    def token_recorder(self, op_id: str, attempt: int) -> Callable[[int, int], None]:
        """Record model tokens and their cost as the relay spends them, for attempt
        ``attempt`` of ``op_id`` (a connection per call: the relay answers each call in its
        own thread)."""

        def record(tokens: int, cost_micros: int) -> None:
            with Journal(paths.journal_path()) as journal:
                journal.record_model_tokens(self.run_id, op_id, attempt, tokens,
                                            cost_micros=cost_micros, day=today())

        return record

    def spent_today(self) -> int:
        """What the run's owner has spent on model calls today, over all runs."""
        with Journal(paths.journal_path()) as journal:
            return journal.owner_cost_on(self.desc.owner_uid, today())

    def note_recorder(self, op_id: str) -> Callable[[str], str | None]:
        """Record an agent's notes as ``agent-note`` events (journal and journald), each
        cut to size and rate-limited; a dropped note is counted in the next one. The
        recorder returns the text recorded, None for a dropped note."""
        gate = NoteGate()

        def record(text: str) -> str | None:
            admitted = gate.admit(text)
            if admitted is None:
                return None
            self.event("agent-note", op_id=op_id, text=admitted)
            data = {"text": admitted, "dropped": gate.dropped}
            self.journal.append_event(self.run_id, "agent-note", data, op_id=op_id)
            return admitted

        return record
