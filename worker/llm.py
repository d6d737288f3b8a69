"""The ``llm`` profile: a compact tool-using coding agent over the model relay.

The agent talks chat-completions to ``/run/cairn/model.sock`` (the coordinator's relay;
no key and no network here), runs the tools of :mod:`cairn.worker.tools` in /workspace
and ends when the model calls ``finish_work(output, handoff)`` with an output that fits
the descriptor's schema. Replies without a tool call, unparsable arguments and invalid
output get a correction; more than ``max_corrections`` of them end the agent. A model call
answered 429, 408 or 5xx, or cut off at the relay socket, is repeated after a wait
(``Retry-After`` or capped exponential backoff, :mod:`cairn.worker.retry`) up to the
profile's ``model_attempts``; each repeat is a note and is numbered in the transcript.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.errors import CairnError
from cairn.protocol.agent import MODEL_ATTEMPT_HEADER, REFUSED_HEADER, AgentInstruction
from cairn.resultjson import ResultInvalid, parse
from cairn.unixhttp import UnixHTTPConnection
from cairn.worker.channel import MODEL_SOCKET, AgentChannel
from cairn.worker.retry import QUOTA_CODE, Backoff, retry_after, retryable_status
from cairn.worker.tools import TOOL_SPECS, Toolbox, schema_error

if TYPE_CHECKING:
    from cairn.protocol.jsonvalue import JSONObject, JSONValue

log = logging.getLogger(__name__)

RESPONSE_LIMIT = 32 << 20

ENVIRONMENT = """\
You work inside a sandbox. The project is in /workspace (your working directory); your
changes there are the result. Earlier agents' results are under /evidence (read
/evidence/index.json; what they published is in /evidence/incoming/<op>/artifacts/).
Files you want to publish beside your result (a report, a log, a plot) go in
/outputs/artifacts/; /state is private scratch space. There is no network.

When the work is done, call finish_work once with `output` matching this JSON schema and a
short `handoff` for whoever continues:

{schema}
"""


class BudgetSpent(CairnError):
    """The run's model token budget is spent; the relay refuses further calls."""

    code = "budget-spent"


@dataclass
class _Reply:
    status: int
    body: JSONObject | None
    raw: bytes
    headers: dict[str, str]

    @property
    def error(self) -> tuple[str | None, str]:
        """(error code, message cut to 300 characters) of an error reply."""
        error = (self.body or {}).get("error")
        code: JSONValue = None
        if isinstance(error, dict):
            code = error.get("code") or error.get("type")
            error = error.get("message")
        message = str(error) if error else self.raw[:300].decode(errors="replace")
        return (str(code) if code else None), message[:300]


class RelayClient:
    """chat-completions over the model socket, repeating a call while the answer says it
    may succeed later (:mod:`cairn.worker.retry`)."""

    def __init__(
        self,
        path: str = MODEL_SOCKET,
        *,
        timeout: float = 600.0,
        backoff: Backoff | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.timeout = timeout
        self.backoff = backoff or Backoff()
        self.on_retry = on_retry
        self.retries = 0  # over every call of this client

    def chat(self, messages: Sequence[Mapping[str, JSONValue]],
             tools: Sequence[Mapping[str, JSONValue]]) -> JSONObject:
        """One non-streaming completion."""
        body = json.dumps({"messages": messages, "tools": tools, "tool_choice": "auto"}).encode()
        backoff = self.backoff
        last = ""
        for attempt in range(1, backoff.attempts + 1):
            try:
                reply = self._post(body, attempt)
            except (ConnectionError, FileNotFoundError) as exc:
                # The coordinator restarting: its relay socket is gone or drops the call.
                last = f"the model relay at {self.path} is unreachable ({exc})"
                advised = None
            except (OSError, http.client.HTTPException) as exc:
                raise CairnError(f"model call failed at the relay {self.path}: {exc}") from exc
            else:
                if reply.status == 200 and reply.body is not None:
                    return reply.body
                last = _final_or_retryable(reply)
                advised = retry_after(reply.headers, backoff.now())
            if attempt == backoff.attempts:
                break
            delay = backoff.delay(attempt, advised)
            self.retries += 1
            note = (f"model call: {last}; retry {attempt} of {backoff.attempts - 1} "
                    f"in {delay:.1f}s")
            log.warning("%s", note)
            if self.on_retry is not None:
                self.on_retry(note)
            backoff.wait(delay)
        raise CairnError(
            f"model call failed {backoff.attempts} times; the last: {last}",
            hint="the provider keeps refusing or failing; try later, or raise "
            "model_attempts / model_retry_cap_sec of the profile",
        )

    def _post(self, body: bytes, attempt: int) -> _Reply:
        conn = UnixHTTPConnection(self.path, self.timeout)
        try:
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json",
                                  MODEL_ATTEMPT_HEADER: str(attempt)})
            response = conn.getresponse()
            raw = response.read(RESPONSE_LIMIT)
            headers = {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()
        return _Reply(response.status, _json_object(raw), raw, headers)


def _final_or_retryable(reply: _Reply) -> str:
    """Describe a failed reply that may succeed later; raise for one that cannot."""
    if reply.status == 200:
        raise CairnError("the model relay answered HTTP 200 without a JSON object: "
                         f"{reply.raw[:200]!r}")
    code, message = reply.error
    if reply.status == 429 and code == QUOTA_CODE:
        if reply.headers.get(REFUSED_HEADER.lower()) == "budget":
            raise BudgetSpent(f"model call refused: {message}",
                              hint="raise limits.model_tokens or shorten the task")
        raise CairnError(f"the provider refused the model call for its quota: {message}",
                         hint="check the provider account's quota and billing")
    described = f"HTTP {reply.status}: {message}"
    if not retryable_status(reply.status, code):
        raise CairnError(f"model call refused with {described}",
                         hint="a request the provider will not accept as sent; see the "
                         "operation's transcript.jsonl")
    return described


def tool_definitions(output_schema: Mapping[str, JSONValue]) -> list[JSONObject]:
    """The OpenAI ``tools`` list, with finish_work's parameters built from the schema."""
    output = {k: v for k, v in output_schema.items() if k != "$defs"}
    finish: JSONObject = {
        "type": "object",
        "properties": {"output": output,
                       "handoff": {"type": "string", "description": "notes for the next step"}},
        "required": ["output", "handoff"],
        "additionalProperties": False,
    }
    if "$defs" in output_schema:
        finish["$defs"] = output_schema["$defs"]
    specs: list[JSONObject] = [
        *TOOL_SPECS, {"name": "finish_work", "description": "End the work with the typed "
                      "output and a handoff. Call it exactly once, last.",
                      "parameters": finish}]
    return [{"type": "function", "function": spec} for spec in specs]


def run_llm(
    instruction: AgentInstruction,
    channel: AgentChannel,
    workspace: Path,
    client: RelayClient | None = None,
) -> tuple[JSONObject, str]:
    """Run the agent loop; return (output, handoff) for finish_work."""
    profile = instruction.profile
    client = client or RelayClient(
        os.environ.get("CAIRN_MODEL_SOCKET", MODEL_SOCKET),
        backoff=Backoff(attempts=profile.model_attempts, cap=profile.model_retry_cap_sec),
        on_retry=channel.note,
    )
    toolbox = Toolbox(workspace, note=channel.note, bash_timeout=profile.bash_timeout_sec,
                      output_limit=profile.tool_output_limit)
    tools = tool_definitions(instruction.output_schema)
    schema_text = json.dumps(instruction.output_schema, indent=1)
    system = "\n\n".join(
        p for p in (profile.system_prompt.strip(), ENVIRONMENT.format(schema=schema_text)) if p
    )
    task = instruction.prompt if instruction.title == instruction.descriptor else (
        f"# {instruction.title}\n\n{instruction.prompt}"
    )
    messages: list[JSONObject] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task},
    ]
    corrections = 0
    for step in range(1, profile.max_steps + 1):
        reply = client.chat(messages, tools)
        message = _first_message(reply)
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise CairnError("the model relay answered tool_calls that are not a list")
        assistant: JSONObject = {"role": "assistant", "content": message.get("content")}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if not calls:
            corrections += 1
            _check_corrections(corrections, profile.max_corrections, "replied without a tool call")
            messages.append({"role": "user", "content": "Continue with the tools. When the "
                             "work is done, call finish_work(output, handoff)."})
            continue
        finished: tuple[JSONObject, str] | None = None
        for call in calls:
            if not isinstance(call, dict):
                raise CairnError("the model relay answered a tool call that is not an object")
            text, done, mistake = _run_call(call, toolbox, instruction.output_schema)
            log.info("step %d: %s%s", step, _call_name(call), " (refused)" if mistake else "")
            messages.append({"role": "tool", "tool_call_id": str(call.get("id", "")),
                             "content": text})
            corrections += mistake
            if done is not None and finished is None:
                finished = done
        if finished is not None:
            return finished
        _check_corrections(corrections, profile.max_corrections, "made invalid tool calls")
    raise CairnError(f"the agent did not call finish_work within {profile.max_steps} steps",
                     hint="raise max_steps of the profile or narrow the task")


def _run_call(
    call: JSONObject, toolbox: Toolbox, output_schema: JSONObject
) -> tuple[str, tuple[JSONObject, str] | None, int]:
    """(tool result text, finish (output, handoff) if accepted, 1 if a correction)."""
    name = _call_name(call)
    raw = _function(call).get("arguments") or "{}"
    args = _json_object(raw.encode() if isinstance(raw, str) else b"")
    if args is None:
        return f"error: the arguments of {name} are not a JSON object; send valid JSON", None, 1
    if name != "finish_work":
        result = toolbox.call(name, args)
        return result, None, int(result.startswith("error: no tool named"))
    output, handoff = args.get("output"), args.get("handoff", "")
    if isinstance(output, str):
        # Some models send the object as a JSON string.
        output = _json_object(output.encode())
    error = schema_error(output_schema, output) if isinstance(output, dict) else (
        "output: must be an object"
    )
    if error is None and not isinstance(handoff, str):
        error = "handoff: must be a string"
    if error is not None:
        return f"error: finish_work refused: {error}. Fix it and call finish_work again.", None, 1
    assert isinstance(output, dict) and isinstance(handoff, str)
    return "finished", (output, handoff), 0


def _check_corrections(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise CairnError(f"the model {what} {count} times (limit {limit}); giving up",
                         hint="try a stronger model or raise max_corrections of the profile")


def _call_name(call: JSONObject) -> str:
    return str(_function(call).get("name", ""))


def _function(call: JSONObject) -> JSONObject:
    function = call.get("function") or {}
    if not isinstance(function, dict):
        raise CairnError("the model relay answered a tool call whose function is not an object")
    return function


def _first_message(reply: JSONObject) -> JSONObject:
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    raise CairnError("the model relay answered without a message")


def _json_object(raw: bytes) -> JSONObject | None:
    try:  # bounded: a model's arguments are as untrusted as an agent's result
        value = parse(raw, "the arguments")
    except ResultInvalid:
        return None
    return value if isinstance(value, dict) else None
