"""Money budgets for model calls: what a call costs at the provider's prices, the run's
budget and its owner's daily one kept by the relay against a real HTTP provider and a
real journal, and the launch refusing a budget it could not keep."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_journal import RUN, description

from cairn import provider_setup as setup
from cairn.cli.runs import model_line
from cairn.coordinator.budget import MoneyBudget, TokenBudget
from cairn.coordinator.relay import ModelRelay, usage_of
from cairn.daemon.launch import resolve_limits
from cairn.errors import PermissionDenied, UsageError
from cairn.hostconfig import check_host_config
from cairn.journal.readwrite import Journal
from cairn.protocol.attestation import launch_hash_of
from cairn.protocol.launch import ModelRoute
from cairn.providers import cost_micros, load_providers, money, today
from cairn.unixhttp import UnixHTTPConnection
from cairn.views.run import model_facet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_provider import FakeProvider, Turn  # noqa: E402

OTHER_RUN = "flow_" + "b" * 32


def route(base_url: str = "http://127.0.0.1:1/v1", prices: tuple[float, float] | None = None
          ) -> ModelRoute:
    """The fake provider's route, priced per million input and output tokens."""
    return ModelRoute(provider="fake", base_url=base_url, model="fake-model-1",
                      max_tokens_per_call=500,
                      input_price_per_million=None if prices is None else prices[0],
                      output_price_per_million=None if prices is None else prices[1])


# 2.00 per million input tokens and 10.00 per million output tokens: an input token
# costs 2 micro-units, an output token 10.
PRICES = (2.0, 10.0)


def test_a_call_costs_its_tokens_at_the_providers_prices() -> None:
    priced = route(prices=PRICES)
    assert cost_micros(priced, {"input": 1000, "output": 100}) == 2000 + 1000
    # without usage from the provider the estimate is priced as output
    assert cost_micros(priced, {"estimated": 7}) == 70
    assert cost_micros(route(prices=(0.15, 0.6)),
                       {"input": 1, "output": 1}) == 1  # rounded up, never down
    assert cost_micros(route(), {"input": 10**6, "output": 10**6}) == 0  # unpriced
    assert money(0) == "0.00"
    assert money(1) == "0.01"  # a started cent shows
    assert money(2_500_000) == "2.50"


def test_prices_are_read_from_providers_toml(tmp_path: Path) -> None:
    file = tmp_path / "providers.toml"
    file.write_text('default = "p"\n[providers.p]\nbase_url = "https://api.example/v1"\n'
                    'model = "m"\ninput_price_per_million = 3\n'
                    'output_price_per_million = 15.5\n')
    frozen = load_providers(file).route()
    assert frozen.priced
    assert (frozen.input_price_per_million, frozen.output_price_per_million) == (3, 15.5)
    file.write_text(file.read_text().replace("= 3\n", "= -1\n"))
    with pytest.raises(Exception, match="input_price_per_million"):
        load_providers(file)


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Journal]:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    with Journal(tmp_path / "journal.db", create=True) as j:
        j.create_run(description(), intents=[])
        j.create_run(description(OTHER_RUN), intents=[])  # the same owner's second run
        yield j


def relay(tmp_path: Path, provider: FakeProvider, journal: Journal, run_id: str,
          money_budget: MoneyBudget) -> ModelRelay:
    """A relay as the coordinator makes it: cost recorded per call, the day read back."""

    def record(tokens: int, cost: int) -> None:
        with Journal(journal.path) as j:
            j.record_model_tokens(run_id, "root-1", 1, tokens, cost_micros=cost, day=today())

    return ModelRelay(tmp_path / run_id[-4:] / "m.sock", route=route(provider.base_url,
                      PRICES), owner_uid=os.getuid(), transcript=tmp_path / f"{run_id}.jsonl",
                      budget=TokenBudget(100_000), on_spend=record, money=money_budget)


def ask(model_relay: ModelRelay) -> tuple[int, dict[str, object]]:
    conn = UnixHTTPConnection(str(model_relay.socket_path), 10)
    try:
        body = {"model": "m", "max_tokens": 400,
                "messages": [{"role": "user", "content": "hello"}]}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def spent_today(journal: Journal) -> int:
    with Journal(journal.path) as j:
        return j.owner_cost_on(1001, today())


def test_the_relay_stops_a_run_at_its_money_budget(tmp_path: Path, journal: Journal) -> None:
    # 1 cent is 10,000 micro-units: 1,000 output tokens at 10 each.
    # The provider answers 400 tokens whatever it is asked (a real one keeps the cap).
    turns = [Turn(content=c, tokens=400) for c in "abcd"]
    budget = MoneyBudget(1, spent_today=lambda: spent_today(journal))
    with FakeProvider(turns) as provider, \
            relay(tmp_path, provider, journal, RUN, budget) as model_relay:
        answers = [ask(model_relay) for _ in range(4)]
        asked = [r.body.get("max_tokens") for r in provider.requests]
        usage = model_relay.usage
    statuses = [status for status, _ in answers]
    assert statuses[:3] == [200, 200, 200]
    # each call paid its input; the third could buy fewer output tokens than asked
    assert asked[0] == 400
    assert isinstance(asked[2], int) and asked[2] < 400
    assert statuses[3] == 429
    refusal = answers[3][1]["error"]
    assert isinstance(refusal, dict)
    assert refusal["message"] == "the run's model money budget (0.01) is spent; finish now"
    assert budget.used >= 10_000
    spend = journal.model_spend(RUN)
    assert spend.calls == 3
    assert spend.cost_micros == budget.used == usage["cost_micros"]
    assert spent_today(journal) == budget.used  # the owner's day counts it too
    spent = budget.spent()
    assert spent is not None and "limits.model_cost_cents" in spent.hint


def test_the_daily_budget_is_shared_by_the_owners_runs(tmp_path: Path, journal: Journal) -> None:
    turns = [Turn(content="x", tokens=400) for _ in range(4)]
    with FakeProvider(turns) as provider:
        first = MoneyBudget(None, daily_cents=1, spent_today=lambda: spent_today(journal))
        with relay(tmp_path, provider, journal, RUN, first) as model_relay:
            assert [ask(model_relay)[0] for _ in range(3)] == [200, 200, 200]
        assert spent_today(journal) >= 10_000
        # a second run of the same owner, with no run budget of its own
        second = MoneyBudget(None, daily_cents=1, spent_today=lambda: spent_today(journal))
        with relay(tmp_path, provider, journal, OTHER_RUN, second) as model_relay:
            status, answer = ask(model_relay)
        assert len(provider.requests) == 3  # the refused call never reached the provider
    assert status == 429
    assert "daily model money budget (0.01) is spent" in json.dumps(answer)
    spent = second.spent()
    assert spent is not None and "admission.toml" in spent.hint
    assert journal.model_spend(OTHER_RUN).calls == 0
    # another day, another budget
    assert journal.owner_cost_on(1001, "1999-01-01") == 0


def test_a_money_budget_needs_prices(tmp_path: Path) -> None:
    priced, unpriced = route(prices=PRICES), route()
    limits = resolve_limits({"model_cost_cents": 250}, {"fake": priced})
    assert limits.model_cost_cents == 250 and limits.daily_cost_cents is None
    with pytest.raises(UsageError, match="model_cost_cents needs prices, and provider fake"):
        resolve_limits({"model_cost_cents": 250}, {"fake": unpriced})
    assert resolve_limits({}, {"fake": unpriced}).model_cost_cents is None
    # the host's daily budget: frozen into every launch, never chosen by one
    assert resolve_limits({}, {"fake": priced}, 500).daily_cost_cents == 500
    with pytest.raises(PermissionDenied, match="daily model money budget per user"):
        resolve_limits({}, {"fake": unpriced}, 500)
    with pytest.raises(UsageError, match="unknown limit daily_cost_cents"):
        resolve_limits({"daily_cost_cents": 10**9}, {})
    with pytest.raises(Exception, match="model_cost_cents"):
        resolve_limits({"model_cost_cents": -1}, {})


def test_show_says_what_the_runs_model_calls_cost(journal: Journal) -> None:
    desc = description().model_copy(update={
        "routes": {"fake": route(prices=PRICES)},
        "limits": resolve_limits({"model_cost_cents": 250}, {"fake": route(prices=PRICES)}, 500),
    })
    assert model_facet(journal, desc) is None  # no call yet
    journal.record_model_tokens(RUN, "root-1", 1, 1200, cost_micros=4_000, day=today())
    journal.record_model_tokens(RUN, "root-1", 2, 800, cost_micros=2_001, day=today())
    journal.record_model_tokens(OTHER_RUN, "root-1", 1, 10, cost_micros=5_000, day=today())
    facet = model_facet(journal, desc)
    assert facet == {"calls": 2, "tokens": 2000, "token_limit": 2_000_000, "cost": "0.01",
                     "cost_limit": "2.50", "owner_today": "0.02", "daily_cost_limit": "5.00"}
    assert model_line(facet) == ("model: 2 calls · 2,000 of 2,000,000 tokens · cost 0.01 of "
                                 "2.50 · owner today 0.02 of 5.00")
    unpriced = description().model_copy(update={"routes": {"fake": route()}})
    shown = model_facet(journal, unpriced)
    assert shown is not None and shown["cost"] is None and shown["cost_limit"] is None
    assert model_line(shown) == "model: 2 calls · 2,000 of 2,000,000 tokens"


def test_provider_add_writes_prices_and_config_check_names_a_budget_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    etc = tmp_path / "etc" / "cairn"
    etc.mkdir(parents=True)
    file = etc / "providers.toml"
    priced = setup.NewProvider(name="hosted", base_url="https://api.example/v1", model="m",
                               input_price_per_million=3, output_price_per_million=15)
    text = setup.with_provider("", priced, make_default=True, file=file)
    assert "input_price_per_million = 3.0\noutput_price_per_million = 15.0\n" in text
    local = setup.NewProvider(name="local", base_url="http://127.0.0.1:8080/v1", model="q",
                              keyed=False)
    file.write_text(setup.with_provider(text, local, make_default=False, file=file))
    assert load_providers(file).route("hosted").priced
    assert check_host_config() == []
    (etc / "admission.toml").write_text("max_daily_cost_cents_per_user = 500\n")
    (problem,) = check_host_config()
    assert (problem.file.name, problem.where) == ("admission.toml",
                                                  "max_daily_cost_cents_per_user")
    assert "provider local: it has no prices" in problem.message


def test_a_run_launched_before_money_budgets_keeps_its_launch_hash() -> None:
    """The broker pins a run to its launch hash: the fields added since, unset, leave
    the hash of a description stored before them as it was."""
    desc = description().model_copy(update={"routes": {"fake": route()}})
    stored = desc.model_dump(mode="json")
    del stored["limits"]["model_cost_cents"], stored["limits"]["daily_cost_cents"]
    del stored["routes"]["fake"]["input_price_per_million"]
    del stored["routes"]["fake"]["output_price_per_million"]
    del stored["replay"]
    assert launch_hash_of(stored) == desc.launch_hash()
    # set, they are part of the hash: a budget changed after launch is another launch
    budgeted = desc.model_copy(update={"limits": resolve_limits({}, {}, 100)})
    assert budgeted.launch_hash() != desc.launch_hash()
    priced = desc.model_copy(update={"routes": {"fake": route(prices=PRICES)}})
    assert priced.launch_hash() != desc.launch_hash()


def test_calls_at_once_cannot_together_pass_the_budget() -> None:
    """Each call holds what it may cost at most before it is sent: while two calls are
    out, a third finds the money held, and what is left after them is free again."""
    budget = MoneyBudget(1)  # 10,000 micro-units
    # input 1,000; output at 10 per token: the first call may produce 500 tokens
    first = budget.hold(1_000, 10, 500)
    assert first == (500, 6_000)
    second = budget.hold(1_000, 10, 500)
    assert second == (300, 4_000)  # what was left buys 300 tokens
    assert budget.hold(1_000, 10, 500) == (0, 0)  # nothing left: refused
    budget.charge(1_200)  # the first call's real cost
    budget.release(first[1])
    assert budget.remaining() == 10_000 - 1_200 - 4_000
    budget.release(second[1])
    daily = MoneyBudget(None, daily_cents=1, spent_today=lambda: 9_500)
    assert daily.hold(100, 10, 500) == (40, 500)
    assert MoneyBudget(None).hold(10**9, 10, 500) == (500, 0)  # no budget: nothing held


def test_a_call_asking_for_several_answers_shares_the_cap(
    tmp_path: Path, journal: Journal
) -> None:
    with FakeProvider([Turn(content="a", tokens=5)]) as provider, \
            relay(tmp_path, provider, journal, RUN, MoneyBudget(None)) as model_relay:
        conn = UnixHTTPConnection(str(model_relay.socket_path), 10)
        body = {"messages": [{"role": "user", "content": "hi"}], "n": 4, "max_tokens": 10**6}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
    assert provider.requests[0].body["max_tokens"] == 500 // 4  # the route's cap, shared


def test_prompt_cache_tokens_count_as_input() -> None:
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 1000,
             "cache_read_input_tokens": 200}
    assert usage_of({"usage": usage}) == {"input": 1210, "output": 5}
    assert usage_of({"message": {"usage": {"cache_read_input_tokens": 7}}}) == {"input": 7}


def test_money_too_short_for_any_call_stops_new_operations() -> None:
    budget = MoneyBudget(1, used_micros=9_990)  # 10 micro-units left
    assert budget.spent() is None
    assert budget.hold(50, 10, 500) == (0, 0)  # the input alone costs more
    spent = budget.spent()
    assert spent is not None and spent.reason == "the model money left does not pay for a call"
    # while another call of the run holds money, a refusal is no verdict: it may be freed
    busy = MoneyBudget(1)
    held = busy.hold(1_000, 10, 900)
    assert busy.hold(1_000, 10, 900) == (0, 0)
    assert busy.spent() is None
    busy.release(held[1])
    assert busy.hold(1_000, 10, 10)[0] == 10 and busy.spent() is None


def test_a_reply_cut_off_after_the_provider_accepted_the_call_is_charged_its_most(
    tmp_path: Path, journal: Journal
) -> None:
    """What the call used is unknown once its reply is cut off (an agent hanging up
    mid-stream, a provider closing early): it is charged the most it could have cost,
    never nothing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer_half() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"choices\": [")

    thread = threading.Thread(target=answer_half)
    thread.start()
    base_url = f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    budget = MoneyBudget(100, spent_today=lambda: spent_today(journal))

    def record(tokens: int, cost: int) -> None:  # as the coordinator: a connection per call
        with Journal(journal.path) as j:
            j.record_model_tokens(RUN, "root-1", 1, tokens, cost_micros=cost, day=today())

    model_relay = ModelRelay(tmp_path / "cut" / "m.sock", route=route(base_url, PRICES),
                             owner_uid=os.getuid(), transcript=tmp_path / "cut.jsonl",
                             budget=TokenBudget(100_000), money=budget, on_spend=record)
    with model_relay:
        status, _ = ask(model_relay)
    thread.join(timeout=10)
    server.close()
    assert status == 502
    # the whole output cap (the route's 500 tokens at 10) and the input estimate at 2
    assert 500 * 10 < budget.used < 500 * 10 + 200 * 2
    assert journal.model_spend(RUN).cost_micros == budget.used
    assert model_relay.usage["estimated_tokens"] == 0
    assert model_relay.usage["output_tokens"] == 500
