"""The coordinator: holds the run lease and replays the workflow against the journal.

Every ``flow.*`` call the control worker makes is answered from the journal when it was
committed before, and otherwise carried out through intents for the broker. An agent
operation commits only after FINISH → QUIESCE → SNAPSHOT → MATERIALIZE.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cairn import journald, paths
from cairn.brokerclient import call_broker
from cairn.coordinator.agentsock import AgentSocket
from cairn.errors import CairnError, LeaseLost, Nondeterminism
from cairn.journal import Journal, OpRow
from cairn.models import (
    AgentInstruction,
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
from cairn.workflow.review import Review
from cairn.workflow.schema import build_models

log = logging.getLogger(__name__)

LEASE_TTL = 60.0
HEARTBEAT = 15.0


class Coordinator:
    """Run one workflow run to a terminal state (or until it must wait)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.journal = Journal(paths.journal_path())
        self.desc: LaunchDescription = self.journal.launch_description(run_id)
        self.review: dict[str, Any] = self.desc.review
        self.models = build_models(Review.model_validate(self.review).models)
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.token = 0
        self.state_dir = paths.run_state_dir(run_id)
        self._stop_heartbeat = threading.Event()
        self._w_generation = 1

    # --- lease ----------------------------------------------------------------------

    def _heartbeat(self) -> None:
        journal = Journal(paths.journal_path())
        try:
            while not self._stop_heartbeat.wait(HEARTBEAT):
                try:
                    journal.renew_lease(self.run_id, self.token, ttl=LEASE_TTL)
                except LeaseLost:
                    log.error("lease lost; stopping")
                    os._exit(75)
        finally:
            journal.close()

    # --- main -----------------------------------------------------------------------

    def run(self) -> int:
        run = self.journal.get_run(self.run_id)
        if run.state in ("succeeded", "failed", "cancelled"):
            log.info("run %s already %s", self.run_id, run.state)
            return 0
        self.token = self.journal.acquire_lease(self.run_id, self.holder, ttl=LEASE_TTL)
        threading.Thread(target=self._heartbeat, daemon=True).start()
        self.event("coordinator-started", token=self.token)
        try:
            self.journal.set_run_state(self.run_id, "running", token=self.token)
            self.prepare_storage()
            output = self.replay()
            settlement = self.settle() if self.needs_settlement() else None
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
                self.journal.set_run_state(
                    self.run_id, "succeeded", token=self.token, output=output
                )
            return 0
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
        self.broker(
            "storage-v1",
            [
                self.intent("prepare-q", "prepare-q"),
                self.intent("create-w", "create-w.root.1", scope="root", generation=1),
            ],
        )

    # --- replay ---------------------------------------------------------------------

    def replay(self) -> dict[str, Any]:
        """Re-execute the workflow in a control worker, answering each call."""
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
                value, predecessor = self.answer(call, predecessor)
                worker.stdin.write(CallResult(seq=call.seq, value=value).model_dump_json() + "\n")
                worker.stdin.flush()
        finally:
            if worker.poll() is None:
                worker.kill()
            worker.wait()

    def check_manifest(self, call: CallRequest) -> dict[str, Any]:
        """The call must be one the review listed: same kind, descriptor and location."""
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

    def answer(self, call: CallRequest, predecessor: str | None) -> tuple[dict[str, Any], str]:
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
            return op.result, op_id
        if call.kind != "agent":
            raise CairnError(f"flow.{call.kind} is not supported by this version of cairn")
        return self.run_agent(op, call), op_id

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
            detail = "; ".join(f"{n}: journal {s!r} vs replay {v!r}" for n, s, v in mismatches)
            raise Nondeterminism(f"replay diverged at {op.op_id}: {detail}")

    # --- one agent operation ----------------------------------------------------------

    def run_agent(self, op: OpRow, call: CallRequest) -> dict[str, Any]:
        agent = self.review["agents"][call.request["descriptor"]]
        profile = self.desc.profiles.get(agent["profile"])
        if profile is None:
            raise CairnError(f"profile {agent['profile']} was not resolved at launch")
        output_model = self.models[agent["output"]]
        attempt = op.attempt
        instruction = AgentInstruction(
            run_id=self.run_id,
            op_id=op.op_id,
            attempt=attempt,
            prompt=call.request["prompt"],
            title=call.request.get("title") or call.request["descriptor"],
            descriptor=call.request["descriptor"],
            output_schema=output_model.model_json_schema(),
            profile=profile,
        )
        incoming = self.write_evidence(op, instruction)
        sock = AgentSocket(
            paths.agent_socket_dir(self.run_id) / f"{op.op_id}.sock",
            owner_uid=self.desc.owner_uid,
            instruction=instruction,
            output_model=output_model,
            on_note=lambda text: self.event("agent-note", op_id=op.op_id, text=text),
        )
        try:
            start = self.intent(
                "start-agent",
                f"start-agent.{op.op_id}.{attempt}",
                scope=op.scope,
                op_id=op.op_id,
                attempt=attempt,
                generation=self._w_generation,
            )
            self.journal.update_op(
                self.run_id, op.op_id, token=self.token, state="started", intents=[start]
            )
            self.event("agent-started", op_id=op.op_id, incoming=incoming)
            (receipt,) = self.broker("launch-v1", [start], queued=True)
            unit = receipt.data["unit"]
            state = self.wait_agent(unit, sock)
        finally:
            sock.close()
        if sock.finish is None:
            raise CairnError(
                f"agent {op.op_id} ended without finish_work ({state})",
                hint=f"see 'journalctl -u {unit}'",
            )
        finish = sock.finish.model_dump(mode="json")
        self.journal.update_op(
            self.run_id, op.op_id, token=self.token, finish=finish, event="op-finished"
        )
        # SNAPSHOT: the broker re-checks that the unit is gone and its cgroup empty.
        (checkpoint,) = self.broker(
            "storage-v1",
            [
                self.intent(
                    "checkpoint",
                    f"checkpoint.{op.op_id}",
                    scope=op.scope,
                    op_id=op.op_id,
                    generation=self._w_generation,
                )
            ],
        )
        boundary = self.materialize(op, instruction, sock, receipt, checkpoint)
        result = {"output": sock.finish.output, "handoff": sock.finish.handoff, "op_id": op.op_id}
        self.journal.update_op(
            self.run_id,
            op.op_id,
            token=self.token,
            state="settled",
            result=result,
            checkpoint=checkpoint.data,
        )
        self.journal.update_op(self.run_id, op.op_id, token=self.token, state="committed")
        self.event("boundary-committed", op_id=op.op_id, boundary=str(boundary))
        return result

    def wait_agent(self, unit: str, sock: AgentSocket) -> str:
        """QUIESCE: wait until the agent's unit is inactive (finished or not)."""
        with Systemd() as sd:
            deadline = time.monotonic() + self.desc.limits.runtime_max_sec + 120
            while time.monotonic() < deadline:
                state = sd.unit_state(unit)
                if state is None or state.active_state in ("inactive", "failed"):
                    return "gone" if state is None else f"{state.active_state}/{state.result}"
                sock.finished.wait(0.5)
        raise CairnError(f"agent unit {unit} did not stop in time")

    def write_evidence(self, op: OpRow, instruction: AgentInstruction) -> list[str]:
        """Lay out /evidence for the agent: current instruction plus earlier boundaries."""
        evidence = self.state_dir / "ops" / op.op_id / "evidence"
        current = evidence / "current"
        (current / "notes").mkdir(parents=True, exist_ok=True)
        (current / "instruction.md").write_text(instruction.prompt + "\n")
        (current / "invocation.json").write_text(instruction.model_dump_json(indent=2))
        committed = [o for o in self.journal.list_ops(self.run_id) if o.state == "committed"]
        incoming = []
        for earlier in committed:
            src = self.state_dir / "boundaries" / earlier.op_id
            dst = evidence / "incoming" / earlier.op_id
            dst.mkdir(parents=True, exist_ok=True)
            for name in ("boundary.json", "handoff.md", "result.json"):
                if (src / name).exists():
                    (dst / name).write_bytes((src / name).read_bytes())
            incoming.append(earlier.op_id)
        index = {"run": self.run_id, "op": op.op_id, "incoming": incoming}
        (evidence / "index.json").write_text(json.dumps(index, indent=2))
        for path in [evidence, *evidence.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        return incoming

    def materialize(
        self,
        op: OpRow,
        instruction: AgentInstruction,
        sock: AgentSocket,
        start: Receipt,
        checkpoint: Receipt,
    ) -> Path:
        assert sock.finish is not None
        finish_json = canonical_json(sock.finish.model_dump(mode="json"))
        boundary = Boundary(
            run_id=self.run_id,
            op_id=op.op_id,
            scope=op.scope,
            attempt=op.attempt,
            descriptor=instruction.descriptor,
            instruction=instruction.prompt,
            invocation=json.loads(instruction.model_dump_json()),
            output=sock.finish.output,
            output_sha256=sha256_hex(canonical_json(sock.finish.output)),
            finish_sha256=sha256_hex(finish_json),
            handoff=sock.finish.handoff,
            notes=sock.notes,
            unit=start.data["unit"],
            invocation_id=start.data.get("invocation_id", ""),
            checkpoint=checkpoint.data,
            predecessor=op.predecessor,
        )
        out = self.state_dir / "boundaries" / op.op_id
        out.mkdir(parents=True, exist_ok=True)
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
                self.intent("freeze-proposal", "freeze-proposal", generation=self._w_generation),
                self.intent("settle-candidate", "settle-candidate"),
            ],
        )
        report = candidate.data
        settlement: dict[str, Any] = {"candidate": report}
        if not report["accepted"]:
            settlement["status"] = "noop" if report.get("inventories_equal") else "refused"
            settlement["apply"] = {"applied": [], "already_applied": [], "conflicts": []}
        else:
            (applied,) = self.broker("launch-v1", [self.intent("start-apply", "start-apply.1")])
            settlement["apply"] = applied.data["result"]
            settlement["status"] = applied.data["result"]["status"]
        self.journal.set_settlement(self.run_id, settlement, token=self.token)
        self.event("settled", status=settlement["status"])
        return settlement


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _limit_control_worker() -> None:
    """Runs in the control worker before exec: its own session and tight limits."""
    import resource

    os.setsid()
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
