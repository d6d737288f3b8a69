"""What the collaborators of one run's coordinator share, each piece with its own owner.

- :class:`RunContext`: the run (its launch description, reviewed manifest and models), the
  lease's fencing token, the calling thread's journal connection, events, failpoints and
  the per-run directories. Read by every collaborator; only the lease sets the token.
- :class:`BrokerClient`: the broker's intents, saved in the journal and carried out.
- :class:`WGenerations`: which W generation each scope is on.

:class:`cairn.coordinator.core.Coordinator` builds one of each and hands them to the
collaborators (lanes, agent operations, recovery, experiments, restores, settlement,
replay) that need them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from cairn import journald, paths
from cairn.brokerclient import call_broker
from cairn.coordinator.base import Nondeterminism, ReviewedSite
from cairn.errors import CairnError
from cairn.failpoints import failpoint
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow, OpState, StoredReceipt
from cairn.operations import spec_of
from cairn.progress_relay import NoteGate, ProgressRelay, prepare_progress_dir
from cairn.protocol.broker import Intent, Receipt, Verb
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONValue
from cairn.protocol.launch import LaunchDescription
from cairn.protocol.progress import ProgressPhase
from cairn.providers import today
from cairn.workflow.review import Review
from cairn.workflow.schema import build_models


class Broker(Protocol):
    """Carries out the run's pending ``verb`` intents; the receipts of ``intents`` in their
    order. ``queued``: they are already in the journal."""

    def __call__(
        self, verb: Verb, intents: list[Intent], *, queued: bool = False
    ) -> list[Receipt]: ...


class RunContext:
    """One run as its coordinator sees it. ``token`` is 0 until the lease is held."""

    def __init__(self, desc: LaunchDescription) -> None:
        """The run ``desc`` describes; its review is ``desc.review`` (an upgrade check
        passes a description with the new source's)."""
        self.run_id = desc.run_id
        self.desc = desc
        self.review = desc.review
        self.models: dict[str, type[BaseModel]] = build_models(
            Review.model_validate(self.review).models
        )
        self.state_dir = paths.run_state_dir(self.run_id)
        self.token = 0
        self._local = threading.local()
        self._sites: dict[tuple[str, int, str | None], ReviewedSite] = {}
        for site in self.review["calls"]:
            self._sites.setdefault((site["kind"], site["line"], site.get("descriptor")), site)
        self.broker: Broker = BrokerClient(self)

    @classmethod
    def load(cls, run_id: str) -> RunContext:
        """The run as the journal's launch description has it."""
        with Journal(paths.journal_path()) as journal:
            return cls(journal.launch_description(run_id))

    @property
    def journal(self) -> Journal:
        """This thread's journal connection (SQLite connections stay in their thread)."""
        journal: Journal | None = getattr(self._local, "journal", None)
        if journal is None:
            journal = self._local.journal = Journal(paths.journal_path())
        return journal

    def ops(self) -> list[OpRow]:
        """The run's operations, as the journal has them now."""
        return self.journal.list_ops(self.run_id)

    def op(self, op_id: str) -> OpRow:
        """One of the run's operations, as the journal has it now."""
        return self.journal.get_op_by_id(self.run_id, op_id)

    def receipts(self) -> list[StoredReceipt]:
        """The broker's receipts of the run so far."""
        return self.journal.receipts(self.run_id)

    def update_op(
        self,
        op_id: str,
        *,
        state: OpState | None = None,
        finish: Mapping[str, JSONValue] | None = None,
        result: Mapping[str, object] | None = None,
        checkpoint: Mapping[str, JSONValue] | None = None,
        error: str | None = None,
        attempt: int | None = None,
        intents: Sequence[Intent] = (),
        event: str | None = None,
        event_data: Mapping[str, object] | None = None,
    ) -> None:
        """Move one of the run's operations forward under the lease
        (:meth:`cairn.journal.operations.Operations.update_op`)."""
        self.journal.update_op(
            self.run_id, op_id, token=self.token, state=state, finish=finish, result=result,
            checkpoint=checkpoint, error=error, attempt=attempt, intents=intents, event=event,
            event_data=event_data,
        )

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

    def intent(self, kind: str, intent_id: str, **fields: object) -> Intent:
        return Intent(intent_id=intent_id, run_id=self.run_id, kind=kind, **fields)  # type: ignore[arg-type]

    def check_manifest(self, call: CallRequest) -> ReviewedSite:
        """The call must be one the review listed: same kind, descriptor and line. The
        per-item markers of ``flow.unroll`` belong to its reviewed call site
        (:attr:`cairn.operations.OperationSpec.site_kinds`)."""
        _file, line, col = call.location.rsplit(":", 2)
        descriptor = call.request.get("descriptor")
        for kind in spec_of(call.kind).manifest_kinds:
            site = self._sites.get((kind, int(line), descriptor))
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


class BrokerClient:
    """The run's side of the broker: intents saved in the journal under the lease, the
    broker asked to carry them out (with only the run ID), its receipts recorded."""

    def __init__(self, run: RunContext) -> None:
        self._run = run

    def __call__(
        self, verb: Verb, intents: list[Intent], *, queued: bool = False
    ) -> list[Receipt]:
        run = self._run
        if intents and not queued:
            run.journal.add_intents(run.run_id, intents, token=run.token)
        reply = call_broker(verb, run.run_id)
        run.journal.record_receipts(
            run.run_id, [r.model_dump(mode="json") for r in reply.receipts]
        )
        by_id = {r.intent_id: r for r in reply.receipts}
        missing = [i.intent_id for i in intents if i.intent_id not in by_id]
        if missing:
            raise CairnError(f"broker gave no receipt for {', '.join(missing)}")
        return [by_id[i.intent_id] for i in intents]


class WGenerations:
    """The W generation each scope is on: 1 for the root and every lane until a retry, a
    restore or a rejected experiment moves it on. Lanes add theirs from their own
    threads."""

    def __init__(self) -> None:
        self._generation: dict[str, int] = {"root": 1}
        self._lock = threading.Lock()

    def __getitem__(self, scope: str) -> int:
        return self._generation[scope]

    def move(self, scope: str, generation: int) -> None:
        """``scope``'s W is now ``generation``."""
        with self._lock:
            self._generation[scope] = generation

    def at_least(self, scope: str, generation: int) -> None:
        """``scope``'s W is ``generation`` or a later one (from a storage intent)."""
        with self._lock:
            self._generation[scope] = max(self._generation.get(scope, 0), generation)

    def add_lanes(self, fork_op: str, lanes: list[str]) -> None:
        """The lanes of ``fork_op`` start on their first W (unless they moved on)."""
        with self._lock:
            for key in lanes:
                self._generation.setdefault(f"{fork_op}-{key}", 1)
