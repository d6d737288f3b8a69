"""The coordinator: holds the run lease and replays the workflow against the journal.

Every ``flow.*`` call the control worker makes is answered from the journal when it was
committed before, and otherwise carried out through intents for the broker. An agent
operation commits only after FINISH → QUIESCE → SNAPSHOT → MATERIALIZE.

Recovery (ARCHITECTURE §5) is not a separate mode: a restarted coordinator replays from
the start and each operation continues from the state the journal recorded for it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from cairn import journald, paths
from cairn.brokerclient import call_broker
from cairn.coordinator import interactions
from cairn.coordinator.agentsock import AgentSocket
from cairn.coordinator.relay import ModelRelay, TokenBudget
from cairn.errors import (
    BrokerRefused,
    CairnError,
    LeaseLost,
    Nondeterminism,
    SystemdError,
    Unavailable,
)
from cairn.failpoints import failpoint
from cairn.journal import Journal, OpRow
from cairn.models import (
    AgentInstruction,
    AgentMessage,
    Boundary,
    CallRequest,
    CallResult,
    Intent,
    LaunchDescription,
    Receipt,
    StartWorkflow,
    Verb,
    WorkflowFailure,
    WorkflowReturn,
    canonical_json,
    sha256_hex,
)
from cairn.proc import make_env
from cairn.systemd import Systemd
from cairn.unitprops import agent_unit_name
from cairn.workflow import RUNTIME_API_VERSION
from cairn.workflow.review import Review, review_source
from cairn.workflow.schema import build_models

log = logging.getLogger(__name__)

LEASE_TTL = 60.0
HEARTBEAT = 15.0
MAX_ATTEMPTS = 3
EXIT_RESTART = 75  # systemd restarts the unit (Restart=on-failure) and recovery resumes


class RunBlocked(CairnError):
    """The run cannot go on without a person's decision (an uncertain effect)."""

    code = "blocked"


class _RestartReplay(Exception):
    """Always-replay test mode: tear the control worker down after a commit."""


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


def lease_holder() -> str:
    """``host:boot:pid`` of this coordinator process."""
    return f"{socket.gethostname()}:{boot_id()}:{os.getpid()}"


def holder_is_dead(run_id: str, holder: str) -> bool:
    """A lease holder on this host that is gone: from an earlier boot, or a process that
    no longer exists or is no longer this run's coordinator."""
    host, _, rest = holder.partition(":")
    boot, _, pid = rest.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if boot != boot_id():
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"cairn.coordinator" not in cmdline or run_id.encode() not in cmdline


class Coordinator:
    """Run one workflow run to a terminal state (or until it must wait)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.journal = Journal(paths.journal_path())
        self.desc: LaunchDescription = self.journal.launch_description(run_id)
        self.review: dict[str, Any] = self.desc.review
        self.models = build_models(Review.model_validate(self.review).models)
        self.holder = lease_holder()
        self.token = 0
        self.state_dir = paths.run_state_dir(run_id)
        self._stop_heartbeat = threading.Event()
        self.w_generation = 1
        self.always_replay = os.environ.get("CAIRN_ALWAYS_REPLAY") == "1"
        self.budget = TokenBudget(self.desc.limits.model_tokens, used=self.tokens_used())
        self.usage: dict[str, dict[str, int]] = {}

    def tokens_used(self) -> int:
        """Model tokens the run's committed boundaries reported (survives restarts)."""
        used = 0
        for op in self.journal.list_ops(self.run_id):
            if op.state == "committed" and op.result is not None:
                used += int(op.result.get("usage", {}).get("total_tokens", 0))
        return used

    # --- lease ----------------------------------------------------------------------

    def _heartbeat(self) -> None:
        journal = Journal(paths.journal_path())
        try:
            while not self._stop_heartbeat.wait(HEARTBEAT):
                try:
                    journal.renew_lease(self.run_id, self.token, ttl=LEASE_TTL)
                except LeaseLost:
                    log.error("lease for %s lost; exiting without writing", self.run_id)
                    os._exit(EXIT_RESTART)
        finally:
            journal.close()

    # --- main -----------------------------------------------------------------------

    def run(self) -> int:
        run = self.journal.get_run(self.run_id)
        if run.state in ("succeeded", "failed", "cancelled", "blocked"):
            log.info("run %s is %s; nothing to do", self.run_id, run.state)
            return 0
        self.token = self.journal.acquire_lease(
            self.run_id,
            self.holder,
            ttl=LEASE_TTL,
            holder_is_dead=lambda holder: holder_is_dead(self.run_id, holder),
        )
        threading.Thread(target=self._heartbeat, daemon=True).start()
        self.event("coordinator-started", token=self.token)
        try:
            self.check_pinned_source()
            self.journal.set_run_state(self.run_id, "running", token=self.token)
            self.prepare_storage()
            self.verify_storage()
            output = self.replay()
            settlement = self.settle() if self.needs_settlement() else None
            self.finish_run(output, settlement)
            return 0
        except (Unavailable, SystemdError) as exc:
            log.error("run %s: %s; exiting so systemd restarts recovery", self.run_id, exc)
            return EXIT_RESTART
        except RunBlocked as exc:
            log.error("run %s blocked: %s", self.run_id, exc)
            self.journal.set_run_state(self.run_id, "blocked", token=self.token, error=str(exc))
            return 0
        except interactions.RunSuspended as exc:  # waits for a person, or paused/stopped
            log.info("run %s: %s", self.run_id, exc)
            return interactions.suspend(self, exc)
        except LeaseLost:
            raise
        except CairnError as exc:
            log.error("run %s failed: %s", self.run_id, exc)
            self.journal.set_run_state(self.run_id, "failed", token=self.token, error=str(exc))
            return 0
        finally:
            self._stop_heartbeat.set()
            try:
                self.journal.release_lease(self.run_id, self.token)
            except LeaseLost:
                pass

    def finish_run(self, output: dict[str, Any], settlement: dict[str, Any] | None) -> None:
        if settlement is not None and settlement["status"] == "conflict":
            conflicts = [c["path"] for c in settlement["apply"]["conflicts"]]
            self.journal.set_run_state(
                self.run_id,
                "failed",
                token=self.token,
                output=output,
                error=f"proposal not applied: {len(conflicts)} path(s) changed in the "
                f"live project meanwhile: {', '.join(conflicts[:5])}",
            )
        else:
            self.journal.set_run_state(self.run_id, "succeeded", token=self.token, output=output)

    def check_pinned_source(self) -> None:
        """A run resumes only on the exact reviewed source and runtime it was launched with."""
        current = review_source(self.desc.source, filename=self.desc.source_filename)
        if current.review_hash != self.desc.review_hash:
            raise CairnError(
                f"the pinned source of {self.run_id} no longer reviews to its launch hash "
                f"({current.review_hash} != {self.desc.review_hash})"
            )
        if self.review.get("api_version") != RUNTIME_API_VERSION:
            raise RunBlocked(
                f"run was launched for {self.review.get('api_version')}; this host runs "
                f"{RUNTIME_API_VERSION}",
                hint="replay it into a new run, or upgrade it once that is supported",
            )

    def event(self, name: str, *, op_id: str | None = None, **data: Any) -> None:
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

    # --- storage and broker ---------------------------------------------------------

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

    def intent(self, kind: str, intent_id: str, **fields: Any) -> Intent:
        return Intent(intent_id=intent_id, run_id=self.run_id, kind=kind, **fields)  # type: ignore[arg-type]

    def prepare_storage(self) -> None:
        """Q and the first W, plus whatever storage intents a crash left pending."""
        self.broker(
            "storage-v1",
            [
                self.intent("prepare-q", "prepare-q"),
                self.intent("create-w", "create-w.root.1", scope="root", generation=1),
            ],
        )
        generations = [
            i.generation
            for i in self.journal.intents(self.run_id, "storage-v1")
            if i.kind == "create-w" and i.scope == "root"
        ]
        self.w_generation = max(generations)

    def verify_storage(self) -> None:
        """Before continuing, the broker checks the run's subvolumes against its receipts;
        a missing or foreign snapshot blocks the run instead of being papered over."""
        (report,) = self.broker(
            "storage-v1", [self.intent("verify-storage", f"verify-storage.{self.token}")]
        )
        problems = report.data["problems"]
        if problems:
            raise RunBlocked(
                f"storage integrity: {'; '.join(problems[:3])}",
                hint=f"see 'cairn doctor {self.run_id}'",
            )

    # --- replay ---------------------------------------------------------------------

    def replay(self) -> dict[str, Any]:
        """Re-execute the workflow in a control worker until it returns."""
        while True:
            try:
                return self.replay_once()
            except _RestartReplay:
                self.event("always-replay-restart")

    def replay_once(self) -> dict[str, Any]:
        start = StartWorkflow(
            source=self.desc.source, filename=self.desc.source_filename, args=self.desc.args
        )
        worker = subprocess.Popen(
            [sys.executable, "-I", "-m", "cairn.workflow.runtime"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=make_env({"PYTHONHASHSEED": "0"}),
            text=True,
            close_fds=True,
            preexec_fn=_limit_control_worker,
        )
        assert worker.stdin is not None and worker.stdout is not None
        try:
            worker.stdin.write(start.model_dump_json() + "\n")
            worker.stdin.flush()
            predecessor: str | None = None
            while True:
                line = worker.stdout.readline()
                if not line:
                    raise CairnError(
                        f"the control worker exited unexpectedly (status {worker.wait()})"
                    )
                message = json.loads(line)
                if message.get("type") == "return":
                    output = WorkflowReturn.model_validate(message).output
                    self.models[self.review["workflow"]["output"]].model_validate(output)
                    return output
                if message.get("type") == "failure":
                    failure = WorkflowFailure.model_validate(message)
                    raise CairnError(f"workflow raised {failure.kind}: {failure.error}")
                call = CallRequest.model_validate(message)
                value, predecessor, fresh = self.answer(call, predecessor)
                if fresh and self.always_replay:
                    raise _RestartReplay
                worker.stdin.write(CallResult(seq=call.seq, value=value).model_dump_json() + "\n")
                worker.stdin.flush()
        finally:
            if worker.poll() is None:
                worker.kill()
            worker.wait()

    def check_manifest(self, call: CallRequest) -> dict[str, Any]:
        """The call must be one the review listed: same kind, descriptor and line."""
        _file, line, col = call.location.rsplit(":", 2)
        descriptor = call.request.get("descriptor")
        for site in self.review["calls"]:
            if (
                site["kind"] == call.kind
                and site["line"] == int(line)
                and site.get("descriptor") == descriptor
            ):
                return dict(site)
        raise Nondeterminism(
            f"call {call.kind} at line {line}:{col} is not in the reviewed manifest"
        )

    def answer(
        self, call: CallRequest, predecessor: str | None
    ) -> tuple[dict[str, Any], str, bool]:
        """The call's result, its op ID, and whether it was committed just now."""
        interactions.at_safe_point(self)
        self.check_manifest(call)
        op_id = f"{call.scope}-{call.seq}"
        op = self.journal.get_op(self.run_id, call.scope, call.seq)
        if op is None:
            op = self.journal.record_requested(
                call, run_id=self.run_id, op_id=op_id, predecessor=predecessor, token=self.token
            )
        else:
            self.check_identity(op, call, predecessor)
        if op.state == "committed":
            assert op.result is not None
            return op.result, op_id, False
        if call.kind == "ask":
            return interactions.ask(self, op, call), op_id, True
        if call.kind != "agent":
            raise CairnError(f"flow.{call.kind} is not supported by this version of cairn")
        return self.run_agent(op, call), op_id, True

    def check_identity(self, op: OpRow, call: CallRequest, predecessor: str | None) -> None:
        mismatches = [
            (name, stored, live)
            for name, stored, live in (
                ("kind", op.kind, call.kind),
                ("request_hash", op.request_hash, call.request_hash()),
                ("source_location", op.source_location, call.location),
                ("predecessor", op.predecessor, predecessor),
            )
            if stored != live
        ]
        if mismatches:
            self.journal.append_event(
                self.run_id,
                "replay-diverged",
                {
                    "journal": {
                        "kind": op.kind,
                        "request": op.request,
                        "location": op.source_location,
                        "predecessor": op.predecessor,
                    },
                    "replay": {
                        "kind": call.kind,
                        "request": call.request,
                        "location": call.location,
                        "predecessor": predecessor,
                    },
                    "fields": [m[0] for m in mismatches],
                },
                op.scope,
                op.op_id,
            )
            detail = "; ".join(f"{n}: journal {s!r} vs replay {v!r}" for n, s, v in mismatches)
            raise Nondeterminism(f"replay diverged at {op.op_id}: {detail}")

    # --- one agent operation ----------------------------------------------------------

    def run_agent(self, op: OpRow, call: CallRequest) -> dict[str, Any]:
        """Drive one agent operation from whatever state the journal holds to committed."""
        agent = self.review["agents"][call.request["descriptor"]]
        output_model = self.models[agent["output"]]
        while True:
            op = self.journal.get_op_by_id(self.run_id, op.op_id)
            if op.state == "uncertain":
                raise RunBlocked(
                    f"{op.op_id} may have had effects outside the sandbox and no result",
                    hint=f"decide with 'cairn reconcile {self.run_id} {op.op_id}'",
                )
            if op.state == "retry":  # a person decided the uncertain attempt may be redone
                self.clean_retry(op, "retry decided by a person")
                continue
            if op.state == "requested":
                interactions.authorize(self, op, call, agent)
                self.start_attempt(op, call, agent, output_model)
                continue
            if op.state == "started":
                finish = self.collect_finish(op, call, agent, output_model)
                if finish is None:
                    continue  # a clean retry was recorded; start the next attempt
                return self.complete_boundary(op, call, finish)
            assert op.state == "settled" and op.result is not None
            self.journal.update_op(self.run_id, op.op_id, token=self.token, state="committed")
            return op.result

    def instruction(
        self, op: OpRow, call: CallRequest, agent: dict[str, Any], output_model: type[BaseModel]
    ) -> AgentInstruction:
        profile = self.desc.profiles.get(agent["profile"])
        if profile is None:
            raise CairnError(f"profile {agent['profile']} was not resolved at launch")
        return AgentInstruction(
            run_id=self.run_id,
            op_id=op.op_id,
            attempt=op.attempt,
            prompt=call.request["prompt"],
            title=call.request.get("title") or call.request["descriptor"],
            descriptor=call.request["descriptor"],
            output_schema=output_model.model_json_schema(),
            profile=profile,
        )

    def start_attempt(
        self, op: OpRow, call: CallRequest, agent: dict[str, Any], output_model: type[BaseModel]
    ) -> None:
        """Save the intent (with the move to ``started``), then have the broker act on it."""
        instruction = self.instruction(op, call, agent, output_model)
        incoming = self.write_evidence(op, instruction)
        outputs = self.outputs_dir(op.op_id, op.attempt)
        if outputs.exists():
            shutil.rmtree(outputs)
        outputs.mkdir(parents=True)
        os.chmod(outputs, 0o777)  # the owner's agent writes here; runs/ itself is 0750
        start = self.intent(
            "start-agent",
            f"start-agent.{op.op_id}.{op.attempt}",
            scope=op.scope,
            op_id=op.op_id,
            attempt=op.attempt,
            generation=self.w_generation,
        )
        self.journal.update_op(
            self.run_id, op.op_id, token=self.token, state="started", intents=[start]
        )
        self.failpoint("after-intent-saved")
        self.event("agent-started", op_id=op.op_id, attempt=op.attempt, incoming=incoming)

    def collect_finish(
        self, op: OpRow, call: CallRequest, agent: dict[str, Any], output_model: type[BaseModel]
    ) -> AgentMessage | None:
        """FINISH: the agent's validated finish message, from the journal, the socket (a
        live or reattached agent) or its result file. None after recording a clean retry."""
        if op.finish is not None:
            return AgentMessage.model_validate(op.finish)
        instruction = self.instruction(op, call, agent, output_model)
        unit = agent_unit_name(self.run_id, op.op_id, op.attempt)
        sock = AgentSocket(
            paths.agent_socket_path(self.run_id, op.op_id),
            owner_uid=self.desc.owner_uid,
            instruction=instruction,
            output_model=output_model,
            on_note=lambda text: self.event("agent-note", op_id=op.op_id, text=text),
        )
        relay = self.start_relay(op, agent)
        try:
            # Idempotent: starts the unit if the intent is still pending, else returns the
            # receipt (and the broker adopts a unit it started before a crash).
            self.broker("launch-v1", [], queued=True)
            self.failpoint("after-unit-started")
            ended = self.wait_agent(unit, sock)
        finally:
            sock.close()
            if relay is not None:
                relay.close()
                self.usage[op.op_id] = relay.usage
        finish = sock.finish or self.read_result_file(op, output_model)
        if finish is None and self.budget.exhausted:
            raise CairnError(
                f"the run's model token budget ({self.desc.limits.model_tokens}) is spent",
                hint="launch again with a larger limits.model_tokens",
            )
        if finish is None:
            return self.retry_or_block(op, agent, ended)
        self.journal.update_op(
            self.run_id,
            op.op_id,
            token=self.token,
            finish=finish.model_dump(mode="json"),
            event="op-finished",
            event_data={"attempt": op.attempt, "via": "socket" if sock.finish else "file"},
        )
        self.failpoint("after-finish-received")
        return finish

    def start_relay(self, op: OpRow, agent: dict[str, Any]) -> ModelRelay | None:
        """The model relay for an agent whose profile names a provider; the broker binds
        its socket into the unit. The provider credential stays on this side."""
        profile = self.desc.profiles[agent["profile"]]
        provider = getattr(profile, "provider", None)
        if not provider:
            return None
        route = self.desc.routes.get(provider)
        if route is None:
            raise CairnError(f"provider {provider} was not resolved at launch")
        relay = ModelRelay(
            paths.model_socket_path(self.run_id, op.op_id),
            route=route,
            owner_uid=self.desc.owner_uid,
            transcript=self.transcript_path(op.op_id, op.attempt),
            budget=self.budget,
        )
        relay.start()
        return relay

    def transcript_path(self, op_id: str, attempt: int) -> Path:
        return self.state_dir / "ops" / op_id / f"transcript.{attempt}.jsonl"

    def read_result_file(self, op: OpRow, output_model: type[BaseModel]) -> AgentMessage | None:
        path = self.outputs_dir(op.op_id, op.attempt) / "finish.json"
        try:
            data = json.loads(path.read_text())
            message = AgentMessage(
                type="finish_work", output=data["output"], handoff=str(data.get("handoff", ""))
            )
            output_model.model_validate(message.output)
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            return None
        self.event("result-file-used", op_id=op.op_id, attempt=op.attempt)
        return message

    def retry_or_block(self, op: OpRow, agent: dict[str, Any], ended: str) -> None:
        """The unit is gone with no result: retry cleanly when nothing could have left the
        sandbox, otherwise stop for a person's decision."""
        if agent["network"] != "none":
            self.journal.update_op(
                self.run_id,
                op.op_id,
                token=self.token,
                state="uncertain",
                error=f"attempt {op.attempt} ended without a result ({ended})",
            )
            raise RunBlocked(
                f"{op.op_id} ended without a result and may have reached outside ({ended})",
                hint=f"decide with 'cairn reconcile {self.run_id} {op.op_id}'",
            )
        if op.attempt >= MAX_ATTEMPTS:
            raise CairnError(
                f"agent {op.op_id} ended without finish_work in {op.attempt} attempts "
                f"(last: {ended})",
                hint=f"see 'cairn logs {self.run_id}'",
            )
        self.clean_retry(op, ended)
        return None

    def clean_retry(self, op: OpRow, reason: str) -> None:
        """Record the next attempt on a fresh W restored from the predecessor's checkpoint
        (or Q); the failed attempt's W generation is deleted."""
        restored = self.w_generation + 1
        self.broker(
            "storage-v1",
            [
                self.intent(
                    "create-w",
                    f"create-w.{op.scope}.{restored}",
                    scope=op.scope,
                    generation=restored,
                    from_checkpoint=op.predecessor,
                ),
                self.intent(
                    "drop-w",
                    f"drop-w.{op.scope}.{self.w_generation}",
                    scope=op.scope,
                    generation=self.w_generation,
                ),
            ],
        )
        self.w_generation = restored
        self.journal.update_op(
            self.run_id,
            op.op_id,
            token=self.token,
            state="requested",
            attempt=op.attempt + 1,
            event="op-retry",
            event_data={"failed_attempt": op.attempt, "ended": reason, "w_generation": restored},
        )
        self.event("clean-retry", op_id=op.op_id, attempt=op.attempt + 1)

    def complete_boundary(
        self, op: OpRow, call: CallRequest, finish: AgentMessage
    ) -> dict[str, Any]:
        """QUIESCE → SNAPSHOT → MATERIALIZE → settle → COMMIT."""
        unit = agent_unit_name(self.run_id, op.op_id, op.attempt)
        with Systemd() as sd:
            self.wait_gone(sd, unit)
        self.failpoint("after-quiesce")
        (checkpoint,) = self.broker(
            "storage-v1",
            [
                self.intent(
                    "checkpoint",
                    f"checkpoint.{op.op_id}",
                    scope=op.scope,
                    op_id=op.op_id,
                    generation=self.w_generation,
                )
            ],
        )
        self.failpoint("after-snapshot")
        starts = [
            r
            for r in self.journal.receipts(self.run_id)
            if r["intent_id"] == f"start-agent.{op.op_id}.{op.attempt}"
        ]
        boundary = self.materialize(
            op, call, finish, starts[0]["data"] if starts else {}, checkpoint
        )
        self.failpoint("after-materialize")
        result = {"output": finish.output, "handoff": finish.handoff, "op_id": op.op_id}
        self.journal.update_op(
            self.run_id,
            op.op_id,
            token=self.token,
            state="settled",
            result=result,
            checkpoint=checkpoint.data,
        )
        self.failpoint("after-settle")
        self.journal.update_op(self.run_id, op.op_id, token=self.token, state="committed")
        self.event("boundary-committed", op_id=op.op_id, boundary=str(boundary))
        self.failpoint("after-commit")
        return result

    def wait_agent(self, unit: str, sock: AgentSocket) -> str:
        """Wait until the agent delivered its finish or its unit is gone; say how it ended."""
        with Systemd() as sd:
            deadline = time.monotonic() + self.desc.limits.runtime_max_sec + 120
            while time.monotonic() < deadline:
                state = sd.unit_state(unit)
                if sock.finished.is_set():
                    return "finished"
                if state is None or state.active_state in ("inactive", "failed"):
                    # the worker may have written its result just before exiting
                    sock.finished.wait(0.5)
                    return "gone" if state is None else f"{state.active_state}/{state.result}"
                sock.finished.wait(0.5)
        raise CairnError(f"agent unit {unit} did not stop in time")

    def wait_gone(self, sd: Systemd, unit: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = sd.unit_state(unit)
            if state is None or state.active_state in ("inactive", "failed"):
                return
            time.sleep(0.2)
        raise CairnError(f"agent unit {unit} did not exit after finish_work")

    def outputs_dir(self, op_id: str, attempt: int) -> Path:
        return self.state_dir / "ops" / op_id / f"outputs.{attempt}"

    def write_evidence(self, op: OpRow, instruction: AgentInstruction) -> list[str]:
        """Lay out /evidence for the agent: current instruction plus earlier boundaries.

        Everything is world-readable inside a directory only the ``cairn`` user can reach;
        the agent sees it through its read-only bind. Each incoming boundary gets an empty
        ``workspace/`` that the broker's bind of its checkpoint S covers.
        """
        evidence = self.state_dir / "ops" / op.op_id / "evidence"
        current = evidence / "current"
        _mkdirs(current / "notes")
        _write_public(current / "instruction.md", instruction.prompt + "\n")
        _write_public(current / "invocation.json", instruction.model_dump_json(indent=2))
        committed = [o for o in self.journal.list_ops(self.run_id) if o.state == "committed"]
        incoming = []
        for earlier in committed:
            src = self.state_dir / "boundaries" / earlier.op_id
            dst = evidence / "incoming" / earlier.op_id
            _mkdirs(dst / "workspace")
            for name in ("boundary.json", "handoff.md", "result.json", "transcript.jsonl"):
                if (src / name).exists():
                    _write_public(dst / name, (src / name).read_text())
            incoming.append(earlier.op_id)
        index = {"run": self.run_id, "op": op.op_id, "incoming": incoming}
        _write_public(evidence / "index.json", json.dumps(index, indent=2))
        return incoming

    def materialize(
        self,
        op: OpRow,
        call: CallRequest,
        finish: AgentMessage,
        start: dict[str, Any],
        checkpoint: Receipt,
    ) -> Path:
        finish_json = canonical_json(finish.model_dump(mode="json"))
        notes_file = self.state_dir / "ops" / op.op_id / "evidence" / "current" / "notes"
        boundary = Boundary(
            run_id=self.run_id,
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
            unit=start.get("unit", ""),
            invocation_id=start.get("invocation_id", ""),
            checkpoint=checkpoint.data,
            predecessor=op.predecessor,
            usage=self.usage.get(op.op_id, {}),
        )
        out = self.state_dir / "boundaries" / op.op_id
        out.mkdir(parents=True, exist_ok=True)
        transcript = self.transcript_path(op.op_id, op.attempt)
        if transcript.exists():
            _write_durably(out / "transcript.jsonl", transcript.read_text())
        _write_durably(out / "boundary.json", boundary.model_dump_json(indent=2))
        _write_durably(out / "handoff.md", boundary.handoff + "\n")
        _write_durably(out / "result.json", json.dumps(boundary.output, indent=2))
        return out / "boundary.json"

    # --- settlement -----------------------------------------------------------------

    def needs_settlement(self) -> bool:
        return any(a["access"] == "write" for a in self.review["agents"].values())

    def settle(self) -> dict[str, Any]:
        """P → changes → C → F → live, each step a broker receipt."""
        freeze, candidate = self.broker(
            "storage-v1",
            [
                self.intent("freeze-proposal", "freeze-proposal", generation=self.w_generation),
                self.intent("settle-candidate", "settle-candidate"),
            ],
        )
        report = candidate.data
        settlement: dict[str, Any] = {"candidate": report}
        if not report["accepted"]:
            settlement["status"] = "noop" if report.get("inventories_equal") else "refused"
            settlement["apply"] = {"applied": [], "already_applied": [], "conflicts": []}
        else:
            applied = self.apply_proposal()
            settlement["apply"] = applied.data["result"]
            settlement["status"] = applied.data["result"]["status"]
        self.journal.set_settlement(self.run_id, settlement, token=self.token)
        self.event("settled", status=settlement["status"])
        return settlement

    def apply_proposal(self) -> Receipt:
        """Run the apply unit; an interrupted apply is simply run again (it resumes from
        its per-path receipts)."""
        intent = self.intent("start-apply", "start-apply.1")
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                (applied,) = self.broker("launch-v1", [intent], queued=attempt > 1)
                return applied
            except BrokerRefused as exc:
                if attempt == MAX_ATTEMPTS:
                    raise
                self.event("apply-retry", attempt=attempt + 1, reason=str(exc))
        raise AssertionError("unreachable")


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _mkdirs(path: Path) -> None:
    """Create ``path`` and missing parents, each world-readable (0755, umask aside)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir()
        os.chmod(directory, 0o755)


def _write_public(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o644)


def _limit_control_worker() -> None:
    """Runs in the control worker before exec: its own session and tight limits."""
    import resource

    os.setsid()
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
