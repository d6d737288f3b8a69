"""The model relay against a real chat-completions server on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.config import ConfigError
from cairn.coordinator.budget import TokenBudget
from cairn.coordinator.relay import (
    ModelRelay,
    TranscriptEntry,
    export_entry,
    usage_of,
)
from cairn.errors import NotFound, PermissionDenied, ValidationFailed
from cairn.protocol.launch import ModelRoute
from cairn.providers import load_credential, load_providers
from cairn.unixhttp import UnixHTTPConnection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_provider import FakeProvider, Turn  # noqa: E402

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "credentials"
    directory.mkdir()
    (directory / "cairn-provider-fake").write_text(KEY + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(directory))
    return directory


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    turns = [Turn(content="first answer", tokens=7), Turn(content="second answer", tokens=9)]
    with FakeProvider(turns, require_key=KEY) as fake:
        yield fake


def _route(provider: FakeProvider, **changes: Any) -> ModelRoute:
    return ModelRoute(provider="fake", base_url=provider.base_url, model="fake-model-1",
                      credential="cairn-provider-fake", max_tokens_per_call=500, **changes)


def _relay(tmp_path: Path, route: ModelRoute, budget: TokenBudget) -> ModelRelay:
    return ModelRelay(tmp_path / "sock" / "op.model.sock", route=route, owner_uid=os.getuid(),
                      transcript=tmp_path / "transcript.jsonl", budget=budget)


def _post(relay: ModelRelay, body: dict[str, Any], path: str = "/v1/chat/completions",
          headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    conn = UnixHTTPConnection(str(relay.socket_path), 10)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("Content-Type", "")
    finally:
        conn.close()


def _transcript(path: Path) -> list[TranscriptEntry]:
    return [TranscriptEntry.model_validate_json(line) for line in path.read_text().splitlines()]


def test_relay_adds_the_key_forces_the_model_and_meters_tokens(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    budget = TokenBudget(10_000)
    with _relay(tmp_path, _route(provider), budget) as relay:
        status, raw, _ = _post(relay, {
            "model": "something-else", "max_tokens": 100_000,
            "messages": [{"role": "user", "content": "hello"}],
        }, headers={"Authorization": "Bearer dummy-from-agent"})
        assert status == 200
        assert json.loads(raw)["choices"][0]["message"]["content"] == "first answer"
        usage = relay.usage
    (received,) = provider.requests
    assert received.headers["authorization"] == f"Bearer {KEY}"
    assert received.body["model"] == "fake-model-1"
    assert received.body["max_tokens"] == 500
    prompt_tokens = len(json.dumps(received.body).encode()) // 4
    assert usage["input_tokens"] == prompt_tokens
    assert usage["output_tokens"] == 7
    assert usage["requests"] == 1
    assert budget.used == prompt_tokens + 7
    (entry,) = _transcript(tmp_path / "transcript.jsonl")
    assert entry.status == 200 and entry.usage == {"input": prompt_tokens, "output": 7}
    assert entry.request["messages"][0]["content"] == "hello"
    assert KEY not in (tmp_path / "transcript.jsonl").read_text()
    assert not relay.socket_path.exists()


def test_streaming_passes_through_and_counts_the_usage_chunk(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    budget = TokenBudget(10_000)
    with _relay(tmp_path, _route(provider), budget) as relay:
        status, raw, content_type = _post(relay, {
            "stream": True, "messages": [{"role": "user", "content": "stream please"}],
        })
        usage = relay.usage
    assert status == 200 and content_type == "text/event-stream"
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    words = "".join(
        json.loads(e)["choices"][0]["delta"].get("content", "")
        for e in events[:-1] if json.loads(e)["choices"]
    )
    assert words.strip() == "first answer"
    (received,) = provider.requests
    assert received.body["stream_options"] == {"include_usage": True}
    assert usage["output_tokens"] == 7 and usage["estimated_tokens"] == 0
    (entry,) = _transcript(tmp_path / "transcript.jsonl")
    assert entry.stream
    assert "data: [DONE]" in entry.response


def test_a_spent_budget_refuses_without_calling_the_provider(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    budget = TokenBudget(limit=30)
    with _relay(tmp_path, _route(provider), budget) as relay:
        first, _, _ = _post(relay, {"messages": [{"role": "user", "content": "x" * 400}]})
        assert first == 200
        assert budget.exhausted
        second, raw, _ = _post(relay, {"messages": [{"role": "user", "content": "again"}]})
        usage = relay.usage
    assert second == 429
    assert json.loads(raw)["error"]["code"] == "insufficient_quota"
    assert len(provider.requests) == 1
    assert usage["refused"] == 1 and usage["requests"] == 1
    entries = _transcript(tmp_path / "transcript.jsonl")
    assert [e.status for e in entries] == [200, 429]


def test_max_tokens_is_capped_by_what_is_left_of_the_budget(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    with _relay(tmp_path, _route(provider), TokenBudget(limit=120)) as relay:
        _post(relay, {"max_completion_tokens": 400,
                      "messages": [{"role": "user", "content": "hi"}]})
    assert provider.requests[0].body["max_completion_tokens"] == 120
    assert "max_tokens" not in provider.requests[0].body


def test_unknown_paths_and_bad_bodies_are_refused(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    with _relay(tmp_path, _route(provider), TokenBudget(1000)) as relay:
        assert _post(relay, {}, path="/v1/files")[0] == 404
        conn = UnixHTTPConnection(str(relay.socket_path), 10)
        conn.request("POST", "/v1/chat/completions", body=b"[1, 2]")
        assert conn.getresponse().status == 400
        conn.close()
        conn = UnixHTTPConnection(str(relay.socket_path), 10)
        conn.request("GET", "/v1/models")
        models = json.loads(conn.getresponse().read())
        conn.close()
    assert [m["id"] for m in models["data"]] == ["fake-model-1"]
    assert provider.requests == []


def test_the_relay_serves_only_the_api_its_provider_speaks(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    """A CLI that speaks both APIs (opencode) must not reach an OpenAI-type provider with
    Anthropic's /v1/messages, nor the other way round: the agent is told which it is."""
    with _relay(tmp_path, _route(provider), TokenBudget(1000)) as relay:
        status, body, _ = _post(relay, {"messages": []}, path="/v1/messages")
    assert status == 404
    assert json.loads(body)["error"]["message"] == (
        "this profile's provider (fake) speaks the OpenAI API; the agent asked for "
        "/v1/messages")
    anthropic = _route(provider, api="anthropic")
    with _relay(tmp_path, anthropic, TokenBudget(1000)) as relay:
        status, body, _ = _post(relay, {"messages": []}, path="/v1/chat/completions")
        assert status == 404 and b"speaks the Anthropic API" in body
        assert provider.requests == []
        _post(relay, {"messages": [{"role": "user", "content": "hi"}]}, path="/v1/messages")
    (forwarded,) = provider.requests  # the fake knows no /messages; the relay sent it on
    assert forwarded.path.endswith("/v1/messages")
    assert forwarded.body["model"] == "fake-model-1" and forwarded.body["max_tokens"] == 500


def test_a_websocket_upgrade_is_told_to_use_http(
    tmp_path: Path, credentials: Path, provider: FakeProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="cairn.coordinator.relay")
    with _relay(tmp_path, _route(provider), TokenBudget(1000)) as relay:
        conn = UnixHTTPConnection(str(relay.socket_path), 10)
        conn.request("GET", "/v1/responses", headers={
            "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        response = conn.getresponse()
        body = json.loads(response.read())
        conn.close()
    assert response.status == 426
    assert body["error"]["message"] == ("the model relay speaks HTTP only; send the request "
                                        "as a POST")
    assert provider.requests == []
    assert "the agent asked for a WebSocket on '/v1/responses'; told to use HTTP (426)" in (
        caplog.text)


def test_an_agents_path_reaches_the_log_escaped(
    tmp_path: Path, credentials: Path, provider: FakeProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The path is the agent's: a terminal escape in it never reaches a log line raw."""
    caplog.set_level("INFO", logger="cairn.coordinator.relay")
    with (_relay(tmp_path, _route(provider), TokenBudget(1000)) as relay,
          socket.socket(socket.AF_UNIX) as sock):
        sock.connect(str(relay.socket_path))
        sock.sendall(b"GET /v1/\x1b[31mred HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 426 ")
    assert "asked for a WebSocket on '/v1/\\x1b[31mred'" in caplog.text
    assert "\x1b" not in caplog.text


def test_an_unreachable_provider_is_a_502_not_a_crash(tmp_path: Path, credentials: Path) -> None:
    route = ModelRoute(provider="gone", base_url="http://127.0.0.1:9/v1", model="m",
                       credential="cairn-provider-fake", timeout_sec=5)
    with _relay(tmp_path, route, TokenBudget(1000)) as relay:
        status, raw, _ = _post(relay, {"messages": []})
        assert status == 502
        assert json.loads(raw)["error"]["code"] == "upstream_unreachable"
        assert relay.usage["failed"] == 1


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_other_users_cannot_use_the_relay(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    with tempfile.TemporaryDirectory() as public:
        os.chmod(public, 0o755)
        relay = _relay(Path(public), _route(provider), TokenBudget(1000))
        relay.start()
        client = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\n"
            "try:\n"
            "    s.sendall(b'GET /v1/models HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
            "    print(repr(s.recv(100)))\n"
            "except OSError:\n"
            "    print('closed')\n"
        )
        try:
            proc = subprocess.run([sys.executable, "-c", client, str(relay.socket_path)],
                                  user=65534, capture_output=True, text=True, timeout=30,
                                  check=False)
        finally:
            relay.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("b''", "closed")
    assert provider.requests == []


def test_a_missing_credential_stops_the_relay_from_starting(
    tmp_path: Path, credentials: Path, provider: FakeProvider
) -> None:
    (credentials / "cairn-provider-fake").unlink()
    with pytest.raises(NotFound, match="credential cairn-provider-fake"):
        _relay(tmp_path, _route(provider), TokenBudget(1000)).start()


def test_credentials_come_only_from_the_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = ModelRoute(provider="p", base_url="https://example.invalid/v1", model="m",
                       credential="key")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(PermissionDenied, match="no credentials"):
        load_credential(route)
    (tmp_path / "key").write_text("two words\n")
    with pytest.raises(ValidationFailed):
        load_credential(route, str(tmp_path))
    assert load_credential(route.model_copy(update={"credential": ""}), str(tmp_path)) == ""


def test_providers_file(tmp_path: Path) -> None:
    file = tmp_path / "providers.toml"
    assert load_providers(file).providers == {}
    file.write_text(
        'default = "local"\n[providers.local]\nbase_url = "http://127.0.0.1:11434/v1"\n'
        'model = "qwen"\nmax_tokens_per_call = 2048\n'
    )
    route = load_providers(file).route()
    assert (route.provider, route.model, route.credential, route.max_tokens_per_call) == (
        "local", "qwen", "", 2048
    )
    assert route.api == "openai"  # when not said
    with pytest.raises(NotFound, match="not configured"):
        load_providers(file).route("openai")
    file.write_text('[providers.claude]\napi = "anthropic"\nbase_url = "https://a.test/v1"\n'
                    'model = "m"\n')
    assert load_providers(file).route("claude").api == "anthropic"
    file.write_text('[providers.x]\napi = "gemini"\nbase_url = "https://a.test/v1"\n'
                    'model = "m"\n')
    with pytest.raises(ConfigError, match=r"providers\.x\.api: .*'openai' or 'anthropic'"):
        load_providers(file)
    file.write_text('default = "x"\n')
    with pytest.raises(ConfigError, match=r"providers.toml: default: default provider 'x'"):
        load_providers(file)
    file.write_text('[providers.bad]\nbase_url = "ftp://h"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match=r"providers\.bad\.base_url: .*got 'ftp://h'"):
        load_providers(file)


def test_usage_shapes_and_metadata_export() -> None:
    assert usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == {
        "input": 3, "output": 4
    }
    assert usage_of({"type": "message_start", "message": {"usage": {"input_tokens": 5}}}) == {
        "input": 5
    }
    assert usage_of({"type": "response.completed",
                     "response": {"usage": {"input_tokens": 1, "output_tokens": 2}}}) == {
        "input": 1, "output": 2
    }
    assert usage_of({"choices": []}) == {}
    entry = TranscriptEntry(
        seq=1, at=0.0, path="/chat/completions", status=200, duration_sec=0.1, stream=False,
        request={"model": "m", "messages": [{"role": "user", "content": "secret plan"}],
                 "tools": [{"type": "function", "function": {"name": "bash"}}]},
        response={"choices": [{"message": {"content": "secret answer"}}]},
        usage={"input": 1, "output": 2},
    )
    exported = json.dumps(export_entry(entry, "metadata"))
    assert "secret" not in exported
    assert json.loads(exported)["request"]["tools"] == ["bash"]
    assert "secret plan" in json.dumps(export_entry(entry, "full"))
