"""The model relay: an OpenAI-compatible HTTP endpoint on one agent's model socket.

The coordinator binds it on the host and the broker binds it into the unit at
``/run/cairn/model.sock``. Only the run owner's UID may connect. Every request is sent to
the route frozen in the launch description with the provider credential added here, so
the key never enters the agent's namespace. The relay forces the route's model, caps each
call's output tokens, refuses calls once the run's token or money budget is spent (or its
owner's daily money budget), caps each call at what the money left buys, passes
streaming responses through as they arrive, and appends every exchange to a transcript.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import socketserver
import ssl
import struct
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from cairn.coordinator.budget import MoneyBudget, TokenBudget
from cairn.protocol.agent import MODEL_ATTEMPT_HEADER, REFUSED_HEADER
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.protocol.launch import ModelRoute
from cairn.providers import cost_micros, load_credential

log = logging.getLogger(__name__)

REQUEST_LIMIT = 8 << 20
RESPONSE_LIMIT = 32 << 20
TRANSCRIPT_STREAM_LIMIT = 4 << 20
# The API paths an agent may call, below the route's base URL, and the request field
# that bounds the tokens each one may produce.
OUTPUT_LIMIT_FIELD = {
    "/chat/completions": "max_tokens",
    "/completions": "max_tokens",
    "/responses": "max_output_tokens",
    "/messages": "max_tokens",
}
# The paths of each API a provider may speak (ModelRoute.api).
API_PATHS = {
    "openai": ("/chat/completions", "/completions", "/responses"),
    "anthropic": ("/messages",),
}
API_NAMES = {"openai": "OpenAI", "anthropic": "Anthropic"}
FORWARDED_HEADERS = ("accept", "anthropic-version", "anthropic-beta", "openai-beta")
# Provider reply headers a client needs to pace itself, passed back unchanged.
RETURNED_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry")
RETURNED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
# Anthropic counts prompt-cache writes and reads apart from input_tokens.
INPUT_FIELDS = ("prompt_tokens", "input_tokens")
CACHE_INPUT_FIELDS = ("cache_creation_input_tokens", "cache_read_input_tokens")
OUTPUT_FIELDS = ("completion_tokens", "output_tokens")


class TranscriptEntry(BaseModel):
    """One line of ``transcript.jsonl``: one request and what came back."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    seq: int
    at: float
    path: str
    status: int
    duration_sec: float
    stream: bool
    request: dict[str, Any]
    response: Any = None
    usage: dict[str, int] = {}
    usage_estimated: bool = False
    error: str | None = None
    # The agent's try of this call (its X-Cairn-Attempt header): 2 and up are retries.
    attempt: int = 1


def export_entry(entry: TranscriptEntry, policy: Literal["full", "metadata"]) -> JSONObject:
    """An entry as it may leave the host: ``full`` as recorded, ``metadata`` without any
    prompt, tool argument or completion text (sizes, tools, usage and status only)."""
    data = entry.model_dump(mode="json")
    if policy == "full":
        return data
    request = entry.request
    messages = request.get("messages") or request.get("input") or []
    data["request"] = {
        "model": request.get("model"),
        "messages": len(messages) if isinstance(messages, list) else 1,
        "request_bytes": len(json.dumps(request)),
        "tools": sorted(
            str(t.get("function", t).get("name", ""))
            for t in request.get("tools", [])
            if isinstance(t, dict)
        ),
    }
    data["response"] = {"response_bytes": len(json.dumps(entry.response))}
    return data


def usage_of(event: object) -> dict[str, int]:
    """Input/output token counts of one response object or stream event (empty if none).

    Knows the chat-completions, responses and messages shapes: ``usage`` at the top, or
    under ``response`` / ``message``.
    """
    if not isinstance(event, dict):
        return {}
    holders = [event, event.get("response"), event.get("message")]
    for holder in holders:
        usage = holder.get("usage") if isinstance(holder, dict) else None
        if not isinstance(usage, dict):
            continue
        found: dict[str, int] = {}
        for key in INPUT_FIELDS:
            if isinstance(usage.get(key), int):
                found["input"] = usage[key]
        cached = sum(usage[key] for key in CACHE_INPUT_FIELDS if isinstance(usage.get(key), int))
        if cached:
            found["input"] = found.get("input", 0) + cached
        for key in OUTPUT_FIELDS:
            if isinstance(usage.get(key), int):
                found["output"] = usage[key]
        if found:
            return found
    return {}


def _choices(body: Mapping[str, JSONValue]) -> int:
    """How many answers one call asks for (``n``, ``best_of``): each may use the cap."""
    asked = [body.get(key) for key in ("n", "best_of")]
    return max([1, *(n for n in asked if isinstance(n, int) and not isinstance(n, bool))])


def _merge_usage(total: dict[str, int], seen: dict[str, int]) -> None:
    # Stream events repeat cumulative counts (e.g. message_start, then message_delta).
    for key, value in seen.items():
        total[key] = max(total.get(key, 0), value)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    relay: ModelRelay

    def verify_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> bool:
        assert isinstance(request, socket.socket)  # a stream server's request: its connection
        creds = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != self.relay.owner_uid:
            log.warning("refused model socket connection from uid %d", uid)
            return False
        return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        log.debug("relay: " + format, *args)

    def do_GET(self) -> None:
        relay = self.server.relay
        if self.headers.get("Upgrade", "").strip().lower() == "websocket":
            # 426 is what a Responses client over WebSocket (codex) takes as "use HTTP" at
            # once; any other refusal it retries for seconds before it falls back.
            # %r: the path is the agent's words, and a log line reaches terminals
            log.info("the agent asked for a WebSocket on %r; told to use HTTP (426)",
                     urlsplit(self.path).path)
            self._reply_error(426, "upgrade_required",
                              "the model relay speaks HTTP only; send the request as a POST",
                              {"Connection": "close"})
            self.close_connection = True
        elif self._api_path() == "/models":
            model = {"id": relay.route.model, "object": "model", "owned_by": relay.route.provider}
            self._reply_json(200, {"object": "list", "data": [model]})
        else:
            self._reply_error(404, "not_found", f"no such endpoint {self.path}")

    def do_POST(self) -> None:
        self.server.relay.handle(self)

    def _api_path(self) -> str:
        path = urlsplit(self.path).path.rstrip("/")
        return path[3:] if path.startswith("/v1/") else path

    def _reply_json(
        self, status: int, body: Mapping[str, object], headers: dict[str, str] | None = None
    ) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)

    def _reply_error(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        body = {"error": {"message": message, "type": code, "code": code}}
        self._reply_json(status, body, headers)

    def _attempt(self) -> int:
        """The client's try of this call, as it says (1 if it says nothing sensible)."""
        value = self.headers.get(MODEL_ATTEMPT_HEADER, "1").strip()
        return int(value) if value.isdigit() and 1 <= int(value) <= 1000 else 1


class EgressConnection(http.client.HTTPConnection):
    """HTTP(S) to ``netloc`` through the run's egress socket: ``CONNECT`` there, then TLS
    from here, so the egress process relays only ciphertext."""

    def __init__(self, egress: Path, netloc: str, *, tls: bool, timeout: float) -> None:
        super().__init__(netloc, timeout=timeout)
        self.egress = egress
        self.tls = tls

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.egress))
            host = f"[{self.host}]" if ":" in self.host else self.host
            target = f"{host}:{self.port}"
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(1024)
                if not chunk or len(head) > 16384:
                    raise OSError(f"the egress closed the tunnel to {target}")
                head += chunk
            status = head.split(b"\r\n", 1)[0].decode("latin-1")
            if status.split(" ")[1:2] != ["200"]:
                raise OSError(f"the egress refused {target}: {status}")
            if self.tls:
                context = ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class ModelRelay:
    """Serve one agent operation's model socket until :meth:`close`."""

    def __init__(
        self,
        socket_path: Path,
        *,
        route: ModelRoute,
        owner_uid: int,
        transcript: Path,
        budget: TokenBudget,
        egress: Path | None = None,
        on_spend: Callable[[int, int], None] | None = None,
        money: MoneyBudget | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.on_spend = on_spend
        self.egress = egress
        self.route = route
        self.owner_uid = owner_uid
        self.transcript = transcript
        self.budget = budget
        self.money = money or MoneyBudget(None)
        self._key = ""
        self._lock = threading.Lock()
        self._seq = 0
        self._counts = {"requests": 0, "refused": 0, "failed": 0, "retries": 0}
        self._tokens = {"input": 0, "output": 0, "estimated": 0}
        self._cost = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def usage(self) -> dict[str, int]:
        """Requests and tokens of this operation (for ``boundary.json``)."""
        with self._lock:
            return {
                **self._counts,
                "input_tokens": self._tokens["input"],
                "output_tokens": self._tokens["output"],
                "estimated_tokens": self._tokens["estimated"],
                "total_tokens": sum(self._tokens.values()),
                **({"cost_micros": self._cost} if self.route.priced else {}),
            }

    def start(self) -> None:
        """Load the credential, bind the socket (mode 0666; SO_PEERCRED decides) and serve."""
        self._key = load_credential(self.route)
        self.socket_path.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        self.transcript.parent.mkdir(parents=True, exist_ok=True)
        self.transcript.touch()
        server = _Server(str(self.socket_path), _Handler)
        server.relay = self
        os.chmod(self.socket_path, 0o666)  # noqa: S103  (SO_PEERCRED decides)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"relay-{self.socket_path.name}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, remove the socket and forget the key."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        self._key = ""

    def __enter__(self) -> ModelRelay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spend(self, tokens: int, micros: int = 0) -> None:
        """Charge the run's budgets and have ``on_spend`` record the tokens and their cost
        durably, so an attempt that crashes after this call still counts after a restart
        (and the cost in its owner's day, which the next call reads)."""
        self.budget.charge(tokens)
        self.money.charge(micros)
        if tokens and self.on_spend is not None:
            try:
                self.on_spend(tokens, micros)
            except Exception:  # the reply already reached the agent; the budget counted it
                log.exception("could not record %d model tokens in the journal", tokens)

    # --- one request ----------------------------------------------------------------

    def handle(self, handler: _Handler) -> None:
        started = time.monotonic()
        api_path = handler._api_path()
        limit_field = OUTPUT_LIMIT_FIELD.get(api_path)
        if limit_field is None:
            self._discard_body(handler)
            handler._reply_error(404, "not_found", f"the relay does not serve {handler.path}")
            return
        if api_path not in API_PATHS[self.route.api]:
            self._discard_body(handler)
            handler._reply_error(
                404, "not_found",
                f"this profile's provider ({self.route.provider}) speaks the "
                f"{API_NAMES[self.route.api]} API; the agent asked for {handler.path}",
            )
            return
        body = self._read_body(handler)
        if body is None:
            return
        attempt = handler._attempt()
        # Every reply below goes out only after its call is counted and recorded, so whoever
        # reads the usage or the transcript after a reply finds the call there.
        choices = _choices(body)
        input_tokens = len(json.dumps(body)) // 4 + 1  # what it costs, about, before usage
        tokens = min(self.budget.remaining(), self.route.max_tokens_per_call)  # all answers'
        cap, held = self.money.hold(cost_micros(self.route, {"input": input_tokens}),
                                    self.route.output_price_per_million or 0, tokens) \
            if tokens else (0, 0)
        try:
            if cap // choices == 0:
                self._refuse_for_budget(handler, api_path, started, body, attempt)
                return
            self._shape_request(body, api_path, limit_field, cap // choices)
            self._forward(handler, api_path, started, body, attempt,
                          {"input": input_tokens, "output": cap})
        finally:
            self.money.release(held)

    def _refuse_for_budget(self, handler: _Handler, api_path: str, started: float,
                           body: JSONObject, attempt: int) -> None:
        """Answer 429 for a call no budget left can pay, saying which."""
        spent = self.money.spent()
        if spent is not None:
            reason = spent.reason
        elif self.budget.exhausted:
            reason = f"the run's model token budget ({self.budget.limit}) is spent"
        else:
            reason = "the model money left does not pay for this call"
        with self._lock:
            self._counts["refused"] += 1
        log.warning("relay refused a model call: %s", reason)
        self._record(api_path, 429, started, False, body, None, {}, False, "budget spent", attempt)
        handler._reply_error(
            429, "insufficient_quota", f"{reason}; finish now", {REFUSED_HEADER: "budget"},
        )

    def _forward(self, handler: _Handler, api_path: str, started: float,
                 body: JSONObject, attempt: int, most: dict[str, int]) -> None:
        """Send the shaped call to the provider and its answer back, metered; ``most``:
        the tokens it may cost at most, charged when the answer is cut off after the
        provider accepted the call (what it used is then unknown)."""
        stream = bool(body.get("stream"))
        try:
            conn, upstream = self._connect(api_path)
            conn.request(
                "POST",
                upstream,
                body=json.dumps(body).encode(),
                headers=self._upstream_headers(handler),
            )
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            with self._lock:
                self._counts["failed"] += 1
            message = f"provider {self.route.provider} is unreachable: {exc}"
            self._record(api_path, 502, started, stream, body, None, {}, False, message, attempt)
            handler._reply_error(502, "upstream_unreachable", message)
            return
        # The client sees the last byte only after the call is metered and recorded, so
        # whoever reads the usage after a reply finds this call in it.
        raw = b""
        tail = b""
        streamed = response.getheader("Content-Type", "").startswith("text/event-stream")
        try:
            if streamed:
                text, usage, tail = self._pass_stream(handler, response)
                recorded: JSONValue = text
            else:
                raw = response.read(RESPONSE_LIMIT + 1)
                if len(raw) > RESPONSE_LIMIT:
                    raise http.client.HTTPException(f"response over {RESPONSE_LIMIT} bytes")
                if response.length:  # read(amt) returns what came before a close, silently
                    raise http.client.IncompleteRead(raw, response.length)
                recorded = _json_or_text(raw)
                usage = usage_of(recorded) if response.status < 400 else {}
        except (OSError, http.client.HTTPException) as exc:
            with self._lock:
                self._counts["failed"] += 1
            handler.close_connection = True
            message = f"relay interrupted: {exc}"
            cut = most if response.status < 400 else {}  # the provider may have used it all
            if cut:
                self._meter(cut)
            self._record(
                api_path, response.status, started, stream, body, None, cut, bool(cut), message,
                attempt,
            )
            if not streamed:
                handler._reply_error(502, "upstream_failed", message)
            return
        finally:
            conn.close()
        estimated = not usage and response.status < 400
        if estimated:
            # Without usage from the provider, a call still costs about a token per 4 bytes.
            size = len(json.dumps(body)) + len(json.dumps(recorded))
            usage = {"estimated": size // 4 + 1}
        self._meter(usage)
        self._record(
            api_path, response.status, started, stream, body, recorded, usage, estimated, None,
            attempt,
        )
        if streamed:
            handler.wfile.write(tail)
            handler.wfile.flush()
            return
        handler.send_response(response.status)
        handler.send_header("Content-Type", response.getheader("Content-Type", "application/json"))
        handler.send_header("Content-Length", str(len(raw)))
        for header, text in _returned_headers(response):
            handler.send_header(header, text)
        handler.end_headers()
        handler.wfile.write(raw)

    def _meter(self, usage: dict[str, int]) -> None:
        """Charge one call's ``usage`` (tokens by kind) and its cost, and count it."""
        cost = cost_micros(self.route, usage)
        self.spend(sum(usage.values()), cost)
        with self._lock:
            self._counts["requests"] += 1
            self._cost += cost
            for key, value in usage.items():
                self._tokens[key] += value

    @staticmethod
    def _discard_body(handler: _Handler) -> None:
        """Read the body of a request that is refused whatever it says, so the client
        gets the refusal rather than a connection reset while it is still sending."""
        length = handler.headers.get("Content-Length", "")
        if length.isdigit() and int(length) <= REQUEST_LIMIT:
            handler.rfile.read(int(length))
        else:
            handler.close_connection = True

    def _read_body(self, handler: _Handler) -> JSONObject | None:
        try:
            length = int(handler.headers.get("Content-Length", ""))
        except ValueError:
            handler._reply_error(411, "invalid_request_error", "Content-Length is required")
            handler.close_connection = True
            return None
        if not 0 < length <= REQUEST_LIMIT:
            handler._reply_error(
                413, "invalid_request_error", f"requests are limited to {REQUEST_LIMIT} bytes"
            )
            handler.close_connection = True
            return None
        try:
            body = json.loads(handler.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            handler._reply_error(400, "invalid_request_error", "the body must be a JSON object")
            return None
        return body

    def _shape_request(
        self, body: JSONObject, api_path: str, limit_field: str, remaining: int
    ) -> None:
        body["model"] = self.route.model
        cap = min(self.route.max_tokens_per_call, remaining)
        fields = [limit_field]
        if api_path == "/chat/completions":
            fields.append("max_completion_tokens")
        present = {f: value for f in fields if isinstance(value := body.get(f), int)}
        for name, value in present.items():
            body[name] = max(1, min(value, cap))
        if not present:
            body[limit_field] = cap
        if body.get("stream") and api_path in ("/chat/completions", "/completions"):
            options = body.get("stream_options")
            body["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }

    def _connect(self, api_path: str) -> tuple[http.client.HTTPConnection, str]:
        url = urlsplit(self.route.base_url)
        conn: http.client.HTTPConnection
        if self.egress is not None:
            conn = EgressConnection(
                self.egress, url.netloc, tls=url.scheme == "https", timeout=self.route.timeout_sec
            )
        elif url.scheme == "https":
            conn = http.client.HTTPSConnection(url.netloc, timeout=self.route.timeout_sec)
        else:
            conn = http.client.HTTPConnection(url.netloc, timeout=self.route.timeout_sec)
        return conn, url.path.rstrip("/") + api_path

    def _upstream_headers(self, handler: _Handler) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "cairn-relay"}
        for name in FORWARDED_HEADERS:
            value = handler.headers.get(name)
            if value is not None:
                headers[name] = value
        if self._key:
            scheme = self.route.auth_scheme
            headers[self.route.auth_header] = f"{scheme} {self._key}" if scheme else self._key
        return headers

    def _pass_stream(
        self, handler: _Handler, response: http.client.HTTPResponse
    ) -> tuple[str, dict[str, int], bytes]:
        """Send headers and every chunk but the last; return (kept text, usage, last)."""
        handler.send_response(response.status)
        handler.send_header("Content-Type", response.getheader("Content-Type", ""))
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        for header, text in _returned_headers(response):
            handler.send_header(header, text)
        handler.end_headers()
        handler.close_connection = True
        usage: dict[str, int] = {}
        kept: list[bytes] = []
        kept_size = 0
        pending = b""
        held = b""
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            if held:
                handler.wfile.write(held)
                handler.wfile.flush()
            held = chunk
            if kept_size < TRANSCRIPT_STREAM_LIMIT:
                kept.append(chunk)
                kept_size += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    _merge_usage(usage, usage_of(_json_or_text(line[5:].strip())))
        if pending.startswith(b"data:"):
            _merge_usage(usage, usage_of(_json_or_text(pending[5:].strip())))
        return b"".join(kept).decode(errors="replace"), usage, held

    def _record(
        self,
        api_path: str,
        status: int,
        started: float,
        stream: bool,
        request: JSONObject,
        response: JSONValue,
        usage: dict[str, int],
        estimated: bool,
        error: str | None,
        attempt: int,
    ) -> None:
        with self._lock:
            self._seq += 1
            self._counts["retries"] += int(attempt > 1)
            entry = TranscriptEntry(
                seq=self._seq,
                at=time.time(),
                path=api_path,
                status=status,
                duration_sec=round(time.monotonic() - started, 3),
                stream=stream,
                request=request,
                response=response,
                usage=usage,
                usage_estimated=estimated,
                error=error,
                attempt=attempt,
            )
            line = entry.model_dump_json()
            if self._key:
                line = line.replace(self._key, "[credential]")
            with open(self.transcript, "a") as fh:
                fh.write(line + "\n")


def _returned_headers(response: http.client.HTTPResponse) -> list[tuple[str, str]]:
    """The provider's pacing headers (Retry-After, rate-limit state), to pass back."""
    return [
        (name, value)
        for name, value in response.getheaders()
        if name.lower() in RETURNED_HEADERS or name.lower().startswith(RETURNED_PREFIXES)
    ]


def _json_or_text(raw: bytes) -> JSONValue:
    try:
        value: JSONValue = json.loads(raw)
        return value
    except (ValueError, UnicodeDecodeError):
        return raw.decode(errors="replace")
