"""The control worker's pipe: the sandboxed worker that runs the workflow source asks the
coordinator (or ``cairn upgrade``'s dry run) to answer each ``flow.*`` call, one JSON line
per message, tagged by ``type``."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, TypeAdapter, ValidationError

from cairn.canonical import canonical_json, sha256_hex
from cairn.errors import CairnError
from cairn.operation_kinds import OperationKind
from cairn.protocol.base import Frozen, ScopeId


class CallRequest(Frozen):
    """A ``flow.*`` call the control worker asks the coordinator to answer."""

    type: Literal["call"] = "call"
    scope: ScopeId
    seq: int
    kind: OperationKind
    request: dict[str, Any]
    location: str

    def request_hash(self) -> str:
        return "sha256:" + sha256_hex(canonical_json({"kind": self.kind, **self.request}))


class WorkflowReturn(Frozen):
    type: Literal["return"] = "return"
    # read with json.loads, whose nesting limit is above the one JsonValue validates to
    output: dict[str, Any]


class WorkflowFailure(Frozen):
    type: Literal["failure"] = "failure"
    error: str
    kind: str


class CallResult(Frozen):
    type: Literal["result"] = "result"
    scope: ScopeId = "root"
    seq: int
    value: dict[str, Any]


class JoinRequest(Frozen):
    """Every lane of the fork ``(scope, seq)`` reached a terminal outcome."""

    type: Literal["join"] = "join"
    scope: ScopeId
    seq: int
    outcomes: dict[str, dict[str, Any]]


class StartWorkflow(Frozen):
    """Start a control worker. ``answers`` are results of calls committed before this
    replay (never forks): the worker takes them without waiting for a reply, and still
    reports each call so the coordinator checks it against the journal."""

    type: Literal["start"] = "start"
    source: str
    filename: str
    args: dict[str, JsonValue]
    answers: list[CallResult] = []


# What the control worker writes, dispatched on ``type``: a call to answer, a join of a
# fork's lanes, or the workflow's end. (What it reads is told apart by position, not by
# tag: the first line is a StartWorkflow, every later one a CallResult.)
WorkerMessage = Annotated[
    CallRequest | JoinRequest | WorkflowReturn | WorkflowFailure, Field(discriminator="type")
]
WORKER_MESSAGE: TypeAdapter[WorkerMessage] = TypeAdapter(WorkerMessage)


class UnknownWorkerMessage(CairnError):
    """A line from the control worker whose ``type`` is none of its messages."""


# pydantic's first error when the line is not one of the tagged messages at all.
_NOT_A_MESSAGE = ("union_tag_invalid", "union_tag_not_found", "model_attributes_type")


def parse_worker_message(line: str | bytes) -> WorkerMessage:
    """One line the control worker wrote, as its message model. An unknown or missing
    ``type`` is :class:`UnknownWorkerMessage`; a known message with bad fields is pydantic's
    ValidationError."""
    message = json.loads(line)
    try:
        return WORKER_MESSAGE.validate_python(message)
    except ValidationError as exc:
        if exc.errors()[0]["type"] in _NOT_A_MESSAGE:
            raise UnknownWorkerMessage(
                f"the control worker sent an unknown message: {message!r}"
            ) from None
        raise
