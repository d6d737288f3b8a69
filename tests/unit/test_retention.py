"""Retention: which finished runs a rule deletes (time injected), the host's storage policy
file, and cairnd's ``rm``/``prune``/``show`` over a real journal. The deletion itself is the
broker's (tests/btrfs/test_retention_pool.py deletes on a real pool)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn import paths, retention
from cairn.broker import verbs
from cairn.config import ConfigError
from cairn.daemon import lifecycle, oneshot, runref, views
from cairn.errors import NotFound, PermissionDenied, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply, Intent, Receipt
from cairn.protocol.daemon import PruneRequest, RmRequest
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.retention import Rule, RunFacts, held_because, select
from cairn.sizes import parse_age

DAY = 86400.0
NOW = 100 * DAY
ALICE, BOB = 1001, 1002


def facts(run_id: str, *, owner: int = ALICE, age_days: float = 1, **changes: Any) -> RunFacts:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "owner_uid": owner,
        "state": "succeeded",
        "finished_at": NOW - age_days * DAY,
        "has_storage": True,
        "storage_deleted": False,
        "proposal_frozen": False,
        "settled": False,
        **changes,
    }
    return RunFacts(**fields)


def going(runs: list[RunFacts], rule: Rule) -> list[str]:
    return sorted(v.run_id for v in select(runs, rule, NOW) if v.delete)


# --- the rules --------------------------------------------------------------------------


def test_older_than_deletes_only_runs_finished_before_it() -> None:
    runs = [facts("a", age_days=20), facts("b", age_days=14.5), facts("c", age_days=13)]
    assert going(runs, Rule(older_than=14 * 86400)) == ["a", "b"]


def test_keep_counts_each_users_newest_finished_runs() -> None:
    runs = [facts(f"a{i}", age_days=i) for i in range(1, 6)]
    runs += [facts(f"b{i}", owner=BOB, age_days=i) for i in range(1, 3)]
    assert going(runs, Rule(keep=2)) == ["a3", "a4", "a5"]
    assert going(runs, Rule(keep=0)) == sorted(r.run_id for r in runs)


def test_either_rule_is_enough() -> None:
    runs = [facts("new", age_days=1), facts("mid", age_days=3), facts("old", age_days=30)]
    assert going(runs, Rule(older_than=14 * 86400, keep=2)) == ["old"]
    assert going(runs, Rule(older_than=2 * 86400, keep=5)) == ["mid", "old"]
    assert going(runs, Rule()) == []


@pytest.mark.parametrize("state", ["pending", "running", "waiting", "paused", "blocked"])
def test_runs_not_finished_always_stay(state: str) -> None:
    run = facts("r", state=state, age_days=365)
    assert going([run], Rule(older_than=0, keep=0)) == []
    assert held_because(run) == f"it is {state}; only finished runs are deleted"


def test_a_frozen_proposal_never_settled_stays_and_a_settled_one_goes() -> None:
    unsettled = facts("u", age_days=365, proposal_frozen=True, settled=False)
    settled = facts("s", age_days=365, proposal_frozen=True, settled=True)
    assert going([unsettled, settled], Rule(older_than=0)) == ["s"]
    assert held_because(unsettled) == "its proposal is not settled"


def test_held_runs_do_not_take_a_place_among_the_kept() -> None:
    runs = [facts("waiting", state="waiting", age_days=0), facts("a", age_days=2)]
    runs.append(facts("b", age_days=3))
    assert going(runs, Rule(keep=1)) == ["b"]


def test_runs_without_storage_or_already_deleted_get_no_verdict() -> None:
    runs = [facts("none", has_storage=False), facts("gone", storage_deleted=True)]
    assert select(runs, Rule(older_than=0), NOW) == []


@pytest.mark.parametrize(
    ("text", "seconds"), [("14d", 14 * 86400), ("12h", 43200), ("2w", 1209600), ("7", 604800)]
)
def test_ages_as_people_write_them(text: str, seconds: int) -> None:
    assert parse_age(text) == seconds


def test_an_unreadable_age_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="cannot read age '14 days'"):
        parse_age("14 days")


# --- the host's policy ------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.config_dir().mkdir(parents=True)
    paths.journal_path().parent.mkdir(parents=True)
    for module in (views, runref, lifecycle):
        monkeypatch.setattr(module, "is_admin", lambda uid: uid == 0)
    return tmp_path


def test_without_a_policy_file_retention_is_on_with_its_defaults(host: Path) -> None:
    policy = retention.load_policy()
    assert policy.rule() == Rule(older_than=14 * 86400, keep=20)
    assert policy.reserve_bytes == 256 << 20


def test_under_the_defaults_runs_that_wait_are_blocked_or_unsettled_always_stay(
    host: Path,
) -> None:
    rule = retention.load_policy().rule()
    old = NOW - 400 * DAY
    facts = [
        retention.RunFacts(f"{state}-{n}", ALICE, state, old + n, True, False, False, False)
        for n, state in enumerate(("waiting", "blocked", "paused", "running", "pending"))
    ]
    facts.append(retention.RunFacts("unsettled", ALICE, "succeeded", old, True, False,
                                    True, False))
    facts += [retention.RunFacts(f"done-{n}", ALICE, "succeeded", NOW - n * DAY, True, False,
                                 True, True) for n in range(30)]
    verdicts = {v.run_id: v for v in retention.select(facts, rule, NOW)}
    assert not any(verdicts[f.run_id].delete for f in facts[:6])
    assert "not settled" in verdicts["unsettled"].reason
    kept = sorted(v.run_id for v in verdicts.values() if v.run_id.startswith("done")
                  and not v.delete)
    assert kept == sorted(f"done-{n}" for n in range(15))  # 14 days old at most


def test_the_policy_file_gives_the_rule_and_the_reserve(host: Path) -> None:
    retention.policy_file().write_text('keep_days = 14\nkeep_per_user = 20\nreserve = "1G"\n')
    policy = retention.load_policy()
    assert policy.rule() == Rule(older_than=14 * 86400, keep=20)
    assert policy.reserve_bytes == 1 << 30


def test_every_problem_of_the_policy_file_is_named_with_its_field(host: Path) -> None:
    retention.policy_file().write_text('keep_days = "14"\nreserve = "lots"\nkeep = 3\n')
    with pytest.raises(ConfigError) as caught:
        retention.load_policy()
    message = caught.value.message
    assert message.startswith("3 errors in 1 config file:")
    for where in ("keep_days:", "reserve: reserve must be a size like 1G", "keep: unknown"):
        assert f"storage.toml: {where}" in message


# --- cairnd's rm and prune over a real journal -------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def record_run(
    journal: Journal, clock: Clock, run_id: str, owner: int, state: str, age_days: float
) -> None:
    """A run with storage (a prepare-q intent) that reached ``state`` ``age_days`` ago."""
    clock.now = NOW - age_days * DAY
    desc = LaunchDescription(
        run_id=run_id, owner_uid=owner, owner_gid=owner, owner_name=f"u{owner}",
        definition="builtin:implement", source="", source_filename="implement.py",
        review_hash="sha256:" + "a" * 64, review={}, args={},
        project=ProjectSpec(root=f"/home/u{owner}/p", owner_uid=owner, on_pool_fs=False),
        profiles={}, cairn_version="0", created_at=clock.now,
    )
    prepare = Intent(intent_id="prepare-q", run_id=run_id, kind="prepare-q")
    journal.create_run(desc, intents=[prepare])
    with journal.transaction() as db:
        db.execute("UPDATE runs SET state=? WHERE run_id=?", (state, run_id))
    clock.now = NOW


def rid(n: int) -> str:
    return f"flow_{n:032x}"


@pytest.fixture
def journal(host: Path) -> Iterator[tuple[Journal, Clock]]:
    clock = Clock()
    with Journal(paths.journal_path(), create=True, clock=clock) as opened:
        record_run(opened, clock, rid(1), ALICE, "succeeded", 30)
        record_run(opened, clock, rid(2), ALICE, "failed", 2)
        record_run(opened, clock, rid(3), ALICE, "running", 40)
        record_run(opened, clock, rid(4), BOB, "succeeded", 50)
        yield opened, clock


def fake_broker(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, str]]:
    """Stand in for the broker socket: check the intent cairnd wrote is the one the
    broker's delete accepts, and answer with a receipt."""
    calls: list[tuple[str, str]] = []

    def call(verb: str, run_id: str, *, timeout: float) -> BrokerReply:
        calls.append((verb, run_id))
        (intent,) = journal.intents(run_id, verb)
        assert intent.model_dump(exclude={"run_id"}) == verbs.DELETE_INTENT
        receipt = Receipt(
            intent_id=intent.intent_id, run_id=run_id, kind="delete-run",
            data={"deleted": [f"/pool/runs/{run_id}/Q"], "proxy_removed": False}, at=NOW,
        )
        return BrokerReply(ok=True, receipts=[receipt])

    monkeypatch.setattr(oneshot, "call_broker", call)
    return calls


def test_rm_refuses_a_running_run_in_one_line(journal: tuple[Journal, Clock]) -> None:
    with pytest.raises(UsageError) as caught:
        lifecycle.rm(journal[0], RmRequest(run_id=rid(3)), ALICE)
    assert caught.value.message == (
        f"run {rid(3)} is kept: it is running; only finished runs are deleted"
    )
    assert "\n" not in caught.value.message and "cairn stop" in (caught.value.hint or "")


def test_rm_refuses_a_finished_run_whose_proposal_was_never_settled(
    journal: tuple[Journal, Clock]
) -> None:
    opened, _clock = journal
    frozen = Intent(intent_id="freeze-proposal", run_id=rid(2), kind="freeze-proposal")
    opened.add_intents(rid(2), [frozen], token=None)
    # only asked for (the pool was full, say): nothing was frozen, the run may go
    assert lifecycle.rm(opened, RmRequest(run_id=rid(2), dry_run=True), ALICE)["subvolumes"] == 0
    opened.record_receipts(rid(2), [{"intent_id": "freeze-proposal", "run_id": rid(2),
                                     "kind": "freeze-proposal", "data": {}, "at": 2.0}])
    with pytest.raises(UsageError) as caught:
        lifecycle.rm(opened, RmRequest(run_id=rid(2)), ALICE)
    assert caught.value.message == f"run {rid(2)} is kept: its proposal is not settled"
    assert caught.value.hint == f"'cairn show {rid(2)}' shows where its settlement stopped"


def test_rm_is_for_the_owner_only(journal: tuple[Journal, Clock]) -> None:
    with pytest.raises(NotFound):
        lifecycle.rm(journal[0], RmRequest(run_id=rid(4)), ALICE)
    with pytest.raises(PermissionDenied, match="not yours"):
        lifecycle.rm(journal[0], RmRequest(run_id=rid(4)), 0)


def test_rm_deletes_through_the_broker_and_show_says_the_storage_is_gone(
    journal: tuple[Journal, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened, _clock = journal
    calls = fake_broker(opened, monkeypatch)
    checked = lifecycle.rm(opened, RmRequest(run_id=rid(1), dry_run=True), ALICE)
    assert checked == {"run_id": rid(1), "already_gone": False, "subvolumes": 0,
                       "reclaim_pending": 0, "free_bytes": None} and not calls
    done = lifecycle.rm(opened, RmRequest(run_id=rid(1)), ALICE)
    assert done == {"run_id": rid(1), "already_gone": False, "subvolumes": 1,
                    "reclaim_pending": 0, "free_bytes": None}  # no pool in this test
    assert calls == [("delete-v1", rid(1))]
    shown = views.show(opened, rid(1), ALICE)
    assert shown["storage"] == {"deleted": True, "deleted_at": NOW, "subvolumes": 1}
    assert shown["run"]["state"] == "succeeded"  # the history stays
    assert [e["event"] for e in shown["events"]][-1] == "storage-deleted"
    again = lifecycle.rm(opened, RmRequest(run_id=rid(1)), ALICE)
    assert again["already_gone"] and calls == [("delete-v1", rid(1))]


def test_prune_by_a_user_covers_only_their_runs_and_dry_run_deletes_nothing(
    journal: tuple[Journal, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened, clock = journal
    calls = fake_broker(opened, monkeypatch)
    request = PruneRequest(older_than=14 * 86400, dry_run=True)
    result = lifecycle.prune(opened, request, ALICE, clock=clock)
    assert [r["run_id"] for r in result["delete"]] == [rid(1)]
    assert {r["run_id"] for r in result["kept"]} == {rid(2), rid(3)}
    assert result["deleted"] == [] and calls == []


def test_prune_as_root_by_the_host_policy_covers_every_user(
    journal: tuple[Journal, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened, clock = journal
    calls = fake_broker(opened, monkeypatch)
    retention.policy_file().write_text("keep_days = 14\n")
    result = lifecycle.prune(opened, PruneRequest(), 0, clock=clock)
    assert sorted(r["run_id"] for r in result["deleted"]) == [rid(1), rid(4)]
    assert sorted(run for _verb, run in calls) == [rid(1), rid(4)]
    assert result["failed"] == []


def test_the_clock_decides_age(journal: tuple[Journal, Clock]) -> None:
    opened, clock = journal
    clock.now = NOW + 100 * DAY
    result = lifecycle.prune(opened, PruneRequest(older_than=14 * 86400, dry_run=True), ALICE,
                             clock=clock)
    assert sorted(r["run_id"] for r in result["delete"]) == [rid(1), rid(2)]
