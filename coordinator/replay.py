"""Replay (ARCHITECTURE §5): the workflow runs again in a control worker from the start.
Every call it makes must be in the reviewed manifest and match the journal's identity of
that operation (kind, request hash, source location, predecessor); a committed call is
answered from the journal, any other is carried out by its kind."""

from __future__ import annotations

import functools
import queue
import subprocess
import threading
from collections.abc import Callable
from typing import IO, Literal, TypeAlias

from cairn.coordinator import interactions
from cairn.coordinator.base import Nondeterminism, OperationError, ReviewedSite
from cairn.coordinator.context import RunContext
from cairn.coordinator.lanes import Lanes
from cairn.errors import CairnError
from cairn.journal.rows import OpRow
from cairn.operations import FORK_KINDS
from cairn.proc import make_env
from cairn.protocol.control import (
    CallRequest,
    CallResult,
    JoinRequest,
    StartWorkflow,
    WorkflowFailure,
    WorkflowReturn,
    parse_worker_message,
)
from cairn.protocol.jsonvalue import JSONObject
from cairn.workflow import runtime

# What the reader and answering threads hand the replay loop: the worker's end, an
# exception, a call to dispatch (with its scope's predecessor), an answer to send back
# (whether it was committed just now), or any other message from the worker.
_Event: TypeAlias = (
    tuple[Literal["eof"], None]
    | tuple[Literal["error"], BaseException]
    | tuple[Literal["call"], tuple[CallRequest, str | None]]
    | tuple[Literal["answered"], tuple[CallRequest | JoinRequest, JSONObject, bool]]
    | tuple[Literal["message"], JoinRequest | WorkflowReturn | WorkflowFailure]
)


def _end(worker: subprocess.Popen[str]) -> None:
    """Kill a control worker that still runs, and reap it."""
    if worker.poll() is None:
        worker.kill()
    worker.wait()


class _RestartReplay(Exception):
    """Always-replay test mode: tear the control worker down after a commit."""


class Replay:
    """The control-worker loop and the identity check of each call; a call not committed
    before goes to ``carry_out`` (:meth:`cairn.coordinator.dispatch.Handlers.carry_out`).

    ``committed``: the operations committed before this coordinator started, by scope and
    sequence number; ``always_replay``: the test mode that starts the workflow again after
    every commit."""

    def __init__(
        self,
        run: RunContext,
        carry_out: Callable[[OpRow, CallRequest], tuple[JSONObject, bool]],
        lanes: Lanes,
        *,
        committed: dict[tuple[str, int], OpRow],
        always_replay: bool = False,
    ) -> None:
        self.run = run
        self.carry_out = carry_out
        self.lanes = lanes
        self.committed = committed
        self.always_replay = always_replay
        self.prestarted: subprocess.Popen[str] | None = None

    def prestart_control_worker(self) -> None:
        """Start the control worker's interpreter now, so its start overlaps the storage
        steps; it waits for its start message, and :meth:`replay_once` takes it."""
        self.prestarted = runtime.spawn(make_env())

    def take_control_worker(self) -> subprocess.Popen[str]:
        """The prestarted worker if it is still waiting, else a new one."""
        worker, self.prestarted = self.prestarted, None
        if worker is not None and worker.poll() is None:
            return worker
        if worker is not None:
            worker.wait()
        return runtime.spawn(make_env())

    def discard_prestarted_worker(self) -> None:
        """A run that ends or suspends before its replay leaves no worker behind."""
        worker, self.prestarted = self.prestarted, None
        if worker is not None:
            _end(worker)

    def replay(self) -> JSONObject:
        """Re-execute the workflow in a control worker until it returns."""
        while True:
            try:
                return self.replay_once()
            except _RestartReplay:
                self.run.event("always-replay-restart")

    def replay_once(self) -> JSONObject:
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
            source=self.run.desc.source,
            filename=self.run.desc.source_filename,
            args=self.run.desc.args,
            answers=given,
        )
        worker = self.take_control_worker()
        assert worker.stdin is not None and worker.stdout is not None
        stdin = worker.stdin
        events: queue.Queue[_Event] = queue.Queue()
        last_in_scope: dict[str, str | None] = {}
        lock = threading.Lock()  # the worker's stdin and last_in_scope

        def reply(scope: str, seq: int, op_id: str, value: JSONObject | None) -> None:
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
                    message = parse_worker_message(line)
                    if isinstance(message, CallRequest):
                        call = message
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
                match events.get():
                    case ("eof", _):
                        raise CairnError(
                            f"the control worker exited unexpectedly (status {worker.wait()})"
                        )
                    case ("error", exc):
                        raise exc
                    case ("answered", (answered, value, fresh)):
                        if fresh and self.always_replay:
                            raise _RestartReplay
                        reply(answered.scope, answered.seq, f"{answered.scope}-{answered.seq}",
                              value)
                    case ("call", (call, predecessor)):
                        self.dispatch(
                            events, call, functools.partial(self.answer, call, predecessor)
                        )
                    # every message but a call (the reader answers those)
                    case ("message", WorkflowReturn(output=output)):
                        self.run.models[self.run.review["workflow"]["output"]].model_validate(output)
                        return output
                    case ("message", WorkflowFailure(kind=kind, error=error)):
                        raise CairnError(f"workflow raised {kind}: {error}")
                    case ("message", JoinRequest() as join):
                        self.dispatch(events, join, functools.partial(self.join, join))
        finally:
            _end(worker)

    def dispatch(
        self,
        events: queue.Queue[_Event],
        call: CallRequest | JoinRequest,
        work: Callable[[], tuple[JSONObject, str, bool]],
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

    def answer(
        self, call: CallRequest, predecessor: str | None
    ) -> tuple[JSONObject, str, bool]:
        """The call's result, its op ID, and whether it was committed just now."""
        interactions.at_safe_point(self.run)
        self.check_manifest(call)
        op_id = f"{call.scope}-{call.seq}"
        op = self.run.journal.get_op(self.run.run_id, call.scope, call.seq)
        if op is None:
            op = self.run.journal.record_requested(
                call, run_id=self.run.run_id, op_id=op_id, predecessor=predecessor,
                token=self.run.token,
            )
        else:
            self.check_identity(op, call, predecessor)
        if op.state == "committed":
            assert op.result is not None
            return op.result, op_id, False
        result, fresh = self.carry_out(op, call)
        return result, op_id, fresh

    def check_manifest(self, call: CallRequest) -> ReviewedSite:
        """The reviewed call site of ``call`` (:meth:`RunContext.check_manifest`)."""
        return self.run.check_manifest(call)

    def join(self, join: JoinRequest) -> tuple[JSONObject, str, bool]:
        """The lanes' join (:meth:`Lanes.join`)."""
        return self.lanes.join(join)

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
            self.run.journal.append_event(
                self.run.run_id,
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
