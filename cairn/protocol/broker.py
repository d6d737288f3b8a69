"""The root broker's protocol: the intents the daemon and a coordinator record for it, the
receipts it keeps of what it did, and its one-line reply on the broker socket."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cairn.protocol.base import INTENT_ID_RE, Frozen, LaneKey, OpId, RunId, ScopeId

Verb = Literal["launch-v1", "storage-v1", "delete-v1"]

IntentKind = Literal[
    "start-coordinator",
    "prepare-q",
    "create-w",
    "drop-w",
    "fork",
    "verify-storage",
    "start-agent",
    "stop-agent",
    "checkpoint",
    "freeze-proposal",
    "settle-candidate",
    "start-apply",
    "delete-run",
]

VERB_OF_KIND: dict[str, Verb] = {
    "start-coordinator": "launch-v1",
    "start-agent": "launch-v1",
    "stop-agent": "launch-v1",
    "start-apply": "launch-v1",
    "prepare-q": "storage-v1",
    "create-w": "storage-v1",
    "drop-w": "storage-v1",
    "fork": "storage-v1",
    "verify-storage": "storage-v1",
    "checkpoint": "storage-v1",
    "freeze-proposal": "storage-v1",
    "settle-candidate": "storage-v1",
    "delete-run": "delete-v1",
}


class Intent(Frozen):
    """What a coordinator or the daemon wants the broker to do. Paths are never given:
    the broker derives them from the run, scope and op IDs."""

    intent_id: str = Field(pattern=INTENT_ID_RE.pattern)
    run_id: RunId
    kind: IntentKind
    scope: ScopeId = "root"
    op_id: OpId | None = None
    generation: int = 1
    attempt: int = 1
    from_checkpoint: OpId | None = None
    lanes: list[LaneKey] = []


class Receipt(Frozen):
    """The broker's record that an intent was carried out."""

    intent_id: str
    run_id: RunId
    kind: IntentKind
    data: dict[str, Any]
    at: float


class BrokerReply(Frozen):
    ok: bool
    receipts: list[Receipt] = []
    error: str | None = None
    code: str | None = None
    hint: str | None = None  # sent only when there is one: older clients forbid the key
