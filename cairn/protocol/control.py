"""The control worker's pipe: the sandboxed worker that runs the workflow source asks the
coordinator (or ``cairn upgrade``'s dry run) to answer each ``flow.*`` call, one JSON line
per message, tagged by ``type``."""

from __future__ import annotations

from typing import Any, Literal

from cairn.canonical import canonical_json, sha256_hex
from cairn.protocol.base import Frozen, ScopeId


class CallRequest(Frozen):
    """A ``flow.*`` call the control worker asks the coordinator to answer."""

    type: Literal["call"] = "call"
    scope: ScopeId
    seq: int
    kind: str
    request: dict[str, Any]
    location: str

    def request_hash(self) -> str:
        return "sha256:" + sha256_hex(canonical_json({"kind": self.kind, **self.request}))


class WorkflowReturn(Frozen):
    type: Literal["return"] = "return"
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
    args: dict[str, Any]
    answers: list[CallResult] = []
