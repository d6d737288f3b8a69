"""The control worker: re-executes reviewed workflow source, one ``flow.*`` call at a time.

It runs as a child of the coordinator with no journal, no sockets and no files: it reads
JSON lines on stdin and writes JSON lines on stdout. Every ``flow.*`` call becomes a
:class:`~cairn.models.CallRequest`; the coordinator answers it from the journal or by
carrying out the effect, and the worker resumes the coroutine with the answer. The
coroutine is driven by hand (no event loop), so replay is deterministic.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Generator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from pydantic import BaseModel

from cairn.models import (
    CallRequest,
    CallResult,
    StartWorkflow,
    WorkflowFailure,
    WorkflowReturn,
)
from cairn.workflow import AgentDescriptor, Model

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class AgentResult:
    """What ``await flow.agent(...)`` returns: the typed output and the boundary's handoff."""

    output: Any
    handoff: str
    boundary: str


class _Pending:
    """An awaitable that suspends the workflow coroutine until the coordinator answers."""

    def __init__(self, call: CallRequest) -> None:
        self.call = call

    def __await__(self) -> Generator[_Pending, dict[str, Any], dict[str, Any]]:
        answer = yield self
        return answer


class Flow:
    """The ``flow`` object passed to a workflow. Only its methods reach outside."""

    def __init__(self, descriptor_names: dict[int, str], filename: str) -> None:
        self._names = descriptor_names
        self._filename = filename
        self._seq: dict[str, int] = {}

    def _location(self) -> str:
        """file:line:col of the workflow-source frame that made the current call."""
        frame = inspect.currentframe()
        while frame is not None and frame.f_code.co_filename != self._filename:
            frame = frame.f_back
        if frame is None:
            raise RuntimeError("flow.* called from outside the workflow source")
        positions = inspect.getframeinfo(frame, context=0).positions
        col = (positions.col_offset or 0) + 1 if positions is not None else 0
        return f"{self._filename}:{frame.f_lineno}:{col}"

    def _call(self, kind: str, request: dict[str, Any], scope: str = "root") -> _Pending:
        seq = self._seq.get(scope, 0) + 1
        self._seq[scope] = seq
        return _Pending(
            CallRequest(scope=scope, seq=seq, kind=kind, request=request, location=self._location())
        )

    async def agent(
        self, descriptor: AgentDescriptor, *, prompt: str, title: str | None = None
    ) -> AgentResult:
        name = self._names.get(id(descriptor))
        if name is None:
            raise TypeError("flow.agent needs a module-level agent(...) descriptor")
        pending = self._call(
            "agent", {"descriptor": name, "prompt": prompt, "title": title or name}
        )
        answer = await pending
        output = descriptor.output.model_validate(answer["output"])
        return AgentResult(output=output, handoff=answer["handoff"], boundary=answer["op_id"])


def load_workflow(source: str, filename: str) -> tuple[types.ModuleType, Any]:
    """Execute reviewed source as a module and return it with its workflow function."""
    module = types.ModuleType("cairn_workflow_source")
    module.__file__ = filename
    code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, module.__dict__)
    functions = [
        value for value in module.__dict__.values() if hasattr(value, "__cairn_workflow__")
    ]
    if len(functions) != 1:
        raise RuntimeError(f"{filename} defines {len(functions)} workflows, expected exactly 1")
    return module, functions[0]


def drive(start: StartWorkflow, inp: IO[str], out: IO[str]) -> None:
    """Run the workflow to completion, exchanging JSON lines with the coordinator."""
    module, function = load_workflow(start.source, start.filename)
    spec = function.__cairn_workflow__
    names = {id(v): k for k, v in module.__dict__.items() if isinstance(v, AgentDescriptor)}
    flow = Flow(names, start.filename)
    args = spec.input.model_validate(start.args)
    coroutine = function(flow, args)
    answer: dict[str, Any] | None = None
    while True:
        try:
            pending = coroutine.send(answer)
        except StopIteration as stop:
            value = stop.value
            output = value if isinstance(value, BaseModel) else spec.output.model_validate(value)
            _write(out, WorkflowReturn(output=output.model_dump(mode="json")))
            return
        if not isinstance(pending, _Pending):
            raise RuntimeError("workflows may only await flow.* calls")
        _write(out, pending.call)
        line = inp.readline()
        if not line:
            raise SystemExit(0)
        result = CallResult.model_validate_json(line)
        if result.seq != pending.call.seq:
            raise RuntimeError(f"answer for call {result.seq}, expected {pending.call.seq}")
        answer = result.value


def _write(out: IO[str], message: BaseModel) -> None:
    out.write(message.model_dump_json() + "\n")
    out.flush()


def main() -> None:
    """Entry point of the control worker process (stdin/stdout are the coordinator's pipe)."""
    inp, out = sys.stdin, sys.stdout
    sys.stdout = sys.stderr  # stray prints from workflow code must not corrupt the pipe
    start = StartWorkflow.model_validate_json(inp.readline())
    try:
        drive(start, inp, out)
    except Exception as exc:  # reported to the coordinator, which fails the run closed
        _write(out, WorkflowFailure(error=str(exc) or type(exc).__name__, kind=type(exc).__name__))
        sys.exit(1)


if __name__ == "__main__":
    main()

