"""Drive ``cairn mcp`` with the official MCP Python SDK's stdio client; print what happened
as one JSON object on stdout.

Run it with an interpreter that has the SDK (``mcp``), which needs a newer pydantic than
Cairn pins, so it lives in a venv of its own (``.venv-mcp``, made by ``./dev``):

    .venv-mcp/bin/python tests/support/mcp_sdk_session.py STEPS.json -- cairn mcp

STEPS.json is a list of steps, each carried out in order in one session:
  {"list": true}                         the tool names
  {"call": NAME, "arguments": {...}}     a tool call (its result, or the protocol error)
  {"call": ..., "form": {"action": A, "content": {...}}}
                                         the same, answering a form the server asks during
                                         it (elicitation) as a person would; the form's
                                         message and schema are reported as "asked"
  {"follow": RUN, "timeout": S, "rounds": N, "until": STATE}
                                         cairn_watch with a progress callback, again from
                                         the returned cursor, until the run has finished
                                         or is in STATE (at most N rounds)
``"$run"`` in a step stands for the run ID of the last call that returned one. The
client says it shows forms only when a step has a "form".
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import mcp_types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def _substitute(value: Any, run: str | None) -> Any:
    if value == "$run":
        return run
    if isinstance(value, dict):
        return {k: _substitute(v, run) for k, v in value.items()}
    return value


async def _call(session: ClientSession, name: str, arguments: dict[str, Any],
                progress: list[str] | None = None) -> dict[str, Any]:
    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        assert progress is not None
        progress.append(f"{done:g} {message}")

    try:
        result = await session.call_tool(
            name, arguments, read_timeout_seconds=900,
            progress_callback=on_progress if progress is not None else None,
        )
    except Exception as exc:  # the SDK raises the server's JSON-RPC error
        error = getattr(exc, "error", None)
        return {"error": {"code": getattr(error, "code", None), "message": str(exc)}}
    return {
        "is_error": result.is_error,
        "structured": result.structured_content,
        "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
    }


async def _session(steps: list[dict[str, Any]], argv: list[str]) -> dict[str, Any]:
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
    report: dict[str, Any] = {"steps": []}
    run: str | None = None
    form: dict[str, Any] = {}  # the answer the current step gives a form, and what it saw

    async def on_form(context: Any, asked: Any) -> types.ElicitResult:
        form["asked"] = {"message": asked.message, "schema": asked.requested_schema}
        return types.ElicitResult(action=form["answer"]["action"],
                                  content=form["answer"].get("content"))

    forms = on_form if any("form" in step for step in steps) else None
    async with stdio_client(params) as (read, write), ClientSession(
        read, write, elicitation_callback=forms
    ) as session:
        init = await session.initialize()
        report["protocol_version"] = init.protocol_version
        report["server"] = init.server_info.name
        for step in (_substitute(s, run) for s in steps):
            if "list" in step:
                tools = (await session.list_tools()).tools
                out: dict[str, Any] = {"tools": [t.name for t in tools],
                                       "schemas": {t.name: t.input_schema for t in tools}}
            elif "call" in step:
                form.clear()
                form["answer"] = step.get("form", {"action": "decline"})
                out = await _call(session, step["call"], step.get("arguments", {}))
                if "asked" in form:
                    out["asked"] = form["asked"]
            else:
                out = {"rounds": [], "progress": []}
                cursor = 0
                for _ in range(step.get("rounds", 20)):
                    got = await _call(session, "cairn_watch",
                                      {"run": step["follow"], "cursor": cursor,
                                       "timeout": step.get("timeout", 60)}, out["progress"])
                    out["rounds"].append(got)
                    data = got.get("structured") or {}
                    cursor = data.get("cursor", cursor)
                    if got.get("is_error") or data.get("finished") or (
                        data.get("state") == step.get("until")
                    ):
                        break
            data = out.get("structured") or {}
            run = data.get("run_id", run)
            report["steps"].append(out)
    return report


def main() -> None:
    split = sys.argv.index("--")
    with open(sys.argv[1]) as fh:
        steps = json.load(fh)
    print(json.dumps(asyncio.run(_session(steps, sys.argv[split + 1:]))))


if __name__ == "__main__":
    main()
