"""One machine-wide admission for every launch (cairn/admission.py, cairn/journal/queue.py,
daemon/admission.py): a launch over the limit is recorded ``queued``, pinned on its owner's
attestation during the launch, and started later by cairnd without it, fairly between
users; a launch under a run key its owner used before is answered with that run. On a real
journal; the broker client is the only stand-in."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_launch_all_or_nothing import OWNER, WORKFLOW

from cairn import admission as rules
from cairn import paths, retention
from cairn.admission import AdmissionConfig, Queued, admission_order, default_machine_limit
from cairn.config import ConfigError
from cairn.daemon import admission, attest, launch, reconcile, server
from cairn.errors import BrokerRefused, UsageError
from cairn.hostconfig import check_host_config
from cairn.journal.readwrite import Journal
from cairn.journal.runs import RunKeyTaken
from cairn.protocol.broker import BrokerReply, Receipt
from cairn.protocol.daemon import LaunchRequest
from cairn.protocol.launch import LaunchDescription
from cairn.workflow.review import review_source

ALICE, BOB = 2001, 2002


@pytest.fixture(autouse=True)
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    (tmp_path / "etc/cairn/profiles.d").mkdir(parents=True)
    (tmp_path / "etc/cairn/profiles.d/tool.toml").write_text(
        'kind = "command"\nargv = ["/bin/true"]\n'
    )
    monkeypatch.setattr(retention, "admit", lambda what: 1 << 40)
    return tmp_path


def limit(host: Path, text: str) -> None:
    (host / "etc/cairn/admission.toml").write_text(text)


class Broker:
    """Records what it was asked; a start makes the run's coordinator take it (running)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.calls: list[tuple[str, bool]] = []  # (run, attested)
        self.started: list[str] = []

    def __call__(self, verb: str, run_id: str, *, timeout: float = 0,
                 attestation: int | None = None) -> BrokerReply:
        self.calls.append((run_id, attestation is not None))
        starts = [i for i in self.journal.intents(run_id, verb) if i.kind == "start-coordinator"]
        if not starts:  # a queued run: pinned, nothing to carry out
            return BrokerReply(ok=True, receipts=[])
        self.started.append(run_id)
        token = self.journal.acquire_lease(run_id, f"coordinator:{run_id}")
        self.journal.set_run_state(run_id, "running", token=token)
        receipt = Receipt(intent_id=starts[0].intent_id, run_id=run_id, kind="start-coordinator",
                          data={}, at=time.time())
        return BrokerReply(ok=True, receipts=[receipt])

    def finish(self, run_id: str) -> None:
        token = self.journal.get_run(run_id).lease_token
        self.journal.set_run_state(run_id, "succeeded", token=token)


@pytest.fixture
def journal(host: Path, owner_channel: object) -> Iterator[Journal]:
    with Journal(paths.journal_path(), create=True) as opened:
        yield opened


@pytest.fixture
def broker(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> Broker:
    fake = Broker(journal)
    monkeypatch.setattr(attest, "call_broker", fake)
    monkeypatch.setattr(admission, "call_broker", fake)
    return fake


def launch_one(
    journal: Journal, host: Path, run_key: str | None = None, *, text: str = "go",
    uid: int = OWNER,
) -> dict[str, Any]:
    project = host / "project"
    project.mkdir(exist_ok=True)
    if os.getuid() == 0:
        os.chown(project, uid, -1)
    review = review_source(WORKFLOW, filename="one.py")
    request = LaunchRequest(definition="one.py", source=WORKFLOW, confirm=review.review_hash,
                            args={"text": text}, project=str(project), run_key=run_key)
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return launch.launch(journal, request, uid, fd)
    finally:
        os.close(fd)


def queue_as(journal: Journal, like: LaunchDescription, uid: int, config: AdmissionConfig) -> str:
    """A run of ``uid`` recorded through admission as a launch does (pinned: joined)."""
    desc = like.model_copy(update={"run_id": "flow_" + secrets.token_hex(16), "owner_uid": uid})
    admitted = journal.launch_run(
        desc, machine_limit=config.machine_limit, user_limit=config.user_limit
    )
    if not admitted:
        assert journal.join_queue(desc.run_id)
    return desc.run_id


# --- the rules ---------------------------------------------------------------------------


def test_the_default_limit_follows_cpus_and_memory() -> None:
    assert default_machine_limit(2, 24 << 30) == 4
    assert default_machine_limit(64, 8 << 30) == 8  # memory bounds it
    assert default_machine_limit(1, 100 << 20) == 1  # never zero
    assert AdmissionConfig().machine_limit == default_machine_limit()
    assert AdmissionConfig(max_running_runs=8, max_running_per_user=20).user_limit == 8


def test_users_take_turns_and_each_users_runs_keep_their_order() -> None:
    queued = [Queued(f"a{i}", ALICE, float(i)) for i in range(4)] + [
        Queued(f"b{i}", BOB, 10.0 + i) for i in range(3)
    ]
    order = [q.run_id for q in admission_order(queued, {})]
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2", "a3"]
    # a user already holding slots waits until the other has as many
    order = [q.run_id for q in admission_order(queued, {ALICE: 2})]
    assert order == ["b0", "b1", "a0", "b2", "a1", "a2", "a3"]
    # a user at their share is passed over
    order = [q.run_id for q in admission_order(queued, {ALICE: 2}, user_limit=2)]
    assert order == ["b0", "b1"]


def test_a_bad_admission_file_is_named_by_config_check(host: Path) -> None:
    limit(host, 'max_running_runs = "8"\nmax_running_per_user = 0\n')
    problems = {(p.file.name, p.where) for p in check_host_config()}
    assert ("admission.toml", "max_running_runs") in problems
    assert ("admission.toml", "max_running_per_user") in problems
    with pytest.raises(ConfigError):
        rules.admission_config()
    # cairnd keeps admitting (on the defaults) rather than stranding queued runs
    assert admission.current_config() == AdmissionConfig()


# --- launches through the queue ------------------------------------------------------------


def test_a_launch_over_the_limit_is_queued_pinned_and_started_later_without_attestation(
    journal: Journal, host: Path, broker: Broker
) -> None:
    limit(host, "max_running_runs = 2\n")
    first, second, third = (launch_one(journal, host) for _ in range(3))
    assert (first["state"], second["state"]) == ("pending", "pending")
    assert third["state"] == "queued" and third["position"] == 1
    queued = journal.get_run(third["run_id"])
    assert queued.state == "queued"
    # pinned during the launch, on the attestation, with nothing to carry out
    assert (third["run_id"], True) in broker.calls
    assert third["run_id"] not in broker.started
    assert journal.intents(third["run_id"]) == []
    assert admission.admit_waiting(journal) == []  # no slot yet
    broker.finish(first["run_id"])
    assert admission.admit_waiting(journal) == [third["run_id"]]
    assert broker.calls[-1] == (third["run_id"], False)  # started on the pin alone
    assert journal.get_run(third["run_id"]).state == "running"
    events = [e.event for e in journal.events(third["run_id"])]
    assert events[:3] == ["run-created", "run-queued", "run-admitted"]


def test_never_more_than_the_limit_hold_a_slot_and_all_start(
    journal: Journal, host: Path, broker: Broker
) -> None:
    limit(host, "max_running_runs = 3\n")
    runs = [launch_one(journal, host)["run_id"] for _ in range(10)]
    done: list[str] = []
    while len(done) < len(runs):
        running = [r for r in runs if journal.get_run(r).state in ("pending", "running")]
        assert 0 < len(running) <= 3
        broker.finish(running[0])
        done.append(running[0])
        admission.admit_waiting(journal)
    assert done == runs  # each user's runs start in the order they were launched
    assert all(journal.get_run(r).state == "succeeded" for r in runs)


def test_two_users_share_the_machine_fairly(journal: Journal, host: Path, broker: Broker) -> None:
    limit(host, "max_running_runs = 4\n")
    config = rules.admission_config()
    like = journal.launch_description(launch_one(journal, host)["run_id"])
    broker.finish(like.run_id)
    # Alice floods the queue first; Bob comes after
    alice = [queue_as(journal, like, ALICE, config) for _ in range(12)]
    bob = [queue_as(journal, like, BOB, config) for _ in range(6)]
    assert [journal.get_run(r).state for r in alice[:4]] == ["pending"] * 4
    assert {journal.get_run(r).state for r in alice[4:] + bob} == {"queued"}
    for run_id in alice[:4]:
        broker("launch-v1", run_id)
    admitted: list[str] = []
    spread: list[int] = []
    while any(journal.get_run(r).state != "succeeded" for r in alice + bob):
        oldest = min(
            (journal.get_run(r) for r in alice + bob if journal.get_run(r).state == "running"),
            key=lambda run: run.updated_at,
        )
        broker.finish(oldest.run_id)
        admitted += admission.admit_waiting(journal)
        _queue, holding = journal.queue_snapshot()
        assert sum(holding.values()) <= 4
        if any(journal.get_run(r).state == "queued" for r in bob):
            spread.append(holding.get(ALICE, 0) - holding.get(BOB, 0))
    owners = ["A" if r in alice else "B" for r in admitted]
    # Bob's runs take the first free slots until both hold as many; from then on, while
    # both have runs queued, each slot that frees goes to the user it came from (the
    # oldest run finishes first here): the two hold the machine half and half
    assert "".join(owners) == "BBAABBAABBAAAA"
    assert spread[0] == 2 and len(spread) >= 5 and set(spread[1:]) == {0}, spread
    # within each user, first launched, first started
    assert [r for r in admitted if r in alice] == alice[4:]
    assert [r for r in admitted if r in bob] == bob


def test_a_queued_run_survives_a_restart_and_one_never_pinned_fails(
    journal: Journal, host: Path, broker: Broker
) -> None:
    limit(host, "max_running_runs = 1\n")
    launch_one(journal, host)
    queued = launch_one(journal, host)["run_id"]
    later = time.time() + 1  # a cairnd started after these launches
    assert not reconcile.launch_unfinished(journal, journal.get_run(queued), created_before=later)
    # admitted, then cairnd stopped before the broker answered: still started at boot
    journal.db.execute("UPDATE runs SET state='pending' WHERE run_id=?", (queued,))
    assert not reconcile.launch_unfinished(journal, journal.get_run(queued), created_before=later)
    # queued, but cairnd stopped before the broker pinned it: the launch was cut short
    journal.db.execute("UPDATE runs SET state='queued' WHERE run_id=?", (queued,))
    journal.db.execute("DELETE FROM events WHERE run_id=? AND event='run-queued'", (queued,))
    assert reconcile.launch_unfinished(journal, journal.get_run(queued), created_before=later)


def test_a_queued_run_is_cancelled_not_paused_and_never_starts(
    journal: Journal, host: Path, broker: Broker
) -> None:
    limit(host, "max_running_runs = 1\n")
    first = launch_one(journal, host)["run_id"]
    queued = launch_one(journal, host)["run_id"]
    with pytest.raises(UsageError, match="queued for a slot and has not started"):
        journal.request_control(queued, "pause", actor_uid=OWNER)
    assert journal.request_control(queued, "cancel", actor_uid=OWNER) == ("cancelled", False)
    broker.finish(first)
    assert admission.admit_waiting(journal) == []
    assert journal.get_run(queued).state == "cancelled"
    assert queued not in broker.started


def test_a_queued_run_the_broker_will_not_start_fails_and_frees_its_slot(
    journal: Journal, host: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit(host, "max_running_runs = 1\n")
    first = launch_one(journal, host)["run_id"]
    doomed, after = (launch_one(journal, host)["run_id"] for _ in range(2))
    broker.finish(first)

    def refuse_once(verb: str, run_id: str, **kw: Any) -> BrokerReply:
        if run_id == doomed:
            raise BrokerRefused("project /p is gone")
        return broker(verb, run_id, **kw)

    monkeypatch.setattr(admission, "call_broker", refuse_once)
    assert admission.admit_waiting(journal) == [doomed]
    run = journal.get_run(doomed)
    assert run.state == "failed"
    assert run.error == "the queued run could not start: project /p is gone"
    assert admission.admit_waiting(journal) == [after]


# --- run keys: a caller's name for a run (cairn launch --run-key, the MCP's run_key); the
# CLI in a booted machine: tests/system/test_cli.py --------------------------------------


def runs_of(journal: Journal) -> list[tuple[str, str | None]]:
    rows = journal.db.execute("SELECT run_id, run_key FROM runs ORDER BY created_at")
    return [(r["run_id"], r["run_key"]) for r in rows]


def test_a_second_launch_of_a_key_answers_with_the_first_run(
    journal: Journal, host: Path, broker: Broker
) -> None:
    first = launch_one(journal, host, "nightly-2026-12-06")
    again = launch_one(journal, host, "nightly-2026-12-06")

    assert "launched_before" not in first
    assert again["launched_before"] is True
    assert (again["run_id"], again["launch_hash"]) == (first["run_id"], first["launch_hash"])
    assert again["state"] == journal.get_run(first["run_id"]).state == "running"
    assert runs_of(journal) == [(first["run_id"], "nightly-2026-12-06")]
    assert broker.started == [first["run_id"]]  # started once
    assert journal.get_run(first["run_id"]).run_key == "nightly-2026-12-06"
    # without a key every launch is a new run
    other = launch_one(journal, host, None)
    assert other["run_id"] != first["run_id"] and len(runs_of(journal)) == 2


def test_the_same_key_with_other_arguments_is_refused_naming_the_run(
    journal: Journal, host: Path, broker: Broker
) -> None:
    first = launch_one(journal, host, "pr-1234")

    with pytest.raises(UsageError) as refused:
        launch_one(journal, host, "pr-1234", text="something else")

    assert refused.value.message == (
        f"run key pr-1234 already names run {first['run_id']}, launched with another "
        "arguments"
    )
    assert refused.value.hint is not None and f"cairn show {first['run_id']}" in refused.value.hint
    assert runs_of(journal) == [(first["run_id"], "pr-1234")]


def test_a_key_is_one_owners(journal: Journal, host: Path, broker: Broker) -> None:
    other = next(p.pw_uid for p in pwd.getpwall() if p.pw_uid not in (0, OWNER))
    mine = launch_one(journal, host, "release")
    theirs = launch_one(journal, host, "release", uid=other)
    assert mine["run_id"] != theirs["run_id"]
    assert "launched_before" not in theirs
    assert {r for r, _k in runs_of(journal)} == {mine["run_id"], theirs["run_id"]}


def test_two_launches_of_one_key_racing_record_one_run(
    journal: Journal, host: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second launch looked before the first recorded its run: the journal's unique
    key refuses its insert, and it answers with the first run."""
    first = launch_one(journal, host, "race")
    looked: list[str] = []

    def before_the_first_recorded(self: Journal, owner_uid: int, run_key: str) -> Any:
        looked.append(run_key)
        if len(looked) == 1:
            return None
        return original(self, owner_uid, run_key)

    original = Journal.run_by_key
    monkeypatch.setattr(Journal, "run_by_key", before_the_first_recorded)
    again = launch_one(journal, host, "race")

    assert looked == ["race", "race"]
    assert again["launched_before"] is True and again["run_id"] == first["run_id"]
    assert runs_of(journal) == [(first["run_id"], "race")]
    assert broker.started == [first["run_id"]]


def test_the_journal_refuses_a_second_run_of_a_key(journal: Journal, host: Path,
                                                   broker: Broker) -> None:
    first = launch_one(journal, host, "k")
    desc = journal.launch_description(first["run_id"])
    copy = desc.model_copy(update={"run_id": "flow_" + "ab" * 16})
    with pytest.raises(RunKeyTaken) as taken:
        journal.launch_run(copy, machine_limit=8, user_limit=8, run_key="k")
    assert taken.value.run.run_id == first["run_id"]
    journal.launch_run(copy, machine_limit=8, user_limit=8, run_key="k2")  # another key: fine
    assert len(runs_of(journal)) == 2


@pytest.mark.parametrize("key", ["", "-x", "a b", "../etc", "x" * 129, "k\n", "ключ"])
def test_a_key_that_is_not_a_name_is_refused_in_one_line(key: str) -> None:
    body = {**LaunchRequest(definition="builtin:implement").model_dump(mode="json"),
            "run_key": key}
    with pytest.raises(UsageError) as refused:
        server.parse(json.dumps(body).encode() + b"\n")
    assert refused.value.message.startswith(f"run key {key[:200]!r} is not a name: use 1 to 128")
    assert "\n" not in refused.value.message and refused.value.hint
