"""``cairn provider test NAME``: one small request to a provider through the model relay a
run uses, with the key the coordinator would get.

Root's ``cairn provider test`` starts this as user ``cairn`` in a transient unit with the
coordinator's ``ImportCredential=cairn-provider-*``, so a key that is missing, unreadable
or wrongly named fails here as it would in a run. The relay adds the key, forces the
route's model and caps the answer at :data:`PROBE_TOKENS`; the provider is reached
directly, not through a run's egress unit (there is no run). Prints one line, the model's
answer or the provider's error, and exits 0 or 1.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from cairn import journald
from cairn.coordinator.budget import TokenBudget
from cairn.coordinator.relay import ModelRelay
from cairn.errors import CairnError
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.protocol.launch import ModelRoute
from cairn.protocol.names import is_provider_name
from cairn.providers import load_providers
from cairn.terminal import printable
from cairn.unixhttp import UnixHTTPConnection

PROBE_TOKENS = 64
PROMPT = "Reply with the single word: ready"
ANSWER_LIMIT = 200


# Anthropic's API refuses a request without its version header (the relay passes it on).
ANTHROPIC_VERSION = "2023-06-01"


def request_body(route: ModelRoute) -> tuple[str, JSONObject, dict[str, str]]:
    """The API path, body and headers of the probe's one call (the relay sets the model
    and adds the key)."""
    messages: list[JSONValue] = [{"role": "user", "content": PROMPT}]
    headers = {"Content-Type": "application/json"}
    if route.api == "anthropic":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        return "/v1/messages", {"messages": messages, "max_tokens": PROBE_TOKENS}, headers
    return "/v1/chat/completions", {"messages": messages, "max_tokens": PROBE_TOKENS}, headers


def answer_text(route: ModelRoute, body: object) -> str | None:
    """The model's text in a successful reply of ``route``'s API (None if it has none)."""
    if not isinstance(body, dict):
        return None
    if route.api == "anthropic":
        blocks = body.get("content")
        texts = [b.get("text") for b in blocks or [] if isinstance(b, dict)]
        return " ".join(t for t in texts if isinstance(t, str)) or None
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            return str(message["content"])
    return None


def error_text(body: object, raw: bytes) -> str:
    """What a provider's error reply says: ``error.message`` of both APIs, else its text."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return raw.decode("utf-8", "replace").strip() or "(no body)"


def _relay_error(body: object) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and str(error.get("type", "")).startswith("upstream_")


def shortened(text: str) -> str:
    text = printable(" ".join(text.split()))
    return text if len(text) <= ANSWER_LIMIT else text[: ANSWER_LIMIT - 1] + "…"


def probe(name: str) -> tuple[bool, str]:
    """Ask provider ``name`` once through a relay; (whether it answered, one line)."""
    route = load_providers().route(name)
    where = f"provider {name} ({route.model} at {route.base_url})"
    path, body, headers = request_body(route)
    with tempfile.TemporaryDirectory(prefix="cairn-probe-") as tmp:
        socket_path = Path(tmp) / "model.sock"
        relay = ModelRelay(
            socket_path,
            route=route,
            owner_uid=os.getuid(),
            transcript=Path(tmp) / "transcript.jsonl",
            budget=TokenBudget(PROBE_TOKENS * 4),
        )
        started = time.monotonic()
        with relay:
            conn = UnixHTTPConnection(str(socket_path), timeout=route.timeout_sec + 10)
            try:
                conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
                response = conn.getresponse()
                raw = response.read(1 << 20)
            finally:
                conn.close()
        elapsed = time.monotonic() - started
        usage = relay.usage
    try:
        reply: JSONValue = json.loads(raw)
    except ValueError:
        reply = None
    if response.status >= 400:
        message = shortened(error_text(reply, raw))
        if _relay_error(reply):  # the relay's own words: it could not reach the provider
            return False, f"{where}: {message}"
        return False, f"{where} answered {response.status}: {message}"
    answer = answer_text(route, reply)
    if answer is None:
        text = shortened(raw.decode("utf-8", "replace"))
        return False, f"{where} answered {response.status} without a message: {text}"
    tokens = usage["total_tokens"]
    return True, (
        f"{where} answered in {elapsed:.1f} s, {tokens} token{'s' if tokens != 1 else ''}: "
        f"{shortened(answer)}"
    )


def main() -> None:
    journald.setup_logging()
    if len(sys.argv) != 2 or not is_provider_name(sys.argv[1]):
        print("usage: python3 -m cairn.coordinator.probe PROVIDER", file=sys.stderr)
        sys.exit(2)
    try:
        ok, line = probe(sys.argv[1])
    except CairnError as exc:
        ok, line = False, f"provider {sys.argv[1]}: {exc}"
    print(printable(line), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
