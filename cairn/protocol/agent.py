"""The agent socket (agent worker ⇄ coordinator), ``boundary.json``, the record one
completed agent operation leaves behind, and ``command-failed.json``, what a command
profile's failed CLI leaves."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, JsonValue

from cairn.protocol.base import Frozen, OpId, RunId, ScopeId
from cairn.protocol.launch import ProfileSpec
from cairn.protocol.names import ARTIFACT_PATH_MAX

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
    output_schema: dict[str, JsonValue]
    profile: ProfileSpec


class AgentMessage(Frozen):
    type: Literal["hello", "note", "progress", "finish_work"]
    text: str = ""
    output: dict[str, JsonValue] = {}
    handoff: str = ""


class AgentReply(Frozen):
    """``refused``: the coordinator judged the finish's result invalid; ``error`` is then
    ``kind: detail`` (:data:`cairn.resultjson.KINDS`) and the attempt is over."""

    ok: bool
    instruction: AgentInstruction | None = None
    error: str | None = None
    refused: bool = False


class Artifact(Frozen):
    """One file an agent published (``/outputs/artifacts/<name>``), as collected: its
    path below ``artifacts/``, size and content hash (:mod:`cairn.artifacts`)."""

    name: str = Field(min_length=1, max_length=ARTIFACT_PATH_MAX)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ArtifactRefused(Frozen):
    """An entry below ``/outputs/artifacts`` left behind: its name as printable text,
    and why."""

    name: str
    reason: str


class Artifacts(Frozen):
    """What one boundary collected and what it left behind (``refused`` names the first
    few; ``refused_total`` counts them all)."""

    files: list[Artifact] = []
    refused: list[ArtifactRefused] = []
    refused_total: int = 0


class Boundary(Frozen):
    """boundary.json: what one completed agent operation left behind."""

    run_id: RunId
    op_id: OpId
    scope: ScopeId
    attempt: int
    descriptor: str
    instruction: str
    # the control worker's request, read with json.loads, which nests deeper than
    # JsonValue validates
    invocation: dict[str, object]
    output: dict[str, JsonValue]
    output_sha256: str
    finish_sha256: str
    handoff: str
    notes: list[str]
    unit: str
    invocation_id: str
    checkpoint: dict[str, JsonValue]
    predecessor: str | None
    usage: dict[str, int] = {}
    artifacts: Artifacts = Artifacts()


COMMAND_FAILED_FILE = "command-failed.json"
"""What the worker leaves in /outputs when a command profile's CLI exits non-zero."""
COMMAND_FAILED_LIMIT = 4096
STDERR_LINES = 5
"""The last lines of the CLI's standard error the worker keeps for the operation's error."""

DETERMINISTIC_EXIT_STATUSES = frozenset({2, 64, 65, 66, 77, 78, 126, 127})
"""Exit statuses that another attempt would only repeat: a usage error (2, and
sysexits' EX_USAGE 64), bad input data (65, 66), no permission (77), a configuration
error (78), a command that cannot run (126) or is not there (127)."""


class CommandFailure(Frozen):
    """A command profile's CLI exited non-zero: its status and its last stderr lines.
    Written by the worker, which runs as the owner beside the agent: read as the agent's
    own words (bounded, escaped when shown), never as a reason to trust anything."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    exit_status: int
    stderr: list[str] = []

    @property
    def deterministic(self) -> bool:
        return self.exit_status in DETERMINISTIC_EXIT_STATUSES

    def describe(self) -> str:
        """One line: ``exited 2: <its last stderr line>``."""
        last = self.stderr[-1] if self.stderr else ""
        return f"exited {self.exit_status}: {last}" if last else f"exited {self.exit_status}"
