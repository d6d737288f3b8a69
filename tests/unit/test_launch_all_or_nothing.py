"""A launch is all or nothing: a run whose launch could not start it ends ``failed`` with
the reason, and nothing starts it later — not the boot reconciler, not a coordinator that
the broker starts anyway, not the broker. A run nothing has taken yet is cancelled at once.
On a real journal; the broker client is the only stand-in (one that raises)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clirunner import CliRunner

from cairn import paths, retention
from cairn.cli import people as people_cli
from cairn.cli.commands import app
from cairn.daemon import attest, launch, reconcile
from cairn.errors import BrokerRefused, CairnError, Unavailable
from cairn.journal.readwrite import Journal
from cairn.journal.runs import RunEnded
from cairn.protocol.broker import BrokerReply, Receipt
from cairn.protocol.daemon import LaunchRequest
from cairn.workflow.review import review_source

WORKFLOW = '''"""One agent on a host profile."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Ask(Model):
    """What to do."""

    text: str = Field(min_length=1, max_length=100)


class Done(Model):
    """What was done."""

    summary: str = Field(min_length=1, max_length=100)


worker = agent(profile="tool", access="read", network="none", output=Done)


@workflow(description="One agent.", input=Ask, output=Done)
async def run(flow: Any, args: Ask) -> Done:
    result = await flow.agent(worker, prompt=args.text)
    done: Done = result.output
    return done
'''
# launches are refused for root; as root the test launches as nobody
OWNER = os.getuid() or 65534


@pytest.fixture(autouse=True)
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    (tmp_path / "etc/cairn/profiles.d").mkdir(parents=True)
    (tmp_path / "etc/cairn/profiles.d/tool.toml").write_text(
        'kind = "command"\nargv = ["/bin/true"]\n'
    )
    # No Btrfs pool here: the free-space admission before a launch is tested on a real
    # pool in tests/btrfs/test_retention_pool.py.
    monkeypatch.setattr(retention, "admit", lambda what: 1 << 40)
    return tmp_path


@pytest.fixture
def journal(host: Path, owner_channel: object) -> Iterator[Journal]:
    with Journal(paths.journal_path(), create=True) as opened:
        yield opened


def broker_that_raises(error: CairnError) -> Any:
    def call(verb: str, run_id: str, *, timeout: float = 0, attestation: int | None = None,
             ) -> BrokerReply:
        raise error

    return call


def broker_that_starts(started: list[str]) -> Any:
    def call(verb: str, run_id: str, *, timeout: float = 0, attestation: int | None = None,
             ) -> BrokerReply:
        started.append(run_id)
        receipt = Receipt(intent_id="start-coordinator", run_id=run_id, kind="start-coordinator",
                          data={"unit": f"cairn-coordinator@{run_id}.service"}, at=time.time())
        return BrokerReply(ok=True, receipts=[receipt])

    return call


def launch_as_owner(journal: Journal, host: Path) -> dict[str, Any]:
    project = host / "project"
    project.mkdir(exist_ok=True)
    if os.getuid() == 0:
        os.chown(project, OWNER, -1)
    review = review_source(WORKFLOW, filename="one.py")
    request = LaunchRequest(definition="one.py", source=WORKFLOW, confirm=review.review_hash,
                            args={"text": "go"}, project=str(project))
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return launch.launch(journal, request, OWNER, fd)
    finally:
        os.close(fd)


def only_run(journal: Journal) -> Any:
    (run,) = journal.list_runs(None)
    return run


def test_a_launch_the_broker_cannot_start_leaves_the_run_failed_with_the_reason(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = Unavailable("cannot reach the broker at /run/cairn/broker.sock: No such file",
                       hint="is cairn-broker.socket active?")
    monkeypatch.setattr(attest, "call_broker", broker_that_raises(down))
    with pytest.raises(Unavailable) as caught:
        launch_as_owner(journal, host)
    run = only_run(journal)
    assert caught.value.message == (
        "cannot reach the broker at /run/cairn/broker.sock: No such file "
        f"(run {run.run_id} is recorded failed and will not start)"
    )
    assert caught.value.hint == "is cairn-broker.socket active?"
    assert run.state == "failed"
    assert run.error == (
        "the launch could not start the run: cannot reach the broker at "
        "/run/cairn/broker.sock: No such file"
    )
    failed = [e for e in journal.events(run.run_id) if e.event == "run-failed"]
    assert [e.data["by"] for e in failed] == ["launch"]


def test_a_refusing_broker_fails_the_run_too(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attest, "call_broker", broker_that_raises(BrokerRefused("no journal")))
    with pytest.raises(BrokerRefused):
        launch_as_owner(journal, host)
    assert only_run(journal).error == "the launch could not start the run: no journal"


def test_a_failed_launch_is_never_started_later(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attest, "call_broker", broker_that_raises(Unavailable("down")))
    with pytest.raises(Unavailable):
        launch_as_owner(journal, host)
    run = only_run(journal)
    # the boot reconciler looks only at runs that should be active
    assert run.state not in reconcile.ACTIVE_STATES
    # a coordinator the broker started all the same may not take it
    with pytest.raises(RunEnded, match=f"run {run.run_id} is failed; nothing to start"):
        journal.acquire_lease(run.run_id, "coordinator:1")
    assert journal.get_run(run.run_id).lease_token == 0


def test_a_coordinator_that_took_the_run_keeps_it_though_the_reply_was_lost(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started_then_lost(verb: str, run_id: str, *, timeout: float = 0,
                          attestation: int | None = None) -> BrokerReply:
        journal.acquire_lease(run_id, "coordinator:1")  # the coordinator got there first
        raise Unavailable("connection closed without a reply")

    monkeypatch.setattr(attest, "call_broker", started_then_lost)
    result = launch_as_owner(journal, host)
    assert only_run(journal).state == "pending" and only_run(journal).run_id == result["run_id"]


def test_a_started_launch_keeps_its_receipt_and_a_cut_short_one_is_failed_at_boot(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(attest, "call_broker", broker_that_starts(started))
    result = launch_as_owner(journal, host)
    assert started == [result["run_id"]]
    run = only_run(journal)
    later = time.time() + 1  # a cairnd started after this launch
    assert not reconcile.launch_unfinished(journal, run, created_before=later)
    # the same run as cairnd would leave it had it stopped between recording the run and
    # hearing from the broker: no receipt
    journal.db.execute("DELETE FROM receipts WHERE run_id=?", (run.run_id,))
    journal.db.commit()
    assert reconcile.launch_unfinished(journal, journal.get_run(run.run_id), created_before=later)
    # ...unless it is this cairnd's own launch, still on its way to the broker
    assert not reconcile.launch_unfinished(
        journal, journal.get_run(run.run_id), created_before=run.created_at)
    # a run a coordinator once took is not the launch's to judge
    journal.acquire_lease(run.run_id, "coordinator:1")
    assert not reconcile.launch_unfinished(journal, journal.get_run(run.run_id),
                                           created_before=later)


def test_the_reconciler_fails_a_cut_short_launch_and_starts_nothing(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(attest, "call_broker", broker_that_starts(started))
    launch_as_owner(journal, host)
    run = only_run(journal)
    journal.db.execute("DELETE FROM receipts WHERE run_id=?", (run.run_id,))
    journal.db.commit()

    class NoUnits:
        def __enter__(self) -> NoUnits:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def unit_state(self, name: str) -> None:
            return None

    restarted: list[str] = []
    monkeypatch.setattr(reconcile, "Systemd", NoUnits)
    monkeypatch.setattr(reconcile, "call_broker", broker_that_starts(restarted))
    # cairnd was started by this very launch (socket activation): the run is its own
    assert reconcile.reconcile(journal, started_at=run.created_at) == [run.run_id]
    assert restarted == [run.run_id] and journal.get_run(run.run_id).state == "pending"
    # a later cairnd finds the launch cut short
    restarted.clear()
    journal.db.execute("DELETE FROM receipts WHERE run_id=?", (run.run_id,))
    journal.db.commit()
    assert reconcile.reconcile(journal, started_at=time.time() + 1) == []
    assert restarted == []
    after = journal.get_run(run.run_id)
    assert after.state == "failed" and after.error == reconcile.UNFINISHED_LAUNCH


# --- cancel of a run nothing has taken ----------------------------------------------------


def test_cancel_of_a_pending_run_nothing_took_ends_it_at_once(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attest, "call_broker", broker_that_starts([]))
    run_id = launch_as_owner(journal, host)["run_id"]
    assert journal.request_control(run_id, "cancel", actor_uid=OWNER) == ("cancelled", False)
    assert journal.get_run(run_id).state == "cancelled"
    assert journal.pending_controls(run_id) == []
    # the coordinator the broker was starting finds it ended
    with pytest.raises(RunEnded):
        journal.acquire_lease(run_id, "coordinator:1")


def test_cancel_of_a_pending_run_a_coordinator_holds_waits_for_its_safe_point(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attest, "call_broker", broker_that_starts([]))
    run_id = launch_as_owner(journal, host)["run_id"]
    journal.acquire_lease(run_id, "coordinator:1")
    assert journal.request_control(run_id, "cancel", actor_uid=OWNER) == (
        "cancel requested", False)
    assert journal.get_run(run_id).state == "pending"
    assert journal.pending_controls(run_id) == ["cancel"]


def test_pause_and_resume_of_a_pending_run_nothing_took(
    journal: Journal, host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attest, "call_broker", broker_that_starts([]))
    run_id = launch_as_owner(journal, host)["run_id"]
    assert journal.request_control(run_id, "pause", actor_uid=OWNER) == ("paused", False)
    assert journal.request_control(run_id, "resume", actor_uid=OWNER) == ("resumed", True)
    assert journal.get_run(run_id).state == "pending"


def test_the_command_says_whether_the_cancel_is_done_or_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = "flow_" + "ab" * 16
    for outcome, said in (
        ("cancelled", f"{run_id}: cancelled\n"),
        ("cancel requested", f"{run_id}: cancel requested (its coordinator acts on it at the "
         f"next safe point; follow with 'cairn watch {run_id}')\n"),
    ):
        monkeypatch.setattr(people_cli, "request", lambda body, o=outcome: {
            "run_id": run_id, "action": "cancel", "outcome": o, "woken": False})
        result = CliRunner().invoke(app, ["cancel", run_id, "--yes"])
        assert result.exit_code == 0 and result.output == said


class Turnstile:
    """cairnd's review lock, counting the threads that reached it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.arrived = threading.Semaphore(0)

    def __enter__(self) -> None:
        self.arrived.release()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_burst_of_launches_reviews_a_definition_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """cairnd serves each launch on its own thread: the first review of a definition is
    remembered and the others, which reached the review while it ran, wait for it; a
    rejected source is reviewed every time."""
    reviews: list[str] = []
    go = threading.Event()

    def counted(source: str, *, filename: str) -> Any:
        reviews.append(filename)
        assert go.wait(30)  # until every launch of the burst has reached the review
        return review_source(source, filename=filename)

    turnstile = Turnstile()
    monkeypatch.setattr(launch, "review_source", counted)
    monkeypatch.setattr(launch, "_REVIEWING", turnstile)
    launch._reviewed.cache_clear()
    seen: list[Any] = []
    threads = [threading.Thread(target=lambda: seen.append(launch.reviewed(WORKFLOW, "wf.py")))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    assert all(turnstile.arrived.acquire(timeout=30) for _ in threads)
    go.set()
    for thread in threads:
        thread.join()
    assert reviews == ["wf.py"] and len(seen) == 8 and all(r is seen[0] for r in seen)
    model = launch.input_model(seen[0])
    assert launch.input_model(seen[0]) is model
    assert launch.validate_args(seen[0], {"text": "x"}) == {"text": "x"}
    with pytest.raises(CairnError):
        launch.reviewed("import os\n", "bad.py")
    with pytest.raises(CairnError):
        launch.reviewed("import os\n", "bad.py")
    assert reviews == ["wf.py", "bad.py", "bad.py"]
