"""Model tokens survive crashes honestly: the relay records every call's tokens in a real
journal as they are spent, and a restarted coordinator's budget counts the attempts that
crashed or were retried, not only committed boundaries."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_journal import RUN, description

from cairn.coordinator.budget import TokenBudget
from cairn.coordinator.core import tokens_used
from cairn.coordinator.relay import ModelRelay
from cairn.journal.readwrite import Journal
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import ModelRoute
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
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal(tmp_path / "journal.db", create=True) as j:
        j.create_run(description(), intents=[])
        token = j.acquire_lease(RUN, "first", ttl=60)
        call = CallRequest(scope="root", seq=1, kind="agent",
                           request={"descriptor": "implement", "prompt": "p", "title": "t"},
                           location="implement.py:1:1")
        j.record_requested(call, run_id=RUN, op_id="root-1", predecessor=None, token=token)
        j.update_op(RUN, "root-1", token=token, state="started")
        yield j


def ask(relay: ModelRelay) -> None:
    conn = UnixHTTPConnection(str(relay.socket_path), 10)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    finally:
        conn.close()


def relay_for(
    tmp_path: Path, provider: FakeProvider, budget: TokenBudget, journal_path: Path, attempt: int
) -> ModelRelay:
    def record(tokens: int, cost_micros: int) -> None:  # as Coordinator.token_recorder
        with Journal(journal_path) as j:  # a connection per call
            j.record_model_tokens(RUN, "root-1", attempt, tokens, cost_micros=cost_micros)

    route = ModelRoute(provider="fake", base_url=provider.base_url, model="fake-model-1",
                       credential="cairn-provider-fake", max_tokens_per_call=500)
    return ModelRelay(tmp_path / f"sock{attempt}" / "op.model.sock", route=route,
                      owner_uid=os.getuid(), transcript=tmp_path / f"t{attempt}.jsonl",
                      budget=budget, on_spend=record)


def test_a_crashed_attempts_tokens_count_after_a_restart(
    tmp_path: Path, credentials: Path, journal: Journal
) -> None:
    db = tmp_path / "journal.db"
    turns = [Turn(content="a", tokens=40), Turn(content="b", tokens=60),
             Turn(content="c", tokens=5)]
    with FakeProvider(turns, require_key=KEY) as provider:
        budget = TokenBudget(100_000)
        # Attempt 1 spends two calls, then its coordinator dies: no boundary is committed.
        with relay_for(tmp_path, provider, budget, db, attempt=1) as relay:
            ask(relay)
            ask(relay)
        crashed = budget.used
        assert crashed > 100  # prompt tokens plus 40 and 60 completion tokens

        # The restarted coordinator's budget starts from the journal, not from zero.
        spent = journal.model_tokens_spent(RUN)
        assert spent == {("root-1", 1): crashed}
        assert tokens_used(journal.list_ops(RUN), spent) == crashed

        # Attempt 2 spends one call and commits its boundary, reporting only its own usage.
        retried = TokenBudget(100_000, used=crashed)
        with relay_for(tmp_path, provider, retried, db, attempt=2) as relay:
            ask(relay)
            own = relay.usage["total_tokens"]
    token = journal.acquire_lease(RUN, "second", ttl=60, holder_is_dead=lambda _h: True)
    # the clean retry recovery records: the next attempt on a restored W
    journal.update_op(RUN, "root-1", token=token, attempt=2, state="requested")
    journal.update_op(RUN, "root-1", token=token, state="started")
    journal.update_op(RUN, "root-1", token=token, state="committed",
                      result={"usage": {"total_tokens": own}})
    spent = journal.model_tokens_spent(RUN)
    assert spent == {("root-1", 1): crashed, ("root-1", 2): own}
    # Both attempts count, the committed one once.
    assert tokens_used(journal.list_ops(RUN), spent) == crashed + own == retried.used


def test_a_boundary_committed_before_tokens_were_recorded_still_counts(journal: Journal) -> None:
    token = journal.acquire_lease(RUN, "first", ttl=60)
    journal.update_op(RUN, "root-1", token=token, state="committed",
                      result={"usage": {"total_tokens": 321}})
    assert tokens_used(journal.list_ops(RUN), journal.model_tokens_spent(RUN)) == 321


def test_a_journal_that_cannot_record_does_not_break_the_reply(
    tmp_path: Path, credentials: Path, journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeProvider([Turn(content="a", tokens=3)], require_key=KEY) as provider:
        budget = TokenBudget(100_000)
        missing = tmp_path / "gone" / "journal.db"
        with relay_for(tmp_path, provider, budget, missing, attempt=1) as relay:
            ask(relay)
    assert budget.used > 3  # the in-memory budget still counted the call
    assert "could not record" in caplog.text
    assert journal.model_tokens_spent(RUN) == {}
