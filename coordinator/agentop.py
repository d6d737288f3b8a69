"""One agent operation (ARCHITECTURE §8): budgets, the attempt's evidence and start intent,
FINISH from the agent's socket or its result file, waiting for the unit (stopped on a
cancel), then QUIESCE → SNAPSHOT → MATERIALIZE → COMMIT. An invalid result
(``result-invalid``) fails the operation at once when another attempt could not change it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from cairn import artifacts, paths, retention, untrusted
from cairn.artifacts import ARTIFACTS
from cairn.canonical import canonical_json, sha256_hex
from cairn.coordinator import interactions
from cairn.coordinator.agentsock import MESSAGE_LIMIT, AgentSocket
from cairn.coordinator.base import CommandFailed, OperationError, ReviewedAgent, RunBlocked
from cairn.coordinator.budget import MoneyBudget, TokenBudget
from cairn.coordinator.context import RunContext, WGenerations
from cairn.coordinator.lanes import Lanes
from cairn.coordinator.recovery import Recovery
from cairn.errors import CairnError, StorageError
from cairn.fsutil import mkdirs_public, write_atomic
from cairn.journal.rows import OpRow
from cairn.journal.writes import AGENT_TIME_EVENT
from cairn.operations import AGENT
from cairn.protocol.agent import (
    COMMAND_FAILED_FILE,
    COMMAND_FAILED_LIMIT,
    AgentInstruction,
    AgentMessage,
    Artifacts,
    Boundary,
    CommandFailure,
)
from cairn.protocol.broker import AgentStarted, AgentStopped, Checkpointed, Receipt
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONObject, json_int, json_object, json_str
from cairn.resultjson import ResultInvalid, parse
from cairn.systemd import Systemd, wait_unit_gone
from cairn.terminal import printable
from cairn.unitprops import agent_unit_name

log = logging.getLogger(__name__)

INVALID_FILE_LIMIT = 4096
FINISH_GRACE_SEC = 10.0
# How often a running agent's unit and the run's controls are looked at, and how many
# times the pool's free space is checked in between (cairn.retention.PoolWatch).
AGENT_POLL_SEC = 0.5
POOL_CHECKS_PER_POLL = 5

if TYPE_CHECKING:
    from cairn.coordinator.relay import ModelRelay


class BudgetExhausted(OperationError):
    """A run budget is spent; the operation did not run."""

    code = "budget-exhausted"


class NoChanges(OperationError):
    """A write agent asked to change the project (``require_changes=True``) changed
    nothing but file times."""

    code = "no-changes"


class AgentOperations:
    """Drive an agent operation from the state the journal holds to committed. Holds the
    run's budgets, the model usage of each operation this coordinator ran, and the slots
    that bound how many agents run at once."""

    def __init__(
        self,
        run: RunContext,
        w: WGenerations,
        lanes: Lanes,
        recovery: Recovery,
        *,
        budget: TokenBudget,
        money: MoneyBudget,
    ) -> None:
        self.run = run
        self.w = w
        self.lanes = lanes
        self.recovery = recovery
        self.budget = budget
        self.money = money
        self.usage: dict[str, dict[str, int]] = {}
        self.agent_slots = threading.BoundedSemaphore(run.desc.limits.max_concurrent_agents)
        self._cancel_lock = threading.Lock()

    def run_agent(self, op: OpRow, call: CallRequest) -> JSONObject:
        """Drive one agent operation from whatever state the journal holds to committed;
        at most ``max_concurrent_agents`` do so at once (queued ones wait, not started)."""
        with self.agent_slots:
            return self._run_agent(op, call)

    def _run_agent(self, op: OpRow, call: CallRequest) -> JSONObject:
        agent: ReviewedAgent = self.run.review["agents"][call.request["descriptor"]]
        output_model = self.run.models[agent["output"]]
        while True:
            op = self.run.op(op.op_id)
            if op.state in ("failed", "not-started"):
                # the same failure, of the same kind, as when it was first decided
                error = OperationError(f"{op.op_id} did not complete: {op.error}")
                default = "operation-failed" if op.state == "failed" else "refused"
                error.code = json_str((op.result or {}).get("kind", default))
                raise error
            if op.state == "uncertain":
                raise RunBlocked(
                    f"{op.op_id} may have had effects outside the sandbox and no result",
                    hint=f"decide with 'cairn reconcile {self.run.run_id} {op.op_id}'",
                )
            if op.state == "retry":  # a person decided the uncertain attempt may be redone
                self.recovery.clean_retry(op, "retry decided by a person")
                continue
            if op.state == "requested":
                if op.attempt == 1:
                    self.check_budget(op)
                interactions.authorize(self.run, op, call, agent)
                self.start_attempt(op, call, agent, output_model)
                continue
            if op.state == "started":
                finish = self.collect_finish(op, call, agent, output_model)
                if finish is None:
                    continue  # a clean retry was recorded; start the next attempt
                return self.complete_boundary(op, call, finish)
            assert op.state == "settled" and op.result is not None
            self.run.update_op(op.op_id, state="committed")
            return op.result

    def check_budget(self, op: OpRow) -> None:
        """Reserve the run's budgets before new work: an exhausted budget refuses the
        operation (the workflow sees OperationFailed of kind ``budget-exhausted``); a
        boundary already under way is never cut short."""
        limits = self.run.desc.limits
        others = [
            o for o in self.run.ops() if o.kind == AGENT and o.op_id != op.op_id
        ]
        started = sum(1 for o in others if o.state not in ("requested", "not-started"))
        seconds = self.run.journal.agent_seconds(self.run.run_id)  # every attempt, not only commits
        reason = None
        if started >= limits.max_agent_ops:
            reason = f"all {limits.max_agent_ops} agent operations are used"
        elif seconds >= limits.max_agent_seconds:
            reason = f"{seconds:.0f} s of {limits.max_agent_seconds} s agent time are used"
        elif self.budget.exhausted:
            reason = f"the {limits.model_tokens} model tokens are used"
        elif spent := self.money.spent():
            reason = spent.reason
        if reason is None:
            return
        self.run.update_op(op.op_id, state="not-started",
            error=f"budget exhausted: {reason}",
            result={"error": reason, "kind": BudgetExhausted.code},
            event="budget-exhausted",
            event_data={"reason": reason},
        )
        raise BudgetExhausted(f"{op.op_id} did not run: budget exhausted: {reason}")

    def instruction(
        self, op: OpRow, call: CallRequest, agent: ReviewedAgent, output_model: type[BaseModel]
    ) -> AgentInstruction:
        profile = self.run.desc.profiles.get(agent["profile"])
        if profile is None:
            raise CairnError(f"profile {agent['profile']} was not resolved at launch")
        return AgentInstruction(
            run_id=self.run.run_id,
            op_id=op.op_id,
            attempt=op.attempt,
            prompt=call.request["prompt"],
            title=call.request.get("title") or call.request["descriptor"],
            descriptor=call.request["descriptor"],
            output_schema=output_model.model_json_schema(),
            profile=profile,
        )

    def start_attempt(
        self, op: OpRow, call: CallRequest, agent: ReviewedAgent, output_model: type[BaseModel]
    ) -> None:
        """Save the intent (with the move to ``started``), then have the broker act on it."""
        instruction = self.instruction(op, call, agent, output_model)
        incoming = self.write_evidence(op, instruction)
        outputs = self.run.outputs_dir(op.op_id, op.attempt)
        for earlier in outputs.parent.glob("outputs.*"):  # only the last attempt's files stay
            _remove_tree(earlier)
        outputs.mkdir(parents=True, exist_ok=True)
        os.chmod(outputs, 0o777)  # noqa: S103  (the owner's agent writes here; runs/ is 0750)
        start = self.run.intent(
            "start-agent",
            f"start-agent.{op.op_id}.{op.attempt}",
            scope=op.scope,
            op_id=op.op_id,
            attempt=op.attempt,
            generation=self.w[op.scope],
        )
        self.run.update_op(op.op_id, state="started", intents=[start]
        )
        self.run.failpoint("after-intent-saved")
        self.run.event("agent-started", op_id=op.op_id, attempt=op.attempt, incoming=incoming)

    def collect_finish(
        self, op: OpRow, call: CallRequest, agent: ReviewedAgent, output_model: type[BaseModel]
    ) -> AgentMessage | None:
        """FINISH: the agent's validated finish message, from the journal, the socket (a
        live or reattached agent) or its result file. None after recording a clean retry."""
        if op.finish is not None:
            return AgentMessage.model_validate(op.finish)
        instruction = self.instruction(op, call, agent, output_model)
        unit = agent_unit_name(self.run.run_id, op.op_id, op.attempt)
        start_id = f"start-agent.{op.op_id}.{op.attempt}"
        (start,) = [
            i for i in self.run.journal.intents(self.run.run_id, "launch-v1")
            if i.intent_id == start_id
        ]
        # The relay first: the broker starts an agent only once its agent.sock exists, and
        # a sibling lane's launch-v1 may do so at any moment after that.
        relay = self.start_relay(op, agent)
        try:
            sock = AgentSocket(
                paths.agent_socket_path(self.run.run_id, op.op_id),
                owner_uid=self.run.desc.owner_uid,
                instruction=instruction,
                output_model=output_model,
                on_note=self.run.note_recorder(op.op_id),
            )
        except BaseException:
            if relay is not None:
                relay.close()
            raise
        try:
            # Idempotent: starts the unit if the intent is still pending, else returns the
            # receipt (and the broker adopts a unit it started before a crash).
            self.run.broker("launch-v1", [start], queued=True)
            self.run.failpoint("after-unit-started")
            ended = self.wait_agent(unit, sock)
        finally:
            self.record_agent_time(op)
            sock.close()
            if relay is not None:
                relay.close()
                self.usage[op.op_id] = relay.usage
        finish = sock.finish or self.read_result_file(op, output_model)
        if finish is None and self.budget.exhausted:
            raise CairnError(
                f"the run's model token budget ({self.run.desc.limits.model_tokens}) is spent",
                hint="launch again with a larger limits.model_tokens",
            )
        if finish is None and (spent := self.money.spent()):
            raise CairnError(spent.reason, hint=spent.hint)
        if finish is None:
            self.recovery.fail_if_limit_hit(op)
            if "cancel" in self.run.journal.pending_controls(self.run.run_id):
                # Another lane's cancel may have stopped this unit: record every lane
                # under the same lock before the run ends as cancelled.
                self.stop_for_cancel(sock)
            invalid = sock.refused or self.read_invalid_file(op)
            if invalid is not None:
                self.judge_invalid(op, agent, invalid)
                ended = f"result-invalid: {invalid.reason}"
            elif (failure := self.read_command_failure(op)) is not None:
                ended = printable(failure.describe())
                if failure.deterministic and agent["network"] == "none":
                    self.fail_deterministic(op, ended)
            self.recovery.retry_or_block(op, agent, ended)
            return None
        self.run.update_op(op.op_id, finish=finish.model_dump(mode="json"),
            event="op-finished",
            event_data={"attempt": op.attempt, "via": "socket" if sock.finish else "file"},
        )
        self.run.failpoint("after-finish-received")
        return finish

    def record_agent_time(self, op: OpRow) -> None:
        """Charge the attempt's time, from the broker's start receipt to now, to the run's
        agent time (``limits.max_agent_seconds``), however the attempt ended."""
        start_id = f"start-agent.{op.op_id}.{op.attempt}"
        starts = [r for r in self.run.receipts() if r["intent_id"] == start_id]
        if not starts:  # the broker never started it
            return
        seconds = round(max(0.0, time.time() - float(starts[0]["at"])), 3)
        self.run.journal.append_event(
            self.run.run_id, AGENT_TIME_EVENT, {"attempt": op.attempt, "seconds": seconds},
            scope=op.scope, op_id=op.op_id,
        )

    def start_relay(self, op: OpRow, agent: ReviewedAgent) -> ModelRelay | None:
        """The model relay for an agent whose profile names a provider; the broker binds
        its socket into the unit. The provider credential stays on this side."""
        profile = self.run.desc.profiles[agent["profile"]]
        provider = getattr(profile, "provider", None)
        if not provider:
            return None
        route = self.run.desc.routes.get(provider)
        if route is None:
            raise CairnError(f"provider {provider} was not resolved at launch")
        # Imported here: the relay's HTTP, TLS and server code is for runs that reach a model.
        from cairn.coordinator.relay import ModelRelay

        relay = ModelRelay(
            paths.model_socket_path(self.run.run_id, op.op_id),
            route=route,
            owner_uid=self.run.desc.owner_uid,
            transcript=self.transcript_path(op.op_id, op.attempt),
            budget=self.budget,
            egress=paths.egress_socket(self.run.run_id),
            on_spend=self.run.token_recorder(op.op_id, op.attempt),
            money=self.money,
        )
        relay.start()
        return relay

    def transcript_path(self, op_id: str, attempt: int) -> Path:
        return self.run.state_dir / "ops" / op_id / f"transcript.{attempt}.jsonl"

    def read_result_file(self, op: OpRow, output_model: type[BaseModel]) -> AgentMessage | None:
        outputs, owner = self.run.outputs_dir(op.op_id, op.attempt), self.run.desc.owner_uid
        try:  # the agent's file: refused if a link, a FIFO, another user's or oversized
            raw = untrusted.read_bytes(outputs, "finish.json", owner=owner, limit=MESSAGE_LIMIT)
            data = json_object(parse(raw, "finish.json", limit=MESSAGE_LIMIT))
            message = AgentMessage(
                type="finish_work", output=json_object(data["output"]),
                handoff=str(data.get("handoff", "")),
            )
            output_model.model_validate(message.output)
        except (untrusted.UntrustedFileError, ResultInvalid, KeyError, TypeError,
                ValidationError):
            return None
        self.run.event("result-file-used", op_id=op.op_id, attempt=op.attempt)
        return message

    def read_invalid_file(self, op: OpRow) -> ResultInvalid | None:
        """The reason the worker refused the attempt's result (``result-invalid.json``);
        the agent could have written it too, so it is read as untrusted and cut."""
        outputs, owner = self.run.outputs_dir(op.op_id, op.attempt), self.run.desc.owner_uid
        try:
            raw = untrusted.read_bytes(outputs, "result-invalid.json", owner=owner,
                                       limit=INVALID_FILE_LIMIT)
            data = json_object(
                parse(raw, "result-invalid.json", limit=INVALID_FILE_LIMIT, depth=2)
            )
            return ResultInvalid.from_reason(str(data["reason"]), sha256=str(data["sha256"]))
        except untrusted.UntrustedFileMissing:
            return None
        except (untrusted.UntrustedFileError, ResultInvalid, KeyError, TypeError):
            return ResultInvalid("file", "result-invalid.json is unreadable")

    def read_command_failure(self, op: OpRow) -> CommandFailure | None:
        """How the attempt's command-profile CLI failed (``command-failed.json``, written
        beside the agent, so read as untrusted: bounded, typed, never trusted beyond its
        words); None without one, or with one that does not read as one."""
        outputs, owner = self.run.outputs_dir(op.op_id, op.attempt), self.run.desc.owner_uid
        try:
            raw = untrusted.read_bytes(outputs, COMMAND_FAILED_FILE, owner=owner,
                                       limit=COMMAND_FAILED_LIMIT)
            return CommandFailure.model_validate(
                parse(raw, COMMAND_FAILED_FILE, limit=COMMAND_FAILED_LIMIT, depth=2)
            )
        except (untrusted.UntrustedFileError, ResultInvalid, ValidationError):
            return None

    def fail_deterministic(self, op: OpRow, ended: str) -> None:
        """Fail the operation at its first such attempt: the CLI exited with a status
        another attempt would only repeat (a usage or configuration error; see
        :data:`~cairn.protocol.agent.DETERMINISTIC_EXIT_STATUSES`)."""
        error = f"agent command {ended}"
        self.run.update_op(op.op_id, state="failed", error=error,
            result={"error": error, "kind": CommandFailed.code},
            event="op-command-failed", event_data={"attempt": op.attempt, "final": True},
        )
        raise CommandFailed(
            f"agent {op.op_id} {error}",
            hint="not retried: another attempt would exit the same; fix the profile's argv or "
            f"the CLI's configuration (its output: 'cairn logs {self.run.run_id}')",
        )

    def judge_invalid(self, op: OpRow, agent: ReviewedAgent, invalid: ResultInvalid) -> None:
        """Fail the operation for its invalid result when another attempt cannot change it:
        a scripted (deterministic) agent, the same bytes as the attempt before, or no
        attempt left. Otherwise record the refusal (and its fingerprint) and return."""
        profile = self.run.desc.profiles[agent["profile"]]
        earlier = json_object((op.result or {}).get("result_invalid") or {})
        repeated = (
            bool(invalid.sha256)
            and earlier.get("sha256") == invalid.sha256
            and json_int(earlier.get("attempt", op.attempt)) < op.attempt  # not this one, recorded
        )
        record = {"attempt": op.attempt, "reason": invalid.reason, "sha256": invalid.sha256}
        if profile.kind != "scripted" and not repeated and op.attempt < profile.agent_attempts:
            self.run.update_op(op.op_id, result={"result_invalid": record},
                event="op-result-invalid", event_data=record,
            )
            return
        why = ("a scripted agent answers the same" if profile.kind == "scripted" else
               "the same result as the attempt before" if repeated else
               "its only attempt is used" if op.attempt == 1 else
               f"all {op.attempt} attempts are used")
        error = f"result-invalid: {invalid.reason}"
        self.run.update_op(op.op_id, state="failed", error=error,
            result={"error": error, "kind": ResultInvalid.code},
            event="op-result-invalid", event_data={**record, "final": why},
        )
        failed = OperationError(
            f"agent {op.op_id} {error}",
            hint=f"not retried: {why}; fix what the agent writes "
            f"(see 'cairn logs {self.run.run_id}')",
        )
        failed.code = ResultInvalid.code
        raise failed

    def complete_boundary(
        self, op: OpRow, call: CallRequest, finish: AgentMessage
    ) -> JSONObject:
        """QUIESCE → SNAPSHOT → MATERIALIZE → settle → COMMIT."""
        self.quiesce(op)
        self.run.failpoint("after-quiesce")
        (checkpoint,) = self.run.broker(
            "storage-v1",
            [
                self.run.intent(
                    "checkpoint",
                    f"checkpoint.{op.op_id}",
                    scope=op.scope,
                    op_id=op.op_id,
                    generation=self.w[op.scope],
                )
            ],
        )
        self.run.failpoint("after-snapshot")
        if call.request.get("require_changes") and checkpoint.body(Checkpointed).changed is False:
            self.fail_unchanged(op, checkpoint)
        starts = [
            r
            for r in self.run.receipts()
            if r["intent_id"] == f"start-agent.{op.op_id}.{op.attempt}"
        ]
        boundary, published = self.materialize(
            op,
            call,
            finish,
            AgentStarted.model_validate(starts[0]["data"]) if starts else None,
            checkpoint,
        )
        self.run.failpoint("after-materialize")
        started_at = float(starts[0]["at"]) if starts else time.time()
        usage: JSONObject = {
            **self.usage.get(op.op_id, {}),
            "agent_seconds": round(time.time() - started_at, 3),
        }
        result: JSONObject = {
            "output": finish.output,
            "handoff": finish.handoff,
            "op_id": op.op_id,
            "usage": usage,
        }
        if published.files or published.refused_total:
            result["artifacts"] = published.model_dump(mode="json")
        self.run.update_op(op.op_id, state="settled",
            result=result,
            checkpoint=checkpoint.data,
        )
        self.run.failpoint("after-settle")
        self.run.update_op(op.op_id, state="committed")
        self.run.event("boundary-committed", op_id=op.op_id, boundary=str(boundary))
        self.run.failpoint("after-commit")
        return result

    def fail_unchanged(self, op: OpRow, checkpoint: Receipt) -> None:
        """Fail the operation of a write agent that was required to change the project
        and changed nothing (its checkpoint is recorded; nothing is retried: the same
        prompt on the same W would likely do the same)."""
        error = "it changed nothing in the project (the call requires changes)"
        self.run.update_op(op.op_id, state="failed", error=error,
            result={"error": error, "kind": NoChanges.code}, checkpoint=checkpoint.data,
            event="op-no-changes", event_data={"attempt": op.attempt},
        )
        raise NoChanges(
            f"agent {op.op_id} finished, but {error}",
            hint=f"see what it did with 'cairn logs {self.run.run_id}'; catch OperationFailed "
            "(kind 'no-changes') in the workflow to go on without its changes",
        )

    def wait_agent(self, unit: str, sock: AgentSocket) -> str:
        """Wait until the agent delivered its finish or its unit is gone; say how it ended.
        A cancel requested meanwhile stops the unit (through the broker)."""
        pool = retention.watch()
        with Systemd() as sd:
            deadline = time.monotonic() + self.run.desc.limits.runtime_max_sec + 120
            while time.monotonic() < deadline:
                state = sd.unit_state(unit)
                if sock.finished.is_set():
                    return "finished"
                if state is None or state.active_state in ("inactive", "failed"):
                    # the worker may have written its result just before exiting
                    sock.finished.wait(AGENT_POLL_SEC)
                    return "gone" if state is None else f"{state.active_state}/{state.result}"
                if "cancel" in self.run.journal.pending_controls(self.run.run_id):
                    return self.stop_for_cancel(sock)
                # the pool more often than the unit: an agent writing at disk speed is
                # past the reserve by what it writes until it is stopped
                for _ in range(POOL_CHECKS_PER_POLL):
                    try:
                        pool.check(f"agent {sock.instruction.op_id}")
                    except StorageError as full:
                        self.stop_for_pool_full(sock, full)
                    if sock.finished.wait(AGENT_POLL_SEC / POOL_CHECKS_PER_POLL):
                        break
        raise CairnError(f"agent unit {unit} did not stop in time")

    def stop_for_cancel(self, sock: AgentSocket) -> str:
        """Cancel while this lane's agent runs: stop every running agent of the run, then
        the run is cancelled (unless this lane's agent had finished meanwhile)."""
        self.stop_running_agents(
            finished_op=sock.instruction.op_id if sock.finished.is_set() else None
        )
        if sock.finished.is_set():
            return "finished"
        raise interactions.RunSuspended(
            f"{sock.instruction.op_id} stopped: cancel requested", state="cancelled"
        )

    def stop_for_pool_full(self, sock: AgentSocket, full: StorageError) -> None:
        """The pool fell below its reserve while this lane's agent wrote: stop the agent
        (through the broker), fail its operation with code ``storage`` and raise ``full``,
        which fails the run. Its committed checkpoints stay; nothing reaches the project."""
        op_id, attempt = sock.instruction.op_id, sock.instruction.attempt
        stop = self.run.intent(
            "stop-agent", f"stop-agent.{op_id}.{attempt}", op_id=op_id, attempt=attempt
        )
        self.run.broker("launch-v1", [stop])
        self.run.update_op(op_id, state="failed",
            error=full.message,
            result={"error": full.message, "kind": StorageError.code},
            event="op-pool-full",
            event_data={"attempt": attempt},
        )
        raise full

    def stop_running_agents(self, *, finished_op: str | None = None) -> None:
        """Stop every running agent of the run (all lanes), each recorded uncertain unless
        it had finished (``finished_op``, or a result file the broker found), its W kept as
        evidence. Lanes racing to a cancel take turns: the second finds nothing left
        running."""
        with self._cancel_lock:
            running = [
                o
                for o in self.run.ops()
                if o.kind == AGENT and o.state == "started" and o.finish is None
            ]
            stops = [
                self.run.intent(
                    "stop-agent",
                    f"stop-agent.{o.op_id}.{o.attempt}",
                    op_id=o.op_id,
                    attempt=o.attempt,
                )
                for o in running
            ]
            receipts = self.run.broker("launch-v1", stops) if stops else []
            for op, stopped in zip(running, receipts, strict=True):
                if op.op_id == finished_op:
                    continue
                if not stopped.body(AgentStopped).result_file:
                    self.run.update_op(op.op_id, state="uncertain",
                        error=f"attempt {op.attempt} stopped by a cancel",
                        event="op-cancelled",
                    )
                    self.lanes.keep_w_as_evidence(op, "cancelled")

    def quiesce(self, op: OpRow) -> None:
        """QUIESCE after the finish: the worker ends right after delivering it; a unit still
        running after :data:`FINISH_GRACE_SEC` (the agent sent ``finish_work`` itself and
        runs on) is stopped through the broker, which kills its cgroup."""
        unit = agent_unit_name(self.run.run_id, op.op_id, op.attempt)
        with Systemd() as sd:
            if self.wait_gone(sd, unit, FINISH_GRACE_SEC):
                return
        self.run.event("agent-stopped-after-finish", op_id=op.op_id, attempt=op.attempt)
        stop = self.run.intent(
            "stop-agent", f"stop-agent.{op.op_id}.{op.attempt}", op_id=op.op_id,
            attempt=op.attempt,
        )
        self.run.broker("launch-v1", [stop])
        with Systemd() as sd:
            if not self.wait_gone(sd, unit, 120):
                raise CairnError(f"agent unit {unit} did not exit after finish_work")

    def wait_gone(self, sd: Systemd, unit: str, timeout: float) -> bool:
        """Whether ``unit`` is inactive (or gone) within ``timeout`` seconds."""
        return wait_unit_gone(sd, unit, timeout)

    def write_evidence(self, op: OpRow, instruction: AgentInstruction) -> list[str]:
        """Lay out /evidence for the agent: current instruction plus earlier boundaries.

        Everything is world-readable inside a directory only the ``cairn`` user can reach;
        the agent sees it through its read-only bind. Each incoming boundary gets an empty
        ``workspace/`` that the broker's bind of its checkpoint S covers.
        """
        evidence = self.run.state_dir / "ops" / op.op_id / "evidence"
        current = evidence / "current"
        mkdirs_public(current / "notes")
        _write_public(current / "instruction.md", instruction.prompt + "\n")
        _write_public(current / "invocation.json", instruction.model_dump_json(indent=2))
        incoming = self.lanes.causal_incoming(op.scope, op.seq)
        for earlier in incoming:
            src = self.run.state_dir / "boundaries" / earlier
            dst = evidence / "incoming" / earlier
            mkdirs_public(dst / "workspace")
            for name in ("boundary.json", "handoff.md", "result.json", "transcript.jsonl"):
                if (src / name).exists():
                    _write_public(dst / name, (src / name).read_text())
            if (src / ARTIFACTS).is_dir():
                _share_tree(src / ARTIFACTS, dst / ARTIFACTS)
            ended = self.run.op(earlier)
            if ended.state != "committed":  # a failed lane's unfinished work
                _write_public(dst / "unfinished.md", (
                    f"Operation {earlier} did not finish ({ended.state}): "
                    f"{ended.error or 'no reason recorded'}\n"
                    "workspace/ is what it left in its W when it ended.\n"))
        index = {"run": self.run.run_id, "op": op.op_id, "incoming": incoming}
        _write_public(evidence / "index.json", json.dumps(index, indent=2))
        return incoming

    def collect_artifacts(self, op: OpRow, dest: Path) -> Artifacts:
        """What the attempt published in ``/outputs/artifacts``, copied into ``dest``
        (:func:`cairn.artifacts.collect`: the agent's files, read through the helper)."""
        return artifacts.collect(self.run.outputs_dir(op.op_id, op.attempt),
                                 owner=self.run.desc.owner_uid, dest=dest)

    def materialize(
        self,
        op: OpRow,
        call: CallRequest,
        finish: AgentMessage,
        start: AgentStarted | None,
        checkpoint: Receipt,
    ) -> tuple[Path, Artifacts]:
        """Write the boundary's files (``boundary.json``, handoff, result, transcript) and
        collect the agent's artifacts beside them; the path of ``boundary.json`` and what
        was collected."""
        out = self.run.state_dir / "boundaries" / op.op_id
        out.mkdir(parents=True, exist_ok=True)
        published = self.collect_artifacts(op, out / ARTIFACTS)
        finish_json = canonical_json(finish.model_dump(mode="json"))
        notes_file = self.run.state_dir / "ops" / op.op_id / "evidence" / "current" / "notes"
        boundary = Boundary(
            run_id=self.run.run_id,
            op_id=op.op_id,
            scope=op.scope,
            attempt=op.attempt,
            descriptor=call.request["descriptor"],
            instruction=call.request["prompt"],
            invocation=call.request,
            output=finish.output,
            output_sha256=sha256_hex(canonical_json(finish.output)),
            finish_sha256=sha256_hex(finish_json),
            handoff=finish.handoff,
            notes=sorted(p.name for p in notes_file.iterdir()) if notes_file.exists() else [],
            unit=start.unit if start else "",
            invocation_id=start.invocation_id if start else "",
            checkpoint=checkpoint.data,
            predecessor=op.predecessor,
            usage=self.usage.get(op.op_id, {}),
            artifacts=published,
        )
        transcript = self.transcript_path(op.op_id, op.attempt)
        if transcript.exists():
            write_atomic(out / "transcript.jsonl", transcript.read_text(), mode=0o644)
        write_atomic(out / "boundary.json", boundary.model_dump_json(indent=2), mode=0o644)
        write_atomic(out / "handoff.md", boundary.handoff + "\n", mode=0o644)
        write_atomic(out / "result.json", json.dumps(boundary.output, indent=2), mode=0o644)
        return out / "boundary.json", published


def _remove_tree(path: Path) -> None:
    """Remove an earlier attempt's outputs; what the agent made unremovable (a directory
    without write permission for us) stays, logged, rather than failing the run."""
    failed: list[str] = []

    def note(_fn: object, where: str, exc: BaseException) -> None:
        failed.append(f"{where}: {exc}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=note)
    else:
        shutil.rmtree(path, onerror=lambda fn, where, info: note(fn, where, info[1]))
    if failed:
        log.warning("left in %s: %s", path, "; ".join(failed[:3]))


def _share_tree(src: Path, dst: Path) -> None:
    """``dst`` as a tree of hard links to the files of ``src`` (collected artifacts, ours
    and read-only), directories world-readable: no copy however many agents read them."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=os.link)
    for directory in (dst, *(p for p in dst.rglob("*") if p.is_dir())):
        os.chmod(directory, 0o755)  # noqa: S103  (the agent reads them through its bind)


def _write_public(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o644)
