"""Pydantic models for everything that crosses a process or persistence boundary.

Launch descriptions, intents, broker receipts, socket messages and boundary records are
validated on both sides; nothing is passed as an untyped dict between processes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# canonical_json and sha256_hex live in cairn.canonical; re-exported for existing callers.
from cairn.canonical import canonical_json as canonical_json
from cairn.canonical import sha256_hex as sha256_hex
from cairn.operation_kinds import OperationKind
from cairn.paths import RUN_ID_RE

# Lane scopes are named after their fork and key ("root-2-a"), so nesting lengthens them.
SCOPE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,119}$")
OP_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
LANE_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
INTENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,80}$")


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RunId = Annotated[str, Field(pattern=RUN_ID_RE.pattern)]
ScopeId = Annotated[str, Field(pattern=SCOPE_RE.pattern)]
OpId = Annotated[str, Field(pattern=OP_ID_RE.pattern)]


# --- launch description --------------------------------------------------------------


class ScriptStep(Frozen):
    """One deterministic step of a ``scripted`` agent, executed inside /workspace."""

    action: Literal["write", "append", "delete", "mkdir", "symlink", "chmod", "sleep", "run"]
    path: str = ""
    content: str = ""
    target: str = ""
    mode: int | None = None
    seconds: float = 0.0
    argv: list[str] = []

    @field_validator("path", "target")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError("script paths are relative to /workspace and may not contain '..'")
        return value


class ModelRoute(Frozen):
    """Where the model relay sends an agent's requests, frozen at launch.

    ``credential`` names a systemd credential of the coordinator (never the key itself);
    empty means the provider takes no key.
    """

    provider: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,40}$")
    base_url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    model: str = Field(min_length=1, max_length=200)
    credential: str = Field(default="", pattern=r"^([A-Za-z0-9_.-]{1,100})?$")
    auth_header: str = Field(default="Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$")
    auth_scheme: str = Field(default="Bearer", pattern=r"^[A-Za-z]{0,32}$")
    max_tokens_per_call: int = Field(default=8192, ge=1)
    timeout_sec: float = Field(default=300.0, gt=0)


class ProfileSpec(Frozen):
    """How an agent profile runs, resolved and frozen at launch.

    ``llm`` profiles carry their system prompt and name a route of the launch
    description (``provider``); ``command`` profiles may name one to reach the relay.
    """

    name: str
    kind: Literal["scripted", "command", "llm"]
    steps: list[ScriptStep] = []
    output: dict[str, Any] = {}
    handoff: str = ""
    argv: list[str] = []
    provider: str = ""
    system_prompt: str = ""
    max_steps: int = Field(default=60, ge=1, le=1000)
    max_corrections: int = Field(default=3, ge=0, le=20)
    bash_timeout_sec: float = Field(default=120.0, gt=0, le=3600)
    tool_output_limit: int = Field(default=16_384, ge=256, le=1 << 20)


class Limits(Frozen):
    """Per-agent unit limits and per-run budgets, frozen at launch."""

    memory_max: int = Field(default=2 << 30, ge=16 << 20)
    tasks_max: int = Field(default=512, ge=8)
    cpu_quota_percent: int = Field(default=100, ge=1)
    runtime_max_sec: int = Field(default=3600, ge=1)
    io_weight: int = Field(default=100, ge=1, le=10_000)
    model_tokens: int = Field(default=2_000_000, ge=0)
    max_agent_ops: int = Field(default=200, ge=1)
    max_concurrent_agents: int = Field(default=8, ge=1)
    max_agent_seconds: int = Field(default=24 * 3600, ge=1)


class ProjectSpec(Frozen):
    """The live project and how Q is made from it."""

    root: str
    owner_uid: int
    on_pool_fs: bool
    subvolume: str | None = None
    subpath: str = ""


class SettlementPolicySpec(Frozen):
    write_paths: list[str] = ["**"]
    allow_git_internals: bool = False
    max_file_bytes: int = 64 << 20
    max_total_bytes: int = 1 << 30


class LaunchDescription(Frozen):
    """Everything a run is recovered from. Never re-read from live configuration."""

    run_id: RunId
    owner_uid: int
    owner_gid: int
    owner_name: str
    definition: str
    source: str
    source_filename: str
    review_hash: str
    review: dict[str, Any]
    args: dict[str, Any]
    project: ProjectSpec
    profiles: dict[str, ProfileSpec]
    routes: dict[str, ModelRoute] = {}
    # The schedule revision that admitted this run ({id, name, revision, occurrence}); None
    # for a run a person launched directly.
    schedule: dict[str, Any] | None = None
    limits: Limits = Limits()
    policy: SettlementPolicySpec = SettlementPolicySpec()
    cairn_version: str
    created_at: float
    capsule_hash: str | None = None  # the sealed release installed at launch

    def launch_hash(self) -> str:
        return "sha256:" + sha256_hex(canonical_json(self.model_dump(mode="json")))


# --- intents and receipts -----------------------------------------------------------

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
    lanes: list[Annotated[str, Field(pattern=LANE_KEY_RE.pattern)]] = []


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


# --- daemon socket ------------------------------------------------------------------


class DaemonRequest(Frozen):
    op: Literal[
        "launch",
        "reconcile",
        "retry",
        "doctor",
        "upgrade",
        "ps",
        "show",
        "logs",
        "diff",
        "ping",
        "schedule-create",
        "schedule-confirm",
        "schedule-resume",
        "schedule-pause",
        "schedule-delete",
        "schedule-list",
        "schedule-inspect",
        "schedule-fire",
        "schedule-run-now",
        "schedule-inbox",
        "schedule-reconcile",
        "inbox",
        "answer",
        "approve",
        "reject",
        "pause",
        "resume",
        "stop",
        "cancel",
        "watch",
    ]
    definition: str | None = None
    args: dict[str, Any] = {}
    project: str | None = None
    run_id: str | None = None
    scripted: dict[str, ProfileSpec] = {}
    all_users: bool = False
    # launch of a workflow file: its source (read by the client) and the review hash the
    # person confirmed for it
    source: str | None = None
    confirm: str | None = None
    limits: dict[str, int] = {}
    # reconcile / retry of an uncertain operation
    op_id: str | None = None
    result: dict[str, Any] | None = None
    no_effect: bool = False
    dry_run: bool = False
    # schedule-* ops: the schedule ID, a create/replace body (validated by
    # cairn.schedules.ScheduleCreate), a review challenge, a queued occurrence key.
    schedule_id: str | None = None
    schedule: dict[str, Any] = {}
    challenge: str | None = None
    occurrence: str | None = None
    # people in the loop: an answer as the person typed it (with ``challenge``), an
    # approval request with the fingerprint the person saw, a rejection reason, and the
    # event cursor a watcher has seen
    answer: str | None = None
    request_id: str | None = None
    fingerprint: str | None = None
    reason: str = ""
    cursor: int = 0


class ErrorBody(Frozen):
    code: str
    message: str
    hint: str | None = None


class DaemonReply(Frozen):
    ok: bool
    result: Any = None
    error: ErrorBody | None = None


# --- control worker pipe ------------------------------------------------------------


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


# --- agent socket -------------------------------------------------------------------


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
    ok: bool
    instruction: AgentInstruction | None = None
    error: str | None = None


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
