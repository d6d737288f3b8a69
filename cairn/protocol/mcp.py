"""An agent harness → ``cairn mcp``: the stdio subset of the Model Context Protocol.

JSON-RPC 2.0, one message a line on stdin and stdout. The server answers ``initialize``
(negotiating ``protocolVersion``), ``ping``, ``tools/list`` and ``tools/call``, and sends
``notifications/progress`` while a call that carried a ``progressToken`` runs. It asks one
thing itself: ``elicitation/create``, a launch form for a person, of a client that said it
can show one. A line that is not a message gets a JSON-RPC error, never a crash.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema
from typing_extensions import TypedDict  # pydantic reads a TypedDict field from here before 3.12

from cairn.protocol.definitions import NAME_PATTERN
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.names import ARTIFACT_PATH_MAX, HASH_PATTERN, OP_ID_PATTERN, RUN_KEY_PATTERN

JSONRPC: Literal["2.0"] = "2.0"

# Revisions reachable through the ``initialize`` handshake, oldest to newest; the tools,
# progress and ping this server uses have the same shape in each.
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]
ELICITATION_SINCE = "2025-06-18"  # the first revision with elicitation/create (form mode)

# JSON-RPC 2.0 error codes (the MCP specification uses INVALID_PARAMS for an unknown tool).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

RequestId = int | str


class Open(BaseModel):
    """A message from the client: keys this server does not use are kept, not refused
    (the protocol adds optional fields with every revision)."""

    model_config = ConfigDict(defer_build=True, extra="allow", frozen=True, populate_by_name=True)


class Closed(BaseModel):
    """A message this server writes: exactly the declared keys, by their wire names."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, populate_by_name=True)


class Message(Open):
    """One line from the client: a request (``id`` and ``method``), a notification (``method``
    only) or a response to something the server asked (``id`` only, with ``result`` or
    ``error`` among the extra keys)."""

    jsonrpc: Literal["2.0"]
    id: RequestId | None = None
    method: str | None = None
    params: dict[str, JsonValue] | None = None


class RequestMeta(Open):
    progress_token: RequestId | None = Field(default=None, alias="progressToken")


class InitializeParams(Open):
    protocol_version: str = Field(alias="protocolVersion")
    capabilities: dict[str, JsonValue] = {}
    client_info: dict[str, JsonValue] | None = Field(default=None, alias="clientInfo")


class CallToolParams(Open):
    name: str
    arguments: dict[str, JsonValue] = {}
    meta: RequestMeta | None = Field(default=None, alias="_meta")


class CancelledParams(Open):
    """``notifications/cancelled``: the client no longer wants request ``requestId``."""

    request_id: RequestId | None = Field(default=None, alias="requestId")
    reason: str | None = None


class ServerInfo(Closed):
    name: str
    version: str


class InitializeResult(Closed):
    protocol_version: str = Field(serialization_alias="protocolVersion")
    capabilities: dict[str, JsonValue]
    server_info: ServerInfo = Field(serialization_alias="serverInfo")
    instructions: str


class Tool(Closed):
    """One tool of ``tools/list``: its name, what it does, and its arguments' JSON Schema."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str
    input_schema: dict[str, JsonValue] = Field(serialization_alias="inputSchema")


class ListToolsResult(Closed):
    tools: list[Tool]


class TextContent(Closed):
    type: Literal["text"] = "text"
    text: str


class CallToolResult(Closed):
    """A tool's answer: text for the model, the same data as an object, and whether the
    call failed (a failed call is a result the model reads, not a protocol error)."""

    content: list[TextContent]
    structured_content: dict[str, JsonValue] | None = Field(
        default=None, serialization_alias="structuredContent"
    )
    is_error: bool = Field(default=False, serialization_alias="isError")


class ProgressParams(Closed):
    progress_token: RequestId = Field(serialization_alias="progressToken")
    progress: float
    total: float | None = None
    message: str | None = None


# One field of an elicitation form: the schema of one input the client renders.
FormField = dict[str, JsonValue]


class ElicitForm(TypedDict):
    """The flat form of ``elicitation/create``: its fields, and the ones to fill in."""

    type: str
    properties: dict[str, FormField]
    required: list[str]


class ElicitParams(Closed):
    """``elicitation/create`` in form mode: what to show the person, and the flat form."""

    message: str
    requested_schema: ElicitForm = Field(serialization_alias="requestedSchema")


class ElicitAnswer(Open):
    """The client's answer to ``elicitation/create``: what the person did, and what they
    entered when they accepted."""

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, JsonValue] | None = None


def can_elicit(version: str, capabilities: JSONObject) -> bool:
    """Whether a client that negotiated ``version`` and sent ``capabilities`` shows forms:
    it declared ``elicitation`` (``{}`` or with ``form``) in a revision that has it."""
    declared = capabilities.get("elicitation")
    if not isinstance(declared, dict) or version < ELICITATION_SINCE:
        return False
    return not declared or "form" in declared


class ErrorObject(Closed):
    code: int
    message: str
    data: JsonValue = None


def wire(model: BaseModel) -> JSONObject:
    """``model`` as the protocol spells it: wire names, absent optionals left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def response_line(request_id: RequestId | None, result: BaseModel | None = None,
                  error: ErrorObject | None = None) -> bytes:
    """One response as a line: exactly one of ``result`` (``{}`` when None: a ping's
    answer) and ``error``; ``id`` is null only for a line whose id could not be read."""
    body: JSONObject = {"jsonrpc": JSONRPC, "id": request_id}
    if error is not None:
        body["error"] = wire(error)
    else:
        body["result"] = {} if result is None else wire(result)
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def request_line(request_id: RequestId, method: str, params: BaseModel) -> bytes:
    body = {"jsonrpc": JSONRPC, "id": request_id, "method": method, "params": wire(params)}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def notification_line(method: str, params: BaseModel) -> bytes:
    body = {"jsonrpc": JSONRPC, "method": method, "params": wire(params)}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def negotiate(requested: str) -> str:
    """The version to answer ``initialize`` with: the client's when this server speaks it,
    otherwise this server's latest (the client then decides whether to go on)."""
    return requested if requested in PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION


# --- the fixed tools' arguments (their JSON Schema is what tools/list shows) ----------

RUN_HELP = "The run: its ID, a unique prefix of at least 4 hex digits, or @last."
MAX_WATCH_SECONDS = 600


# A tool argument that may be any JSON. Its JSON Schema in tools/list stays unconstrained,
# as pydantic writes an unannotated field's (JsonValue's own would add a $defs entry).
ToolJSON = Annotated[JsonValue, WithJsonSchema({})]


class ToolArgs(BaseModel):
    """A tool's arguments: exactly these keys (a misspelt one is refused, not ignored)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)


class RunsArgs(ToolArgs):
    pass


class InboxArgs(ToolArgs):
    pass


class RunArgs(ToolArgs):
    run: str = Field(description=RUN_HELP)


class WatchArgs(RunArgs):
    timeout: float = Field(
        default=60, gt=0, le=MAX_WATCH_SECONDS,
        description="Seconds to follow the run at most; it returns earlier when the run's "
        "state changes.",
    )
    cursor: int = Field(
        default=0, ge=0,
        description="The cursor an earlier cairn_watch returned: only events after it.",
    )


class AnswerArgs(RunArgs):
    challenge: str = Field(description="The question's challenge (sha256:…), from cairn_inbox.")
    answer: ToolJSON = Field(
        title="Answer",  # as tools/list showed it: pydantic titles no JsonValue field itself
        description="The answer: text, or a JSON value for a question with a schema."
    )


MAX_ARTIFACT_TEXT = 256 << 10  # characters of an artifact's text one cairn_artifact returns


class ArtifactArgs(RunArgs):
    """``cairn_artifact``: one file an agent of the run published."""

    op: str = Field(pattern=OP_ID_PATTERN,
                    description="The agent operation that published it: an operation's op_id "
                    "in cairn_show.")
    name: str = Field(min_length=1, max_length=ARTIFACT_PATH_MAX,
                      description="Its name: one of that operation's artifacts.files[].name "
                      "in cairn_show.")


class LaunchArgs(ToolArgs):
    """A workflow tool's arguments; ``args`` is checked by cairnd against the workflow's
    input model (its JSON Schema replaces this field's in tools/list)."""

    args: dict[str, ToolJSON] = {}
    project: str | None = Field(
        default=None,
        description="The project directory (yours); default: where the MCP server runs.",
    )
    apply: Literal["auto", "ask", "never"] = Field(
        default="auto",
        description="auto: the proposal settles into the project; ask: it waits for a "
        "person's 'cairn apply'; never: it is only kept.",
    )
    run_key: str | None = Field(
        default=None,
        pattern=RUN_KEY_PATTERN,
        description="Your name for this run: a call repeated with the same key (and the "
        "same arguments) returns the run the first call started instead of another.",
    )


DRAFT_SOURCE_CHARS = 1 << 20  # the definitions' source limit (its bytes are checked too)


class DraftArgs(ToolArgs):
    """``cairn_workflow_draft``: read a draft, or write one; never install it."""

    name: str = Field(
        pattern=rf"^{NAME_PATTERN}$",
        description="The draft's name: a lowercase letter, then up to 40 of a-z 0-9 _ -. "
        "Once a person installs it, it is the workflow user:NAME.",
    )
    source: str | None = Field(
        default=None, max_length=DRAFT_SOURCE_CHARS,
        description="The workflow's whole Python source, written as the draft and reviewed. "
        "Left out: the current draft is returned and nothing is written.",
    )
    replaces: str | None = Field(
        default=None, pattern=HASH_PATTERN,
        description="The draft hash (sha256:…) an earlier call returned. Needed to replace "
        "an existing draft, so a change a person made since is never overwritten unseen.",
    )
