"""The MCP messages of ``cairn mcp`` (:mod:`cairn.protocol.mcp`): what a client may send,
what the server writes, and how the protocol version is chosen."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cairn.protocol.mcp import (
    LATEST_PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    CallToolParams,
    CallToolResult,
    ErrorObject,
    LaunchArgs,
    Message,
    ProgressParams,
    TextContent,
    Tool,
    WatchArgs,
    negotiate,
    notification_line,
    response_line,
)


def test_the_clients_version_is_kept_when_spoken_else_the_latest() -> None:
    for version in PROTOCOL_VERSIONS:
        assert negotiate(version) == version
    assert negotiate("2099-01-01") == LATEST_PROTOCOL_VERSION == "2025-11-25"


def test_a_message_must_be_json_rpc_2_and_may_carry_keys_of_later_revisions() -> None:
    message = Message.model_validate({"jsonrpc": "2.0", "id": "a", "method": "ping", "x": 1})
    assert (message.id, message.method) == ("a", "ping")
    with pytest.raises(ValidationError):
        Message.model_validate({"jsonrpc": "1.0", "id": 1, "method": "ping"})
    with pytest.raises(ValidationError):
        Message.model_validate({"jsonrpc": "2.0", "id": [1], "method": "ping"})


def test_a_call_reads_its_progress_token_from_meta() -> None:
    call = CallToolParams.model_validate(
        {"name": "cairn_watch", "arguments": {"run": "@last"}, "_meta": {"progressToken": 7}}
    )
    assert call.meta is not None and call.meta.progress_token == 7
    assert CallToolParams.model_validate({"name": "cairn_runs"}).arguments == {}


def test_responses_have_exactly_one_of_result_and_error_and_a_null_id_when_unknown() -> None:
    assert json.loads(response_line(3)) == {"jsonrpc": "2.0", "id": 3, "result": {}}
    error = json.loads(response_line(None, error=ErrorObject(code=-32700, message="not JSON")))
    assert error == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "not JSON"}}
    result = CallToolResult(content=[TextContent(text="x")], structured_content={"a": 1})
    assert json.loads(response_line("r", result))["result"] == {
        "content": [{"type": "text", "text": "x"}], "structuredContent": {"a": 1}, "isError": False
    }
    assert response_line(1).endswith(b"\n") and response_line(1).count(b"\n") == 1


def test_progress_uses_the_wire_names() -> None:
    line = notification_line(
        "notifications/progress", ProgressParams(progress_token="t", progress=2, message="m")
    )
    assert json.loads(line) == {
        "jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": "t", "progress": 2.0, "message": "m"},
    }


def test_tool_names_are_what_harnesses_accept() -> None:
    Tool(name="user_fix-flaky", description="d", input_schema={"type": "object"})
    for bad in ("user:fix-flaky", "a b", "x" * 65, ""):
        with pytest.raises(ValidationError):
            Tool(name=bad, description="d", input_schema={"type": "object"})


def test_tool_arguments_are_closed_and_bounded() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        LaunchArgs.model_validate({"args": {}, "confirm": "sha256:" + "0" * 64})
    with pytest.raises(ValidationError):
        LaunchArgs.model_validate({"apply": "yes"})
    with pytest.raises(ValidationError):
        WatchArgs.model_validate({"run": "@last", "timeout": 601})
    assert WatchArgs.model_validate({"run": "@last"}).timeout == 60
