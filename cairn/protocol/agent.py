"""The agent socket (agent worker ⇄ coordinator) and ``boundary.json``, the record one
completed agent operation leaves behind."""

from __future__ import annotations

from typing import Any, Literal

from cairn.protocol.base import Frozen, OpId, RunId, ScopeId
from cairn.protocol.launch import ProfileSpec

# Headers of the model relay (``/run/cairn/model.sock``): the ``llm`` agent numbers the
# tries of one call (1 for the first; the relay records it in the transcript), and the
# relay marks a refusal for the run's token budget with ``X-Cairn-Refused: budget``.
MODEL_ATTEMPT_HEADER = "X-Cairn-Attempt"
REFUSED_HEADER = "X-Cairn-Refused"

MESSAGE_LIMIT = 8 << 20
"""Bytes of one line on the agent socket, its newline included."""


class AgentInstruction(Frozen):
    run_id: RunId
    op_id: OpId
    attempt: int
    prompt: str
    title: str
    descriptor: str
    output_schema: dict[str, Any]
    profile: ProfileSpec


class AgentMessage(Frozen):
    type: Literal["hello", "note", "progress", "finish_work"]
    text: str = ""
    output: dict[str, Any] = {}
    handoff: str = ""


class AgentReply(Frozen):
    """``refused``: the coordinator judged the finish's result invalid; ``error`` is then
    ``kind: detail`` (:data:`cairn.resultjson.KINDS`) and the attempt is over."""

    ok: bool
    instruction: AgentInstruction | None = None
    error: str | None = None
    refused: bool = False


class Boundary(Frozen):
    """boundary.json: what one completed agent operation left behind."""

    run_id: RunId
    op_id: OpId
    scope: ScopeId
    attempt: int
    descriptor: str
    instruction: str
    invocation: dict[str, Any]
    output: dict[str, Any]
    output_sha256: str
    finish_sha256: str
    handoff: str
    notes: list[str]
    unit: str
    invocation_id: str
    checkpoint: dict[str, Any]
    predecessor: str | None
    usage: dict[str, int] = {}
