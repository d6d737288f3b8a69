"""A real HTTP server speaking the chat-completions protocol, OpenAI's Responses API
(``POST /v1/responses``, as codex calls it: server-sent events) and Anthropic's Messages API
(``POST /v1/messages``, streamed or not, as Claude Code calls it), with scripted replies.

Tests start it on a loopback address (``FakeProvider(turns).start()``), point a model route
at ``provider.base_url`` and read back what arrived in ``provider.requests``. Each turn is
either text or a list of tool calls, or an error reply in its place in the order
(``Turn(status=429, headers={"Retry-After": "3"})``); ``stream=True`` requests get
server-sent events with a final usage chunk when the client asks for one. Usage counts are
deterministic: prompt tokens are the request's JSON size / 4, completion tokens are the
turn's ``tokens``.

Run as a script (``python3 fake_provider.py PORT SCRIPT.json [KEY]``) it serves until killed,
for use inside a test machine.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Turn:
    """One scripted assistant reply."""

    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tokens: int = 10
    raw_arguments: str | None = None  # sent verbatim instead of the JSON of the first call
    status: int = 200  # anything else answers with an error body instead of a message
    headers: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # the error object; a generic one if None

    def message(self, index: int) -> dict[str, Any]:
        calls = []
        for n, (name, args) in enumerate(self.tool_calls):
            text = self.raw_arguments if (n == 0 and self.raw_arguments is not None) else (
                json.dumps(args)
            )
            calls.append({
                "id": f"call_{index}_{n}",
                "type": "function",
                "function": {"name": name, "arguments": text},
            })
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if calls:
            message["tool_calls"] = calls
        return message


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeProvider:
    """Serve ``turns`` in order on 127.0.0.1; the last turn repeats when they run out."""

    def __init__(self, turns: list[Turn], *, host: str = "127.0.0.1", port: int = 0,
                 require_key: str | None = None, untooled: str | None = None) -> None:
        self.turns = turns
        self.require_key = require_key
        # When set, a chat request that offers no tools (a CLI's side call, such as
        # opencode's title of the session) gets this text and takes no turn.
        self.untooled = untooled
        self.requests: list[Received] = []
        self._served = 0  # turns taken
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                provider._serve(self)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address: (str, int)
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_turn(self, received: Received) -> tuple[int, Turn]:
        with self._lock:
            self.requests.append(received)
            index = self._served
            self._served += 1
            return index, self.turns[min(index, len(self.turns) - 1)]

    def _take(self, received: Received) -> tuple[int, Turn]:
        """The next turn, or the ``untooled`` text for a request that offers no tools."""
        if self.untooled is not None and not received.body.get("tools"):
            with self._lock:
                self.requests.append(received)
            return -1, Turn(content=self.untooled)
        return self._next_turn(received)

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length", "0"))
        raw = handler.rfile.read(length)
        body = json.loads(raw)
        received = Received(handler.path, {k.lower(): v for k, v in handler.headers.items()},
                            body)
        if self.require_key is not None and self.require_key not in (
            received.headers.get("authorization", "").removeprefix("Bearer "),
            received.headers.get("x-api-key"),  # the Anthropic API's header
        ):
            self._send_json(handler, 401, {"error": {"message": "bad key", "type": "auth"}})
            with self._lock:
                self.requests.append(received)
            return
        path = handler.path.split("?", 1)[0]  # Claude Code asks for /v1/messages?beta=true
        if path.endswith("/responses"):
            index, turn = self._next_turn(received)
            self._send_response_events(handler, index, turn, len(raw) // 4)
            return
        if path.endswith("/messages"):
            index, turn = self._take(received)
            self._send_messages(handler, index, turn, body, len(raw) // 4)
            return
        if not path.endswith("/chat/completions"):
            with self._lock:  # received, and answered as an unknown path
                self.requests.append(received)
            self._send_json(handler, 404, {"error": {"message": "not found"}})
            return
        index, turn = self._take(received)
        if turn.status != 200:
            error = turn.error or {"message": f"scripted HTTP {turn.status}",
                                   "type": "scripted_error", "code": None}
            self._send_json(handler, turn.status, {"error": error}, turn.headers)
            return
        usage = {
            "prompt_tokens": len(raw) // 4,
            "completion_tokens": turn.tokens,
            "total_tokens": len(raw) // 4 + turn.tokens,
        }
        message = turn.message(index)
        finish = "tool_calls" if turn.tool_calls else "stop"
        if body.get("stream"):
            self._send_stream(handler, index, body, message, finish, usage)
            return
        self._send_json(handler, 200, {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        })

    @staticmethod
    def _send_response_events(handler: BaseHTTPRequestHandler, index: int, turn: Turn,
                              input_tokens: int) -> None:
        """The Responses API's server-sent events of ``turn`` (codex reads only these)."""
        rid = f"resp_{index}"
        usage = {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": turn.tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": input_tokens + turn.tokens}
        items = response_items(turn, index)
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
            *({"type": "response.output_item.done", "output_index": n, "item": item}
              for n, item in enumerate(items)),
            {"type": "response.completed",
             "response": {"id": rid, "status": "completed", "output": items, "usage": usage}}]
        _send_events(handler, events)

    @classmethod
    def _send_messages(cls, handler: BaseHTTPRequestHandler, index: int, turn: Turn,
                       body: dict[str, Any], input_tokens: int) -> None:
        """An Anthropic Messages reply for ``turn``: one JSON message, or its stream events
        (a text block, then a ``tool_use`` block per call, its input as JSON deltas)."""
        if turn.status != 200:
            error = turn.error or {"type": "api_error", "message": f"scripted HTTP {turn.status}"}
            cls._send_json(handler, turn.status, {"type": "error", "error": error}, turn.headers)
            return
        blocks = message_blocks(turn, index)
        stop = "tool_use" if turn.tool_calls else "end_turn"
        message = {"id": f"msg_{index}", "type": "message", "role": "assistant",
                   "model": body.get("model", ""), "content": blocks, "stop_reason": stop,
                   "stop_sequence": None,
                   "usage": {"input_tokens": input_tokens, "output_tokens": turn.tokens}}
        if not body.get("stream"):
            cls._send_json(handler, 200, message)
            return
        events: list[dict[str, Any]] = [{"type": "message_start", "message": {
            **message, "content": [], "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}]
        for n, block in enumerate(blocks):
            if block["type"] == "text":
                events += [{"type": "content_block_start", "index": n,
                            "content_block": {"type": "text", "text": ""}},
                           {"type": "content_block_delta", "index": n,
                            "delta": {"type": "text_delta", "text": block["text"]}}]
            else:
                arguments = json.dumps(block["input"])
                half = len(arguments) // 2
                events += [{"type": "content_block_start", "index": n,
                            "content_block": {**block, "input": {}}},
                           *({"type": "content_block_delta", "index": n,
                              "delta": {"type": "input_json_delta", "partial_json": part}}
                             for part in (arguments[:half], arguments[half:]))]
            events.append({"type": "content_block_stop", "index": n})
        events += [{"type": "message_delta", "delta": {"stop_reason": stop,
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": turn.tokens}},
                   {"type": "message_stop"}]
        _send_events(handler, events)

    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, status: int, body: Any,
                   headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(raw)

    @staticmethod
    def _send_stream(handler: BaseHTTPRequestHandler, index: int, body: dict[str, Any],
                     message: dict[str, Any], finish: str, usage: dict[str, int]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        base = {"id": f"chatcmpl-{index}", "object": "chat.completion.chunk",
                "model": body.get("model", "")}

        def event(data: dict[str, Any]) -> None:
            handler.wfile.write(b"data: " + json.dumps({**base, **data}).encode() + b"\n\n")
            handler.wfile.flush()

        event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        for word in (message.get("content") or "").split(" "):
            if word:
                event({"choices": [{"index": 0, "delta": {"content": word + " "}}]})
        for n, call in enumerate(message.get("tool_calls", [])):
            event({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": n, **call}]}}]})
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            event({"choices": [], "usage": usage})
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()


def _send_events(handler: BaseHTTPRequestHandler, events: list[dict[str, Any]]) -> None:
    """``events`` as one server-sent-events reply, each named by its ``type``."""
    payload = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
                       for e in events)
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def response_items(turn: Turn, index: int) -> list[dict[str, Any]]:
    """The output items of a Responses-API reply for ``turn``: its tool calls as
    ``function_call`` items, else its text as one assistant message."""
    if turn.tool_calls:
        return [{"type": "function_call", "id": f"fc_{index}_{n}", "call_id": f"call_{index}_{n}",
                 "name": name, "arguments": json.dumps(args), "status": "completed"}
                for n, (name, args) in enumerate(turn.tool_calls)]
    return [{"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": turn.content or "",
                          "annotations": []}]}]


def message_blocks(turn: Turn, index: int) -> list[dict[str, Any]]:
    """The content blocks of a Messages-API reply for ``turn``: its text, if any, then a
    ``tool_use`` block per tool call."""
    blocks: list[dict[str, Any]] = []
    if turn.content:
        blocks.append({"type": "text", "text": turn.content})
    blocks += [{"type": "tool_use", "id": f"toolu_{index}_{n}", "name": name, "input": args}
               for n, (name, args) in enumerate(turn.tool_calls)]
    return blocks or [{"type": "text", "text": ""}]


def turns_from_json(data: list[dict[str, Any]] | dict[str, Any]) -> list[Turn]:
    """The turns of a script: a list of turns, or ``{"turns": [...], "untooled": TEXT}``."""
    turns: list[dict[str, Any]] = data["turns"] if isinstance(data, dict) else data
    return [
        Turn(content=t.get("content"),
             tool_calls=[(c["name"], c["arguments"]) for c in t.get("tool_calls", [])],
             tokens=int(t.get("tokens", 10)), status=int(t.get("status", 200)),
             headers=dict(t.get("headers", {})), error=t.get("error"))
        for t in turns
    ]


if __name__ == "__main__":
    # python3 fake_provider.py PORT SCRIPT.json [REQUIRED_KEY]
    port, script = int(sys.argv[1]), sys.argv[2]
    key = sys.argv[3] if len(sys.argv) > 3 else None
    with open(script) as fh:
        loaded = json.load(fh)
    untooled = loaded.get("untooled") if isinstance(loaded, dict) else None
    provider = FakeProvider(turns_from_json(loaded), port=port, require_key=key,
                            untooled=untooled)
    print(provider.base_url, flush=True)
    provider.server.serve_forever()
