"""The ``llm`` agent's model calls repeated after 429, 5xx and a dropped relay socket, with
the relay passing the provider's status and pacing headers through.

The relay and the provider are real servers (``tests/support/fake_provider.py`` on
loopback, :class:`ModelRelay` on a Unix socket); the agent's client runs in this process
with an injected clock, waiter and jitter, so no test waits.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest

from cairn.coordinator.budget import TokenBudget
from cairn.coordinator.relay import ModelRelay, TranscriptEntry
from cairn.errors import CairnError
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.launch import ModelRoute, ProfileSpec
from cairn.unixhttp import UnixHTTPConnection
from cairn.worker.llm import BudgetSpent, RelayClient, _Reply
from cairn.worker.retry import Backoff, retry_after, retryable_status

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_provider import FakeProvider, Turn  # noqa: E402

KEY = "sk-test-retry"
NOW = 1_800_000_000.0
RATE_LIMITED = {"message": "Rate limit reached for requests", "type": "requests",
                "code": "rate_limit_exceeded"}
MESSAGES = [{"role": "user", "content": "hello"}]


class Setup:
    """A fake provider behind a relay, and a client whose waits are only recorded."""

    def __init__(self, tmp_path: Path, turns: list[Turn], *, budget: int = 100_000,
                 attempts: int = 5, cap: float = 60.0, jitter: float = 0.5) -> None:
        self.provider = FakeProvider(turns, require_key=KEY).start()
        route = ModelRoute(provider="fake", base_url=self.provider.base_url, model="fake-1",
                           credential="cairn-provider-fake")
        self.transcript = tmp_path / "transcript.jsonl"
        self.relay = ModelRelay(tmp_path / "sock" / "op.model.sock", route=route,
                                owner_uid=os.getuid(), transcript=self.transcript,
                                budget=TokenBudget(budget))
        self.waits: list[float] = []
        self.notes: list[str] = []
        backoff = Backoff(attempts=attempts, cap=cap, wait=self.waits.append,
                          now=lambda: NOW, jitter=lambda: jitter)
        self.client = RelayClient(str(self.relay.socket_path), timeout=10, backoff=backoff,
                                  on_retry=self.notes.append)

    def entries(self) -> list[tuple[int, int]]:
        """(status, attempt) of every transcript entry."""
        lines = self.transcript.read_text().splitlines()
        return [(e.status, e.attempt) for e in map(TranscriptEntry.model_validate_json, lines)]

    def close(self) -> None:
        self.relay.close()
        self.provider.close()


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "cairn-provider-fake").write_text(KEY)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    made: list[Setup] = []

    def make(turns: list[Turn], start: bool = True, **options: Any) -> Setup:
        made.append(Setup(tmp_path, turns, **options))
        if start:
            made[-1].relay.start()
        return made[-1]

    yield make
    for one in made:
        one.close()


def _content(reply: dict[str, Any]) -> str:
    return str(reply["choices"][0]["message"]["content"])


def test_a_429_waits_the_advertised_time_and_the_retry_is_counted(setup: Any) -> None:
    s: Setup = setup([Turn(status=429, headers={"Retry-After": "3"}, error=RATE_LIMITED),
                      Turn(content="done")])
    assert _content(s.client.chat(MESSAGES, [])) == "done"
    assert s.waits == [3.0]
    assert s.client.retries == 1
    (note,) = s.notes
    assert "HTTP 429: Rate limit reached" in note and "retry 1 of 4 in 3.0s" in note
    assert s.entries() == [(429, 1), (200, 2)]
    usage = s.relay.usage
    assert usage["retries"] == 1 and usage["requests"] == 2
    assert usage["output_tokens"] == 10  # the refused call cost nothing


def test_503_twice_then_success_backs_off_exponentially_with_jitter(setup: Any) -> None:
    s: Setup = setup([Turn(status=503), Turn(status=503), Turn(content="done")], jitter=0.5)
    assert _content(s.client.chat(MESSAGES, [])) == "done"
    # base 1 s, factor 2; jitter 0.5 keeps three quarters of each step
    assert s.waits == [0.75, 1.5]
    assert s.entries() == [(503, 1), (503, 2), (200, 3)]
    assert s.relay.usage["retries"] == 2
    assert len(s.notes) == 2 and "HTTP 503" in s.notes[1]


def test_a_400_ends_at_once_with_the_providers_message(setup: Any) -> None:
    bad = {"message": "Invalid schema for function 'finish_work'", "type": "invalid_request_error",
           "code": None}
    s: Setup = setup([Turn(status=400, error=bad), Turn(content="never")])
    with pytest.raises(CairnError, match="refused with HTTP 400: Invalid schema"):
        s.client.chat(MESSAGES, [])
    assert s.waits == [] and s.notes == []
    assert len(s.provider.requests) == 1


def test_spent_attempts_end_with_the_last_status(setup: Any) -> None:
    s: Setup = setup([Turn(status=503), Turn(status=502)], attempts=3, cap=1.5, jitter=1.0)
    with pytest.raises(CairnError, match="failed 3 times; the last: HTTP 502") as caught:
        s.client.chat(MESSAGES, [])
    assert "model_attempts" in (caught.value.hint or "")
    assert s.waits == [1.0, 1.5]  # 2 s capped at 1.5 s
    assert s.entries() == [(503, 1), (502, 2), (502, 3)]


def test_a_refusal_for_the_runs_budget_is_not_retried(setup: Any) -> None:
    s: Setup = setup([Turn(content="never")], budget=0)
    with pytest.raises(BudgetSpent, match="token budget"):
        s.client.chat(MESSAGES, [])
    assert s.waits == [] and s.provider.requests == []
    assert s.entries() == [(429, 1)]
    assert s.relay.usage["refused"] == 1


def test_the_provider_accounts_quota_is_not_retried_either(setup: Any) -> None:
    quota = {"message": "You exceeded your current quota", "type": "insufficient_quota",
             "code": "insufficient_quota"}
    s: Setup = setup([Turn(status=429, error=quota), Turn(content="never")])
    with pytest.raises(CairnError, match="for its quota: You exceeded") as caught:
        s.client.chat(MESSAGES, [])
    assert not isinstance(caught.value, BudgetSpent)
    assert s.waits == [] and len(s.provider.requests) == 1


def test_retry_after_as_an_http_date(setup: Any) -> None:
    s: Setup = setup([Turn(status=429, headers={"Retry-After": formatdate(NOW + 7, usegmt=True)}),
                      Turn(status=503, headers={"Retry-After": formatdate(NOW - 30, usegmt=True)}),
                      Turn(content="done")])
    assert _content(s.client.chat(MESSAGES, [])) == "done"
    assert s.waits == [7.0, 0.0]  # a date already past means now


def test_retry_after_is_capped_and_milliseconds_win(setup: Any) -> None:
    s: Setup = setup([Turn(status=429, headers={"Retry-After": "3600"}),
                      Turn(status=429, headers={"Retry-After": "2", "retry-after-ms": "250"}),
                      Turn(content="done")], cap=60.0)
    assert _content(s.client.chat(MESSAGES, [])) == "done"
    assert s.waits == [60.0, 0.25]


def test_a_relay_socket_that_comes_back_is_retried(setup: Any) -> None:
    s: Setup = setup([Turn(content="done")], start=False)

    def relay_back(seconds: float) -> None:  # the coordinator restarts while we wait
        s.waits.append(seconds)
        s.relay.start()

    s.client.backoff.wait = relay_back
    assert _content(s.client.chat(MESSAGES, [])) == "done"
    assert s.waits == [0.75]
    assert "the model relay at" in s.notes[0] and "is unreachable" in s.notes[0]
    assert s.entries() == [(200, 2)]


def test_a_relay_socket_that_stays_away_ends_with_a_clear_error(setup: Any) -> None:
    s: Setup = setup([Turn(content="never")], start=False, attempts=2)
    with pytest.raises(CairnError, match="failed 2 times; the last: the model relay at .* is "
                       "unreachable"):
        s.client.chat(MESSAGES, [])
    assert len(s.waits) == 1


def test_the_relay_passes_status_and_pacing_headers_through(setup: Any) -> None:
    headers = {"Retry-After": "12", "retry-after-ms": "12000",
               "x-ratelimit-remaining-requests": "0", "x-request-id": "req_1"}
    s: Setup = setup([Turn(status=429, headers=headers, error=RATE_LIMITED),
                      Turn(status=529, headers={"Retry-After": "5"})], budget=100_000)
    for expected in (429, 529):
        conn = UnixHTTPConnection(str(s.relay.socket_path), 10)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"messages": []}).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = json.loads(response.read())
        got = {k.lower(): v for k, v in response.getheaders()}
        conn.close()
        assert response.status == expected
        if expected == 429:
            assert body["error"]["code"] == "rate_limit_exceeded"
            assert got["retry-after"] == "12" and got["retry-after-ms"] == "12000"
            assert got["x-ratelimit-remaining-requests"] == "0"
            assert "x-request-id" not in got
        else:
            assert got["retry-after"] == "5"
    assert s.entries() == [(429, 1), (529, 1)]


@pytest.mark.parametrize(("headers", "seconds"), [
    ({}, None),
    ({"retry-after": "4"}, 4.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after": "-3"}, None),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "nan"}, None),
    ({"retry-after": formatdate(NOW + 90, usegmt=True)}, 90.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
    ({"retry-after": formatdate(NOW + 5)}, 5.0),  # "-0000": GMT all the same
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
    ({"retry-after-ms": "x", "retry-after": "9"}, 9.0),
])
def test_retry_after_parsing(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers, NOW) == seconds


def test_which_statuses_are_retried() -> None:
    assert [s for s in (400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 529)
            if retryable_status(s, None)] == [408, 429, 500, 502, 503, 529]
    assert not retryable_status(429, "insufficient_quota")
    assert retryable_status(429, "rate_limit_exceeded")


def test_backoff_grows_to_its_cap() -> None:
    backoff = Backoff(cap=10.0, jitter=lambda: 1.0)
    assert [backoff.delay(n, None) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert Backoff(jitter=lambda: 0.0).delay(3, None) == 2.0
    assert backoff.delay(1, 30.0) == 10.0 and backoff.delay(1, 0.0) == 0.0


def test_the_profile_bounds_the_attempts() -> None:
    profile = ProfileSpec(name="p", kind="llm")
    assert (profile.model_attempts, profile.model_retry_cap_sec) == (5, 60.0)
    with pytest.raises(ValueError, match="model_attempts"):
        ProfileSpec(name="p", kind="llm", model_attempts=0)
    with pytest.raises(ValueError, match="model_retry_cap_sec"):
        ProfileSpec(name="p", kind="llm", model_retry_cap_sec=3600)


def test_error_messages_from_json_or_plain_bodies() -> None:
    html = b"<html>503 Service Unavailable</html>" + b" " * 1000
    assert _Reply(503, None, html, {}).error == (None, html[:300].decode())
    body: JSONObject = {"error": {"message": "overloaded " * 100, "type": "overloaded_error"}}
    code, message = _Reply(529, body, b"", {}).error
    assert code == "overloaded_error" and len(message) == 300
    assert _Reply(500, {"error": "boom"}, b"", {}).error == (None, "boom")
