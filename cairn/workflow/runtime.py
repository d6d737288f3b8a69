"""The control worker: re-executes reviewed workflow source, one ``flow.*`` call at a time.

It runs as a child of the coordinator with no journal, no sockets and no files (it
sandboxes itself before reading anything: :mod:`cairn.workflow.sandbox`): it reads
JSON lines on stdin and writes JSON lines on stdout. Every ``flow.*`` call becomes a
:class:`~cairn.protocol.control.CallRequest`; the coordinator answers it from the journal or by
carrying out the effect, and the worker resumes the coroutine with the answer. The
coroutine is driven by hand (no event loop), so replay is deterministic.
"""

from __future__ import annotations

import inspect
import itertools
import subprocess
import sys
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol, TypeVar

from pydantic import BaseModel

from cairn.operations import (
    OperationKind,
    agent,
    approve,
    ask,
    fork,
    measure_proposal,
    repeat_until,
    restore,
    settle_experiment,
    unroll,
)
from cairn.protocol.control import (
    CallRequest,
    CallResult,
    JoinRequest,
    StartWorkflow,
    WorkflowFailure,
    WorkflowReturn,
)
from cairn.protocol.jsonvalue import JSONObject, JSONValue, json_str
from cairn.protocol.names import is_lane_key
from cairn.workflow import AgentDescriptor, Model, OperationFailed, WorkflowSpec, sandbox

M = TypeVar("M", bound=Model)
T = TypeVar("T")

# A lane body: a no-argument callable returning an awaitable (its value is the lane's).
LaneBody = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class AgentResult:
    """What ``await flow.agent(...)`` returns: the typed output and the boundary's handoff."""

    output: Model
    handoff: str
    boundary: str


class _Pending:
    """An awaitable that suspends the workflow coroutine until the coordinator answers."""

    def __init__(self, call: CallRequest) -> None:
        self.call = call

    def __await__(self) -> Generator[_Pending, JSONObject, JSONObject]:
        answer = yield self
        return answer


@dataclass(frozen=True)
class Approval:
    """What ``await flow.approve(...)`` returns (see :class:`cairn.operations.approve.Decision`)."""

    approved: bool
    outcome: str
    reason: str | None
    actor_uid: int | None
    request_id: str


@dataclass(frozen=True)
class LaneResult:
    """One lane's terminal outcome, as ``flow.parallel``/``flow.map`` return it."""

    outcome: str
    value: object = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"


class _Fork:
    """An awaitable fork: its lanes run as their own scopes; it resumes after the join."""

    def __init__(
        self, call: CallRequest, lanes: list[tuple[str, LaneBody]], concurrency: int
    ) -> None:
        self.call = call
        self.lanes = lanes
        self.concurrency = concurrency

    def __await__(self) -> Generator[_Fork, dict[str, LaneResult], dict[str, LaneResult]]:
        results = yield self
        return results


class Flow:
    """The ``flow`` object passed to a workflow. Only its methods reach outside."""

    def __init__(self, descriptor_names: dict[int, str], filename: str) -> None:
        self._names = descriptor_names
        self._filename = filename
        self._seq: dict[str, int] = {}
        self._scope = "root"  # set by the driver to the scope of the task it is stepping

    def _location(self) -> str:
        """file:line:col of the workflow-source frame that made the current call."""
        frame = inspect.currentframe()
        while frame is not None and frame.f_code.co_filename != self._filename:
            frame = frame.f_back
        if frame is None:
            raise RuntimeError("flow.* called from outside the workflow source")
        # the current instruction's position, read from the code object directly
        # (inspect.getframeinfo would also look for the source file on every call)
        position = next(
            itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None), None
        )
        col = (position[2] or 0) + 1 if position is not None else 0
        return f"{self._filename}:{frame.f_lineno}:{col}"

    def _next_call(self, kind: OperationKind, request: JSONObject) -> CallRequest:
        scope = self._scope
        seq = self._seq.get(scope, 0) + 1
        self._seq[scope] = seq
        return CallRequest(
            scope=scope, seq=seq, kind=kind, request=request, location=self._location()
        )

    def _call(self, kind: OperationKind, request: JSONObject) -> _Pending:
        return _Pending(self._next_call(kind, request))

    # Each method numbers its call and records its source location when it is called, not
    # when it is first awaited: a lane body (a lambda) has returned by the time its
    # awaitable runs, and only the call site identifies the operation.

    def agent(
        self,
        descriptor: AgentDescriptor,
        *,
        prompt: str,
        title: str | None = None,
        require_changes: bool = False,
    ) -> Coroutine[object, object, AgentResult]:
        """Run one agent session in the scope's W. ``require_changes``: a write agent
        that changed nothing but file times fails (``OperationFailed``, kind
        ``no-changes``) instead of succeeding."""
        name = self._names.get(id(descriptor))
        if name is None:
            raise TypeError("flow.agent needs a module-level agent(...) descriptor")
        if not isinstance(require_changes, bool):
            raise TypeError("flow.agent's require_changes is True or False")
        if require_changes and descriptor.access != "write":
            raise TypeError("flow.agent(require_changes=True) needs a write agent")
        pending = self._call("agent", agent.request(name, prompt, title, require_changes))
        return _agent_result(pending, descriptor)

    def ask(
        self, question: str, *, schema: type[M] | None = None
    ) -> Coroutine[object, object, M | str]:
        """Ask a person; the run waits (its coordinator may exit) until a schema-valid
        answer arrives. Without ``schema`` the answer is text."""
        request = ask.request(question, None if schema is None else schema.__name__)
        return _ask_answer(self._call("ask", request), schema)

    def approve(
        self,
        subject: str,
        *,
        expires_in: int | None = None,
        on_expiry: str = "reject",
        on_reject: str = "value",
    ) -> Coroutine[object, object, Approval]:
        """Ask a person to approve ``subject``; the run waits (its coordinator may exit).
        Returns the decision: a rejection, a policy denial or an expiry (``on_expiry``
        decides which way it counts) comes back as a value with its reason, unless
        ``on_reject="fail"``, which raises OperationFailed instead."""
        request = approve.request(subject, expires_in, on_expiry, on_reject)
        return _approval(self._call("approve", request))

    def parallel(
        self, lanes: Mapping[str, LaneBody], *, concurrency: int | None = None
    ) -> Coroutine[object, object, dict[str, LaneResult]]:
        """Run each lane (a no-argument callable returning an awaitable) in its own scope
        and workspace; return every lane's outcome once all are terminal."""
        keys = list(lanes)
        _check_keys(keys)
        limit = concurrency or len(keys)
        forked = _Fork(
            self._next_call("parallel", fork.request(keys, limit)),
            [(key, lanes[key]) for key in keys],
            limit,
        )
        return _await(forked)

    def map(
        self,
        items: list[T],
        fn: Callable[[T], Awaitable[object]],
        *,
        key: Callable[[T], str],
        concurrency: int | None = None,
    ) -> Coroutine[object, object, dict[str, LaneResult]]:
        """``parallel`` over data: one lane per item, named by ``key(item)``."""
        keys = [key(item) for item in items]
        _check_keys(keys)
        limit = concurrency or len(keys)

        def lane(item: T) -> LaneBody:
            return lambda: fn(item)

        forked = _Fork(
            self._next_call("map", fork.request(keys, limit)),
            [(k, lane(item)) for k, item in zip(keys, items, strict=True)],
            limit,
        )
        return _await(forked)

    def repeat_until(
        self,
        step: Callable[[int], object],
        check: Callable[[object], object],
        *,
        max_attempts: int,
    ) -> Coroutine[object, object, RepeatResult]:
        """Run ``step(attempt)`` until ``check(value)`` holds, at most ``max_attempts``
        times; each attempt's agents see the earlier attempts' boundaries."""
        start = self._call("repeat_until", repeat_until.request(max_attempts))
        return _repeat(self, start, step, check, max_attempts)

    def measure_proposal(
        self, evaluator: str, *, metrics: Mapping[str, JSONValue], primary: str | None = None
    ) -> Coroutine[object, object, JSONObject]:
        """Run the host's evaluator ``evaluator`` over a disposable snapshot of W (its
        warm-ups and samples); return the measurement: the metric definitions (``metrics``:
        name → unit, direction, aggregation, max_regression; ``primary`` decides, default
        the first), the environment, the raw samples and each metric's value."""
        pending = self._call(
            "measure_proposal", measure_proposal.request(evaluator, metrics, primary)
        )
        return _answer(pending)

    def settle_experiment(
        self, measurement: JSONObject, disposition: str, *, report: object = None,
        target: float | None = None,
    ) -> Coroutine[object, object, JSONObject]:
        """``accept`` the measured W (it becomes the best accepted checkpoint) or
        ``reject`` it (W is restored from the best accepted checkpoint before this
        returns). An accept that loses on the primary metric or breaks a guardrail, and any
        comparison with a different setup than the baseline's, raise OperationFailed.
        ``report``: what the trial tried and found (``hypothesis``, ``intervention``,
        ``conclusion``, each text), journalled with the disposition and shown by
        ``cairn show``. ``target``: the primary metric's value to reach; the result then
        says ``target_reached`` (the best accepted measurement is at it or beyond)."""
        pending = self._call(
            "settle_experiment",
            settle_experiment.request(measurement, disposition, report, target),
        )
        return _answer(pending)

    def restore(self, boundary: object) -> Coroutine[object, object, JSONObject]:
        """Put W back to an earlier agent boundary of this scope (``flow.agent``'s result,
        or its ``boundary``) before this returns: what later agents see and what settles
        is that checkpoint, and every change made after it is dropped. Returns the
        ``boundary`` restored and W's new ``w_generation``; a boundary that is not a
        committed agent boundary of this scope, earlier than the call, raises
        OperationFailed."""
        pending = self._call("restore", restore.request(boundary))
        return _answer(pending)

    def unroll(
        self, items: list[T], fn: Callable[[T], object], *, title: str
    ) -> Coroutine[object, object, list[object]]:
        """A durable, ordered worklist: ``fn(item)`` for each item in turn, each marked
        active in the journal (``cairn show`` renders it)."""
        labels = [unroll.label(item) for item in items]
        start = self._call("unroll", unroll.request(title, labels))
        return _unroll(self, start, title, items, fn)

    def item(self, key: str, fn: Callable[[], object]) -> Coroutine[object, object, object]:
        """Mark ``key`` as the active item, then run ``fn``."""
        return _item(self, self._call("item", unroll.item_request("", -1, key)), fn)


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _maybe_await(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


@dataclass(frozen=True)
class RepeatResult:
    """What ``flow.repeat_until`` returns: the last step's value and whether it passed."""

    value: object
    attempts: int
    passed: bool


async def _answer(pending: _Pending) -> JSONObject:
    return await pending


async def _ask_answer(pending: _Pending, schema: type[M] | None) -> M | str:
    answer = await pending
    if schema is None:
        return str(answer["answer"])
    return schema.model_validate(answer["answer"])


async def _approval(pending: _Pending) -> Approval:
    decision = approve.Decision.model_validate(await pending)
    return Approval(
        approved=decision.approved,
        outcome=decision.outcome,
        reason=decision.reason,
        actor_uid=decision.actor_uid,
        request_id=decision.request_id,
    )


async def _agent_result(pending: _Pending, descriptor: AgentDescriptor) -> AgentResult:
    answer = await pending
    output = descriptor.output.model_validate(answer["output"])
    return AgentResult(output=output, handoff=json_str(answer["handoff"]),
                       boundary=json_str(answer["op_id"]))


async def _repeat(
    flow: Flow,
    start: _Pending,
    step: Callable[[int], object],
    check: Callable[[object], object],
    max_attempts: int,
) -> RepeatResult:
    await start
    value: object = None
    for attempt in range(1, max_attempts + 1):
        value = await _maybe_await(step(attempt))
        if await _maybe_await(check(value)):
            return RepeatResult(value, attempt, True)
    return RepeatResult(value, max_attempts, False)


async def _unroll(
    flow: Flow, start: _Pending, title: str, items: list[T], fn: Callable[[T], object]
) -> list[object]:
    await start
    results: list[object] = []
    for index, item in enumerate(items):
        await flow._call("item", unroll.item_request(title, index, unroll.label(item)))
        results.append(await _maybe_await(fn(item)))
    await flow._call("item", unroll.done_request(title, len(items)))
    return results


async def _item(flow: Flow, start: _Pending, fn: Callable[[], object]) -> object:
    await start
    return await _maybe_await(fn())


def _check_keys(keys: list[str]) -> None:
    if not keys:
        raise ValueError("a fork needs at least one lane")
    if len(set(keys)) != len(keys):
        raise ValueError(f"lane keys repeat: {keys}")
    for key in keys:
        if not is_lane_key(key):
            raise ValueError(f"lane key {key!r}: use lowercase letters, digits and '-'")


class _LoadedWorkflow(Protocol):
    """A loaded workflow function: ``@workflow`` recorded its spec on it."""

    __cairn_workflow__: WorkflowSpec

    def __call__(self, flow: Flow, args: Model, /) -> Coroutine[object, object, object]: ...


def load_workflow(source: str, filename: str) -> tuple[types.ModuleType, _LoadedWorkflow]:
    """Execute reviewed source as a module and return it with its workflow function."""
    module = types.ModuleType("cairn_workflow_source")
    module.__file__ = filename
    # Pydantic resolves postponed annotations (``from __future__ import annotations``)
    # through ``sys.modules[cls.__module__]``: without this entry a model whose field
    # names another model of the module cannot validate anything.
    sys.modules[module.__name__] = module
    code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102  (the reviewed workflow, in its sandbox)
    functions = [
        value for value in module.__dict__.values() if hasattr(value, "__cairn_workflow__")
    ]
    if len(functions) != 1:
        raise RuntimeError(f"{filename} defines {len(functions)} workflows, expected exactly 1")
    return module, functions[0]


@dataclass
class _Task:
    """One strand of control: the root coroutine, or one lane of a fork."""

    scope: str
    coroutine: Coroutine[object, object, object] | None  # a lane's, once its body made it
    parent: _Task | None = None
    key: str | None = None
    send: JSONObject | dict[str, LaneResult] | None = None
    throw: BaseException | None = None
    fork: _Fork | None = None
    lanes: dict[str, _Task] = field(default_factory=dict)
    queued: list[tuple[str, LaneBody]] = field(default_factory=list)
    running: int = 0
    results: dict[str, LaneResult] = field(default_factory=dict)
    lane_last_ops: dict[str, str | None] = field(default_factory=dict)
    last_op: str | None = None


class _Driver:
    """Steps every task until it waits on the coordinator; answers arrive in any order."""

    def __init__(self, flow: Flow, out: IO[str], answers: Sequence[CallResult] = ()) -> None:
        self.flow = flow
        self.out = out
        self.answers = {(a.scope, a.seq): a for a in answers}
        self.runnable: deque[_Task] = deque()
        self.waiting: dict[tuple[str, int], _Task] = {}

    def run(self, root: _Task, inp: IO[str]) -> object:
        self.runnable.append(root)
        self.root_result: object = None
        self.root_done = False
        while True:
            while self.runnable:
                self.step(self.runnable.popleft())
            if self.root_done:
                return self.root_result
            if not self.waiting:
                raise RuntimeError("the workflow waits on nothing (deadlock)")
            self.out.flush()  # calls are written unflushed; everything waits on a reply now
            line = inp.readline()
            if not line:
                raise SystemExit(0)
            result = CallResult.model_validate_json(line)
            task = self.waiting.pop((result.scope, result.seq), None)
            if task is None:
                raise RuntimeError(f"answer for unknown call {result.scope}/{result.seq}")
            self.answered(task, result)

    def answered(self, task: _Task, result: CallResult) -> None:
        fork = task.fork
        if fork is None:
            if set(result.value) == {"error", "kind"}:  # the operation failed for good
                task.throw = OperationFailed(result.value["error"], kind=result.value["kind"])
            else:
                task.send = result.value
                task.last_op = f"{result.scope}-{result.seq}"
            self.runnable.append(task)
        elif not task.lanes and not task.results:  # the fork is recorded: start lanes
            task.queued = list(fork.lanes)
            self.start_lanes(task)
            if not fork.lanes:
                self.join(task)
        else:  # the join is recorded: the parent resumes with every lane's outcome
            task.send = task.results
            task.fork = None
            task.lanes = {}
            task.results = {}
            task.lane_last_ops = {}
            task.last_op = f"{result.scope}-{result.seq}"
            self.runnable.append(task)

    def start_lanes(self, parent: _Task) -> None:
        assert parent.fork is not None
        fork_op = f"{parent.fork.call.scope}-{parent.fork.call.seq}"
        while parent.queued and parent.running < parent.fork.concurrency:
            key, body = parent.queued.pop(0)
            lane = _Task(scope=f"{fork_op}-{key}", coroutine=None, parent=parent, key=key)
            parent.lanes[key] = lane
            parent.running += 1
            self.flow._scope = lane.scope
            try:
                lane.coroutine = _as_coroutine(body())
            except Exception as exc:  # the lane body failed before it awaited anything
                self.lane_done(lane, LaneResult("failed", error=_describe(exc)))
                continue
            self.runnable.append(lane)

    def step(self, task: _Task) -> None:
        self.flow._scope = task.scope
        coroutine = task.coroutine
        assert coroutine is not None  # a lane whose body failed is never stepped
        try:
            if task.throw is not None:
                error, task.throw = task.throw, None
                yielded = coroutine.throw(error)
            else:
                value, task.send = task.send, None
                yielded = coroutine.send(value)
        except StopIteration as stop:
            self.finished(task, LaneResult("succeeded", value=stop.value))
            return
        except Exception as exc:
            if task.parent is None:
                raise
            self.finished(task, LaneResult("failed", error=_describe(exc)))
            return
        if isinstance(yielded, _Fork):
            task.fork = yielded
            self.emit(task, yielded.call)
        elif isinstance(yielded, _Pending):
            self.emit(task, yielded.call)
        else:
            raise RuntimeError("workflows may only await flow.* calls")  # noqa: TRY004

    def emit(self, task: _Task, call: CallRequest) -> None:
        # Always reported: the coordinator checks every call against the journal.
        self.out.write(call.model_dump_json() + "\n")
        known = self.answers.pop((call.scope, call.seq), None)
        if known is not None and task.fork is None:
            self.answered(task, known)
            return
        self.waiting[(call.scope, call.seq)] = task

    def finished(self, task: _Task, result: LaneResult) -> None:
        if task.parent is None:
            self.root_done = True
            self.root_result = result.value
            return
        self.lane_done(task, result)

    def lane_done(self, lane: _Task, result: LaneResult) -> None:
        parent = lane.parent
        assert parent is not None and lane.key is not None
        parent.results[lane.key] = result
        parent.lane_last_ops[lane.key] = lane.last_op
        parent.running -= 1
        self.start_lanes(parent)
        assert parent.fork is not None
        if len(parent.results) == len(parent.fork.lanes):
            self.join(parent)

    def join(self, parent: _Task) -> None:
        assert parent.fork is not None
        call = parent.fork.call
        outcomes = {
            key: {
                "outcome": parent.results[key].outcome,
                "error": parent.results[key].error,
                "last_op": parent.lane_last_ops.get(key),
            }
            for key, _body in parent.fork.lanes
        }
        self.waiting[(call.scope, call.seq)] = parent
        _write(self.out, JoinRequest(scope=call.scope, seq=call.seq, outcomes=outcomes))


def _as_coroutine(awaitable: Awaitable[object]) -> Coroutine[object, object, object]:
    if inspect.iscoroutine(awaitable):
        return awaitable

    async def wrapper() -> object:
        return await awaitable

    return wrapper()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def drive(start: StartWorkflow, inp: IO[str], out: IO[str]) -> None:
    """Run the workflow to completion, exchanging JSON lines with the coordinator."""
    module, function = load_workflow(start.source, start.filename)
    spec = function.__cairn_workflow__
    names = {id(v): k for k, v in module.__dict__.items() if isinstance(v, AgentDescriptor)}
    flow = Flow(names, start.filename)
    args = spec.input.model_validate(start.args)
    root = _Task(scope="root", coroutine=function(flow, args))
    value = _Driver(flow, out, start.answers).run(root, inp)
    output = value if isinstance(value, BaseModel) else spec.output.model_validate(value)
    _write(out, WorkflowReturn(output=output.model_dump(mode="json")))


def _write(out: IO[str], message: BaseModel) -> None:
    out.write(message.model_dump_json() + "\n")
    out.flush()


def spawn(env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a control worker: a separate interpreter in a process group of its own (in
    the coordinator's session, so it shares the coordinator's CPU share:
    :mod:`cairn.background`), talking JSON lines on stdin/stdout. It sandboxes itself
    (:mod:`cairn.workflow.sandbox`) before it reads anything: no ``preexec_fn``, which is
    unsafe once the coordinator has threads."""
    return subprocess.Popen(
        [sys.executable, "-I", "-m", "cairn.workflow.runtime"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**env, "PYTHONHASHSEED": "0"},
        text=True,
        close_fds=True,
        process_group=0,
    )


EXIT_NO_SANDBOX = 78  # EX_CONFIG: the host, not the workflow, is at fault


def main() -> None:
    """Entry point of the control worker process (stdin/stdout are the coordinator's pipe)."""
    inp, out = sys.stdin, sys.stdout
    sys.stdout = sys.stderr  # stray prints from workflow code must not corrupt the pipe
    try:
        sandbox.enter()  # resource limits, Landlock, seccomp: before any input is read
    except sandbox.SandboxUnavailable as exc:
        print(f"cairn control worker: {exc}", file=sys.stderr, flush=True)
        _write(out, WorkflowFailure(error=str(exc), kind="SandboxUnavailable"))
        sys.exit(EXIT_NO_SANDBOX)
    start = StartWorkflow.model_validate_json(inp.readline())
    try:
        drive(start, inp, out)
    except Exception as exc:  # reported to the coordinator, which fails the run closed
        _write(out, WorkflowFailure(error=str(exc) or type(exc).__name__, kind=type(exc).__name__))
        sys.exit(1)


if __name__ == "__main__":
    main()
