"""The coordinator: holds the run lease and replays the workflow against the journal.

Every ``flow.*`` call the control worker makes is answered from the journal when it was
committed before, and otherwise carried out through intents for the broker. An agent
operation commits only after FINISH → QUIESCE → SNAPSHOT → MATERIALIZE.

Recovery (ARCHITECTURE §5) is not a separate mode: a restarted coordinator replays from
the start and each operation continues from the state the journal recorded for it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ValidationError

from cairn import journald, paths, untrusted
from cairn.brokerclient import call_broker
from cairn.coordinator import interactions
from cairn.coordinator.agentsock import MESSAGE_LIMIT, AgentSocket
from cairn.coordinator.relay import ModelRelay, TokenBudget
from cairn.errors import (
    BrokerRefused,
    CairnError,
    LeaseLost,
    Nondeterminism,
    OperationError,
    SystemdError,
    Unavailable,
)
from cairn.failpoints import failpoint
from cairn.journal import LEASE_TTL, TERMINAL_RUN_STATES, Journal, OpRow
from cairn.models import (
    AgentInstruction,
    AgentMessage,
    Boundary,
    CallRequest,
    CallResult,
    Intent,
    JoinRequest,
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
from cairn.workflow import RUNTIME_API_VERSION, runtime
from cairn.workflow.review import Review, review_source
from cairn.workflow.schema import build_models

log = logging.getLogger(__name__)

FORK_KINDS = ("parallel", "map")
MARKER_KINDS = ("unroll", "item", "repeat_until")
HEARTBEAT = 15.0
MAX_ATTEMPTS = 3
EXIT_RESTART = 75  # systemd restarts the unit (Restart=on-failure) and recovery resumes


class BudgetExhausted(OperationError):
    """A run budget is spent; the operation did not run."""

    code = "budget-exhausted"


class RunBlocked(CairnError):
    """The run cannot go on without a person's decision (an uncertain effect)."""

    code = "blocked"


class _RestartReplay(Exception):
    """Always-replay test mode: tear the control worker down after a commit."""


UNKNOWN_BOOT = "unknown-boot"


def boot_id() -> str:
    """This boot's ID; unknown inside a sandbox without /proc/sys (ProcSubset=pid), in
    which case leases are judged by their process alone."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return UNKNOWN_BOOT


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
    if UNKNOWN_BOOT not in (boot, boot_id()) and boot != boot_id():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists; whose it is we may not see
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot tell: treat as alive, the lease expires on its own
    return b"cairn.coordinator" not in cmdline or run_id.encode() not in cmdline


def tokens_used(ops: list[OpRow]) -> int:
    """Model tokens the run's committed boundaries reported (survives restarts)."""
    used = 0
    for op in ops:
        if op.state == "committed" and op.result is not None:
            used += int(op.result.get("usage", {}).get("total_tokens", 0))
    return used


class Coordinator:
    """Run one workflow run to a terminal state (or until it must wait)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._local = threading.local()
        self.desc: LaunchDescription = self.journal.launch_description(run_id)
        self.review: dict[str, Any] = self.desc.review
        self.models = build_models(Review.model_validate(self.review).models)
        self.holder = lease_holder()
        self.token = 0
        self.state_dir = paths.run_state_dir(run_id)
        self._stop_heartbeat = threading.Event()
        self.w_gen: dict[str, int] = {"root": 1}
        self._gen_lock = threading.Lock()
        self._cancel_lock = threading.Lock()
        self.agent_slots = threading.BoundedSemaphore(self.desc.limits.max_concurrent_agents)
        self.always_replay = os.environ.get("CAIRN_ALWAYS_REPLAY") == "1"
        ops = self.journal.list_ops(run_id)
        self.budget = TokenBudget(self.desc.limits.model_tokens, used=tokens_used(ops))
        self.usage: dict[str, dict[str, int]] = {}
        # Operations committed before this coordinator started: replay answers them from
        # memory, in the reader thread, without a journal round trip or a thread each.
        self.committed = {(op.scope, op.seq): op for op in ops if op.state == "committed"}
        self.sites: dict[tuple[str, int, Any], dict[str, Any]] = {}
        for site in self.review["calls"]:
            self.sites.setdefault((site["kind"], site["line"], site.get("descriptor")), site)

    @property
    def journal(self) -> Journal:
        """This thread's journal connection (SQLite connections stay in their thread)."""
        journal: Journal | None = getattr(self._local, "journal", None)
        if journal is None:
            journal = self._local.journal = Journal(paths.journal_path())
        return journal

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
        if run.state in (*TERMINAL_RUN_STATES, "blocked"):
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
            return int(interactions.suspend(self, exc))
        except LeaseLost:
            raise
        except CairnError as exc:
            log.error("run %s failed: %s", self.run_id, exc)
            self.journal.set_run_state(self.run_id, "failed", token=self.token, error=str(exc))
            return 0
        finally:
            self._stop_heartbeat.set()
            self.remove_channels_if_ended()
            try:
                self.journal.release_lease(self.run_id, self.token)
            except LeaseLost:
                pass

    def remove_channels_if_ended(self) -> None:
        """A run that ended has no agent left: its socket directory goes. (Not before:
        a running agent's bound channel directory must survive a coordinator restart.)"""
        if self.journal.get_run(self.run_id).state in TERMINAL_RUN_STATES:
            shutil.rmtree(paths.agent_socket_dir(self.run_id), ignore_errors=True)

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
        for intent in self.journal.intents(self.run_id, "storage-v1"):
            if intent.kind == "create-w":
                self.w_gen[intent.scope] = max(self.w_gen.get(intent.scope, 0), intent.generation)
            if intent.kind == "fork":
                for key in intent.lanes:
                    self.w_gen.setdefault(f"{intent.op_id}-{key}", 1)

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
        """One control worker from the start. Calls are answered concurrently (lanes run
        at the same time); answers go back in whatever order they complete.

        Results of calls committed before this coordinator started (no effect, so no safe
        point) go to the worker with its start message; it still reports each call, and
        the thread reading the worker checks it against the journal before anything later
        is dispatched. A recovered run reaches its frontier without a round trip per
        operation. Everything else goes to this thread's loop.
        """
        given = [
            CallResult(scope=op.scope, seq=op.seq, value=op.result)
            for op in self.committed.values()
            if op.kind not in FORK_KINDS and op.result is not None
        ]
        preloaded = {(a.scope, a.seq) for a in given}
        start = StartWorkflow(
            source=self.desc.source,
            filename=self.desc.source_filename,
            args=self.desc.args,
            answers=given,
        )
        worker = runtime.spawn(make_env())
        assert worker.stdin is not None and worker.stdout is not None
        stdin = worker.stdin
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        last_in_scope: dict[str, str | None] = {}
        lock = threading.Lock()  # the worker's stdin and last_in_scope

        def reply(scope: str, seq: int, op_id: str, value: dict[str, Any] | None) -> None:
            """Record the scope's latest operation; send ``value`` unless the worker was
            given it at the start."""
            with lock:
                last_in_scope[scope] = op_id
                if value is not None:
                    stdin.write(CallResult(scope=scope, seq=seq, value=value).model_dump_json())
                    stdin.write("\n")
                    stdin.flush()

        def read_worker(stream: IO[str]) -> None:
            try:
                for line in stream:
                    message = json.loads(line)
                    if message.get("type") == "call":
                        call = CallRequest.model_validate(message)
                        done = self.committed.get((call.scope, call.seq))
                        with lock:
                            predecessor = last_in_scope.get(call.scope)
                        if done is None:
                            events.put(("call", (call, predecessor)))
                            continue
                        self.check_manifest(call)
                        self.check_identity(done, call, predecessor)
                        assert done.result is not None
                        given_at_start = (call.scope, call.seq) in preloaded
                        reply(
                            call.scope,
                            call.seq,
                            done.op_id,
                            None if given_at_start else done.result,
                        )
                    else:
                        events.put(("message", message))
                events.put(("eof", None))
            except BaseException as exc:  # noqa: BLE001 - handed to the main loop
                events.put(("error", exc))

        threading.Thread(target=read_worker, args=(worker.stdout,), daemon=True).start()
        try:
            with lock:
                stdin.write(start.model_dump_json() + "\n")
                stdin.flush()
            while True:
                kind, item = events.get()
                if kind == "eof":
                    raise CairnError(
                        f"the control worker exited unexpectedly (status {worker.wait()})"
                    )
                if kind == "error":
                    raise item
                if kind == "answered":
                    call, value, fresh = item
                    if fresh and self.always_replay:
                        raise _RestartReplay
                    reply(call.scope, call.seq, f"{call.scope}-{call.seq}", value)
                    continue
                if kind == "call":
                    call, predecessor = item
                    self.dispatch(events, call, functools.partial(self.answer, call, predecessor))
                    continue
                message = item
                if message.get("type") == "return":
                    output = WorkflowReturn.model_validate(message).output
                    self.models[self.review["workflow"]["output"]].model_validate(output)
                    return output
                if message.get("type") == "failure":
                    failure = WorkflowFailure.model_validate(message)
                    raise CairnError(f"workflow raised {failure.kind}: {failure.error}")
                if message.get("type") == "join":
                    join = JoinRequest.model_validate(message)
                    self.dispatch(events, join, functools.partial(self.join, join))
                    continue
                raise CairnError(f"the control worker sent an unknown message: {message!r}")
        finally:
            if worker.poll() is None:
                worker.kill()
            worker.wait()

    def dispatch(
        self,
        events: queue.Queue[tuple[str, Any]],
        call: CallRequest | JoinRequest,
        work: Callable[[], tuple[dict[str, Any], str, bool]],
    ) -> None:
        """Answer one call in its own thread; an operation's failure goes back to the
        workflow as an exception, anything else stops the coordinator."""

        def answer() -> None:
            try:
                value, _op_id, fresh = work()
            except OperationError as exc:
                value, fresh = {"error": str(exc), "kind": exc.code}, True
            except BaseException as exc:  # noqa: BLE001 - handed to the main loop
                events.put(("error", exc))
                return
            events.put(("answered", (call, value, fresh)))

        threading.Thread(target=answer, name=f"op-{call.scope}-{call.seq}", daemon=True).start()

    def check_manifest(self, call: CallRequest) -> dict[str, Any]:
        """The call must be one the review listed: same kind, descriptor and line. The
        per-item markers of ``flow.unroll`` belong to its reviewed call site."""
        _file, line, col = call.location.rsplit(":", 2)
        descriptor = call.request.get("descriptor")
        kinds = ("item", "unroll") if call.kind == "item" else (call.kind,)
        for kind in kinds:
            site = self.sites.get((kind, int(line), descriptor))
            if site is not None:
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
        if call.kind in FORK_KINDS:
            return self.fork(op, call), op_id, False
        if call.kind in MARKER_KINDS:  # no effect: recorded so views and replay see it
            result = {"marked": call.kind}
            self.journal.update_op(
                self.run_id, op_id, token=self.token, state="committed", result=result
            )
            return result, op_id, False
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

    # --- lanes ----------------------------------------------------------------------

    def fork(self, op: OpRow, call: CallRequest) -> dict[str, Any]:
        """FORK: checkpoint the parent's W; every lane gets a writable W of that checkpoint.
        The operation stays ``started`` until the join commits it."""
        lanes = list(call.request["lanes"])
        intent = self.intent(
            "fork",
            f"fork.{op.op_id}",
            scope=op.scope,
            op_id=op.op_id,
            generation=self.w_gen[op.scope],
            lanes=lanes,
        )
        if op.state == "requested":
            self.journal.update_op(
                self.run_id,
                op.op_id,
                token=self.token,
                state="started",
                intents=[intent],
                event="fork",
                event_data={"lanes": lanes},
            )
        if op.state in ("requested", "started"):
            self.broker("storage-v1", [intent], queued=True)
        with self._gen_lock:
            for key in lanes:
                self.w_gen.setdefault(f"{op.op_id}-{key}", 1)
        return {"forked": True, "lanes": lanes}

    def join(self, join: JoinRequest) -> tuple[dict[str, Any], str, bool]:
        """JOIN: record every lane's outcome and final checkpoint; the parent's W is left
        as it was (lanes are evidence, never merged)."""
        op_id = f"{join.scope}-{join.seq}"
        op = self.journal.get_op_by_id(self.run_id, op_id)
        live = {k: (v["outcome"], v.get("last_op")) for k, v in join.outcomes.items()}
        if op.state == "committed":
            assert op.result is not None
            stored = {k: (v["outcome"], v.get("last_op")) for k, v in op.result["outcomes"].items()}
            if stored != live:
                raise Nondeterminism(
                    f"lanes of {op_id} ended differently on replay: "
                    f"journal {stored} vs replay {live}"
                )
            return op.result, op_id, False
        ops = self.journal.list_ops(self.run_id)
        outcomes: dict[str, dict[str, Any]] = {}
        for key, outcome in join.outcomes.items():
            lane = f"{op_id}-{key}"
            boundaries = [
                o for o in ops if o.scope == lane and o.kind == "agent" and o.state == "committed"
            ]
            last = max(boundaries, key=lambda o: o.seq) if boundaries else None
            outcomes[key] = {
                **outcome,
                "scope": lane,
                "boundary": last.op_id if last else None,
                "checkpoint": (last.checkpoint or {}).get("s", {}).get("path") if last else None,
            }
        result = {"joined": True, "outcomes": outcomes, "order": list(join.outcomes)}
        self.journal.update_op(
            self.run_id,
            op_id,
            token=self.token,
            state="settled",
            result=result,
            event="join",
            event_data={k: v["outcome"] for k, v in outcomes.items()},
        )
        self.journal.update_op(self.run_id, op_id, token=self.token, state="committed")
        return result, op_id, True

    def causal_incoming(self, scope: str, seq: int) -> list[str]:
        """The boundaries an operation may see: earlier ones of its own scope and of the
        scopes it was forked from (up to the fork), and the final boundaries of lanes
        joined before it. Never a sibling lane's."""
        ops = self.journal.list_ops(self.run_id)
        parents = {
            f"{o.op_id}-{key}": (o.scope, o.seq)
            for o in ops
            if o.kind in FORK_KINDS
            for key in o.request.get("lanes", [])
        }
        chain = [(scope, seq)]
        while chain[-1][0] in parents:
            chain.append(parents[chain[-1][0]])
        incoming: list[str] = []
        for chain_scope, limit in reversed(chain):
            for o in sorted(
                (o for o in ops if o.scope == chain_scope and o.seq < limit), key=lambda o: o.seq
            ):
                if o.state != "committed":
                    continue
                if o.kind == "agent":
                    incoming.append(o.op_id)
                elif o.kind in FORK_KINDS and o.result:
                    incoming += [
                        v["boundary"] for v in o.result["outcomes"].values() if v.get("boundary")
                    ]
        return incoming

    # --- one agent operation ----------------------------------------------------------

    def run_agent(self, op: OpRow, call: CallRequest) -> dict[str, Any]:
        """Drive one agent operation from whatever state the journal holds to committed;
        at most ``max_concurrent_agents`` do so at once (queued ones wait, not started)."""
        with self.agent_slots:
            return self._run_agent(op, call)

    def _run_agent(self, op: OpRow, call: CallRequest) -> dict[str, Any]:
        agent = self.review["agents"][call.request["descriptor"]]
        output_model = self.models[agent["output"]]
        while True:
            op = self.journal.get_op_by_id(self.run_id, op.op_id)
            if op.state in ("failed", "not-started"):
                # the same failure, of the same kind, as when it was first decided
                error = OperationError(f"{op.op_id} did not complete: {op.error}")
                default = "operation-failed" if op.state == "failed" else "refused"
                error.code = (op.result or {}).get("kind", default)
                raise error
            if op.state == "uncertain":
                raise RunBlocked(
                    f"{op.op_id} may have had effects outside the sandbox and no result",
                    hint=f"decide with 'cairn reconcile {self.run_id} {op.op_id}'",
                )
            if op.state == "retry":  # a person decided the uncertain attempt may be redone
                self.clean_retry(op, "retry decided by a person")
                continue
            if op.state == "requested":
                if op.attempt == 1:
                    self.check_budget(op)
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

    def check_budget(self, op: OpRow) -> None:
        """Reserve the run's budgets before new work: an exhausted budget refuses the
        operation (the workflow sees OperationFailed of kind ``budget-exhausted``); a
        boundary already under way is never cut short."""
        limits = self.desc.limits
        others = [
            o
            for o in self.journal.list_ops(self.run_id)
            if o.kind == "agent" and o.op_id != op.op_id
        ]
        started = sum(1 for o in others if o.state not in ("requested", "not-started"))
        seconds = sum(
            float((o.result or {}).get("usage", {}).get("agent_seconds", 0)) for o in others
        )
        reason = None
        if started >= limits.max_agent_ops:
            reason = f"all {limits.max_agent_ops} agent operations are used"
        elif seconds >= limits.max_agent_seconds:
            reason = f"{seconds:.0f} s of {limits.max_agent_seconds} s agent time are used"
        elif self.budget.exhausted:
            reason = f"the {limits.model_tokens} model tokens are used"
        if reason is None:
            return
        self.journal.update_op(
            self.run_id,
            op.op_id,
            token=self.token,
            state="not-started",
            error=f"budget exhausted: {reason}",
            result={"error": reason, "kind": BudgetExhausted.code},
            event="budget-exhausted",
            event_data={"reason": reason},
        )
        raise BudgetExhausted(f"{op.op_id} did not run: budget exhausted: {reason}")

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
            generation=self.w_gen[op.scope],
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
        start_id = f"start-agent.{op.op_id}.{op.attempt}"
        (start,) = [
            i for i in self.journal.intents(self.run_id, "launch-v1") if i.intent_id == start_id
        ]
        # The relay first: the broker starts an agent only once its agent.sock exists, and
        # a sibling lane's launch-v1 may do so at any moment after that.
        relay = self.start_relay(op, agent)
        try:
            sock = AgentSocket(
                paths.agent_socket_path(self.run_id, op.op_id),
                owner_uid=self.desc.owner_uid,
                instruction=instruction,
                output_model=output_model,
                on_note=lambda text: self.event("agent-note", op_id=op.op_id, text=text),
            )
        except BaseException:
            if relay is not None:
                relay.close()
            raise
        try:
            # Idempotent: starts the unit if the intent is still pending, else returns the
            # receipt (and the broker adopts a unit it started before a crash).
            self.broker("launch-v1", [start], queued=True)
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
            self.fail_if_limit_hit(op)
            self.retry_or_block(op, agent, ended)
            return None
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
            egress=paths.egress_socket(self.run_id),
        )
        relay.start()
        return relay

    def transcript_path(self, op_id: str, attempt: int) -> Path:
        return self.state_dir / "ops" / op_id / f"transcript.{attempt}.jsonl"

    def read_result_file(self, op: OpRow, output_model: type[BaseModel]) -> AgentMessage | None:
        outputs, owner = self.outputs_dir(op.op_id, op.attempt), self.desc.owner_uid
        try:  # the agent's file: refused if a link, a FIFO, another user's or oversized
            data = untrusted.read_json(outputs, "finish.json", owner=owner, limit=MESSAGE_LIMIT)
            message = AgentMessage(
                type="finish_work", output=data["output"], handoff=str(data.get("handoff", ""))
            )
            output_model.model_validate(message.output)
        except (untrusted.UntrustedFileError, KeyError, TypeError, ValidationError):
            return None
        self.event("result-file-used", op_id=op.op_id, attempt=op.attempt)
        return message

    def fail_if_limit_hit(self, op: OpRow) -> None:
        """An agent killed by one of its limits fails for good, naming the limit: running
        it again would hit the same wall."""
        out, owner = self.outputs_dir(op.op_id, op.attempt), self.desc.owner_uid
        try:  # written by the unit's ExecStopPost, as the run owner
            result = untrusted.read_text(out, "service-result", owner=owner, limit=99).split()[0]
        except (untrusted.UntrustedFileError, IndexError):
            return
        limits = self.desc.limits
        reason = {
            "oom-kill": f"it was killed by the OOM killer: it exceeded MemoryMax="
            f"{limits.memory_max} bytes",
            "timeout": f"it ran longer than RuntimeMaxSec={limits.runtime_max_sec}",
        }.get(result)
        if reason is None:
            return
        self.journal.update_op(
            self.run_id,
            op.op_id,
            token=self.token,
            state="failed",
            error=reason,
            event="op-limit",
            event_data={"result": result},
        )
        raise OperationError(
            f"agent {op.op_id} {reason}",
            hint=f"raise the limit with 'cairn launch --limit …' or see 'cairn logs {self.run_id}'",
        )

    def retry_or_block(self, op: OpRow, agent: dict[str, Any], ended: str) -> None:
        """The unit is gone with no result: retry cleanly when nothing could have left the
        sandbox, otherwise stop for a person's decision. Under a cancel, nothing is
        retried."""
        if "cancel" in self.journal.pending_controls(self.run_id):
            raise interactions.RunSuspended(
                f"{op.op_id} stopped: cancel requested", state="cancelled"
            )
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
            self.journal.update_op(
                self.run_id,
                op.op_id,
                token=self.token,
                state="failed",
                error=f"no finish_work in {op.attempt} attempts ({ended})",
            )
            raise OperationError(
                f"agent {op.op_id} ended without finish_work in {op.attempt} attempts "
                f"(last: {ended})",
                hint=f"see 'cairn logs {self.run_id}'",
            )
        self.clean_retry(op, ended)
        return None

    def clean_retry(self, op: OpRow, reason: str) -> None:
        """Record the next attempt on a fresh W restored from the predecessor's checkpoint
        (or Q); the failed attempt's W generation is deleted."""
        current = self.w_gen[op.scope]
        restored = current + 1
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
                    f"drop-w.{op.scope}.{current}",
                    scope=op.scope,
                    generation=current,
                ),
            ],
        )
        self.w_gen[op.scope] = restored
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
                    generation=self.w_gen[op.scope],
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
        started_at = float(starts[0]["at"]) if starts else time.time()
        usage = {
            **self.usage.get(op.op_id, {}),
            "agent_seconds": round(time.time() - started_at, 3),
        }
        result = {
            "output": finish.output,
            "handoff": finish.handoff,
            "op_id": op.op_id,
            "usage": usage,
        }
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
        """Wait until the agent delivered its finish or its unit is gone; say how it ended.
        A cancel requested meanwhile stops the unit (through the broker)."""
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
                if "cancel" in self.journal.pending_controls(self.run_id):
                    return self.stop_for_cancel(sock)
                sock.finished.wait(0.5)
        raise CairnError(f"agent unit {unit} did not stop in time")

    def stop_for_cancel(self, sock: AgentSocket) -> str:
        """Cancel: stop every running agent of the run (all lanes), each recorded
        uncertain unless it had finished; then the run is cancelled."""
        with self._cancel_lock:
            running = [
                o
                for o in self.journal.list_ops(self.run_id)
                if o.kind == "agent" and o.state == "started" and o.finish is None
            ]
            stops = [
                self.intent(
                    "stop-agent",
                    f"stop-agent.{o.op_id}.{o.attempt}",
                    op_id=o.op_id,
                    attempt=o.attempt,
                )
                for o in running
            ]
            receipts = self.broker("launch-v1", stops) if stops else []
            for op, stopped in zip(running, receipts, strict=True):
                if op.op_id == sock.instruction.op_id and sock.finished.is_set():
                    continue
                if not stopped.data["result_file"]:
                    self.journal.update_op(
                        self.run_id,
                        op.op_id,
                        token=self.token,
                        state="uncertain",
                        error=f"attempt {op.attempt} stopped by a cancel",
                        event="op-cancelled",
                    )
        if sock.finished.is_set():
            return "finished"
        raise interactions.RunSuspended(
            f"{sock.instruction.op_id} stopped: cancel requested", state="cancelled"
        )

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
        incoming = self.causal_incoming(op.scope, op.seq)
        for earlier in incoming:
            src = self.state_dir / "boundaries" / earlier
            dst = evidence / "incoming" / earlier
            _mkdirs(dst / "workspace")
            for name in ("boundary.json", "handoff.md", "result.json", "transcript.jsonl"):
                if (src / name).exists():
                    _write_public(dst / name, (src / name).read_text())
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
                self.intent("freeze-proposal", "freeze-proposal", generation=self.w_gen["root"]),
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
        self.event("settled", status=settlement["status"], refused=len(report["refused"]))
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
