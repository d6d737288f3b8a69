"""`cairn replay SOURCE --through OP` before anything is snapshotted: which operations are
imported (cairn/replay.py), every refusal, the new run cairnd records on a real journal
(imported rows with provenance, the same frozen definition), and the broker's own checks
of that run, which take nothing of cairnd's word. Reminting on real snapshots is
tests/btrfs/test_storage.py; the whole replay is tests/system/test_replay.py."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attested import pin_as_attested

from cairn import paths, retention
from cairn.broker.receipts import ReceiptStore
from cairn.broker.remint import remint_q, source_checkpoints
from cairn.broker.verbs import IntentContext
from cairn.daemon import attest, launch
from cairn.daemon import replay as daemon_replay
from cairn.errors import BrokerRefused, NotFound, UsageError
from cairn.journal.reader import JournalReader
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.journal.snapshot import read_snapshot
from cairn.protocol.broker import (
    BrokerReply,
    Checkpointed,
    Forked,
    ForkLane,
    Intent,
    Receipt,
    RunDeleted,
    SubvolumeReceipt,
)
from cairn.protocol.control import CallRequest
from cairn.protocol.daemon import LaunchRequest
from cairn.protocol.launch import ReplayOrigin
from cairn.replay import latest_replay_point, select_imports
from cairn.views.run import run_view
from cairn.workflow.review import review_source

WORKFLOW = '''"""Three agents, one after the other."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Ask(Model):
    """What to do."""

    text: str = Field(min_length=1, max_length=100)


class Done(Model):
    """What was done."""

    summary: str = Field(min_length=1, max_length=100)


worker = agent(profile="tool", access="write", network="none", output=Done)


@workflow(description="Three agents.", input=Ask, output=Done)
async def run(flow: Any, args: Ask) -> Done:
    await flow.agent(worker, prompt="one")
    await flow.agent(worker, prompt="two")
    result = await flow.agent(worker, prompt="three")
    done: Done = result.output
    return done
'''
OWNER = os.getuid() or 65534  # launches are refused for root


# --- the selection, on operation rows ------------------------------------------------


def op(op_id: str, scope: str, seq: int, kind: str = "agent", state: str = "committed",
       request: dict[str, Any] | None = None) -> OpRow:
    return OpRow(
        run_id="flow_" + "1" * 32, scope=scope, seq=seq, op_id=op_id, kind=kind,
        request=request or {}, request_hash="sha256:x", source_location=f"w.py:{seq}:1",
        predecessor=None, attempt=1, state=state,  # type: ignore[arg-type]
        finish=None, result={"output": {}}, error=None, checkpoint=None, created_at=0.0,
        updated_at=0.0,
    )


SEQUENTIAL = [op("root-1", "root", 1), op("root-2", "root", 2), op("root-3", "root", 3)]
WITH_LANES = [
    op("root-1", "root", 1),
    op("root-2", "root", 2, kind="parallel", request={"lanes": ["a", "b"]}),
    op("root-2-a-1", "root-2-a", 1),
    op("root-2-b-1", "root-2-b", 1, state="failed"),
    op("root-3", "root", 3),
]


def test_a_root_boundary_imports_every_root_operation_up_to_it() -> None:
    chosen = select_imports(SEQUENTIAL, "src", "root-2")
    assert [o.op_id for o in chosen] == ["root-1", "root-2"]


def test_a_fork_comes_with_every_lane_operation_and_its_join() -> None:
    chosen = select_imports(WITH_LANES, "src", "root-2")
    assert [o.op_id for o in chosen] == ["root-1", "root-2", "root-2-a-1", "root-2-b-1"]
    assert [o.op_id for o in select_imports(WITH_LANES, "src", "root-1")] == ["root-1"]


def test_an_operation_inside_a_lane_is_refused_naming_its_fork() -> None:
    with pytest.raises(UsageError, match="root-2-a-1 is inside a lane; a lane cannot be "
                       r"replayed without its siblings and join \(replay through its fork "
                       r"root-2\)") as caught:
        select_imports(WITH_LANES, "src", "root-2-a-1")
    assert caught.value.hint == "pick a root-level boundary: root-1, root-2, root-3"


def test_an_unknown_operation_lists_the_boundaries() -> None:
    with pytest.raises(NotFound, match="has no operation root-9") as caught:
        select_imports(SEQUENTIAL, "src", "root-9")
    assert caught.value.hint == "pick a root-level boundary: root-1, root-2, root-3"


def test_an_operation_that_did_not_commit_or_has_no_checkpoint_is_refused() -> None:
    failed = [*SEQUENTIAL[:2], op("root-3", "root", 3, state="failed")]
    with pytest.raises(UsageError, match="root-3 is a failed agent operation, not a committed"):
        select_imports(failed, "src", "root-3")
    asked = [op("root-1", "root", 1, kind="ask"), *SEQUENTIAL[1:]]
    with pytest.raises(UsageError, match="root-1 is a committed ask operation"):
        select_imports(asked, "src", "root-1")


def test_a_lane_still_open_makes_its_fork_incomplete() -> None:
    open_lane = [*WITH_LANES[:3], op("root-2-b-1", "root-2-b", 1, state="started")]
    with pytest.raises(UsageError, match="root-2-b-1 never finished"):
        select_imports(open_lane, "src", "root-2")


def test_the_latest_replay_point_is_the_last_boundary_replay_accepts() -> None:
    assert latest_replay_point(SEQUENTIAL, "src") == "root-3"
    failed = [*SEQUENTIAL[:2], op("root-3", "root", 3, state="failed")]
    assert latest_replay_point(failed, "src") == "root-2"
    # a boundary past an open lane is incomplete: the one before the fork is the latest
    open_lane = [*WITH_LANES[:3], op("root-2-b-1", "root-2-b", 1, state="started"),
                 WITH_LANES[4]]
    assert latest_replay_point(open_lane, "src") == "root-1"
    assert latest_replay_point(WITH_LANES, "src") == "root-3"
    assert latest_replay_point([op("root-1", "root", 1, kind="ask")], "src") is None
    # a root operation that did not commit makes every later boundary incomplete
    gap = [SEQUENTIAL[0], op("root-2", "root", 2, state="failed"), SEQUENTIAL[2]]
    assert latest_replay_point(gap, "src") == "root-1"
    assert latest_replay_point([], "src") is None


# --- cairnd, on a real journal ---------------------------------------------------------


@pytest.fixture(autouse=True)
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    (tmp_path / "etc/cairn/profiles.d").mkdir(parents=True)
    (tmp_path / "etc/cairn/profiles.d/tool.toml").write_text(
        'kind = "command"\nargv = ["/bin/true"]\n'
    )
    # No Btrfs pool here: free-space admission is tested on a real pool in tests/btrfs.
    monkeypatch.setattr(retention, "admit", lambda what: 1 << 40)  # launch's and replay's
    return tmp_path


@pytest.fixture
def journal(host: Path, owner_channel: object) -> Iterator[Journal]:
    with Journal(paths.journal_path(), create=True) as opened:
        yield opened


def broker_that_starts(started: list[str]) -> Any:
    def call(verb: str, run_id: str, *, timeout: float = 0, attestation: int | None = None,
             ) -> BrokerReply:
        started.append(run_id)
        receipt = Receipt(intent_id="start-coordinator", run_id=run_id, kind="start-coordinator",
                          data={"unit": f"cairn-coordinator@{run_id}.service"}, at=time.time())
        return BrokerReply(ok=True, receipts=[receipt])

    return call


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    runs: list[str] = []
    monkeypatch.setattr(attest, "call_broker", broker_that_starts(runs))
    return runs


def finished_source(journal: Journal, host: Path, state: str = "succeeded",
                    error: str | None = None) -> str:
    """A launched run whose three agents committed, ended ``state``, with boundary files."""
    project = host / "project"
    project.mkdir(exist_ok=True)
    if os.getuid() == 0:
        os.chown(project, OWNER, -1)
    review = review_source(WORKFLOW, filename="three.py")
    request = LaunchRequest(definition="three.py", source=WORKFLOW, confirm=review.review_hash,
                            args={"text": "go"}, project=str(project))
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    try:
        run_id = launch.start(journal, request, OWNER, fd).run_id
    finally:
        os.close(fd)
    token = journal.acquire_lease(run_id, "t", ttl=60)
    predecessor = None
    for seq, prompt in enumerate(("one", "two", "three"), start=1):
        call = CallRequest(scope="root", seq=seq, kind="agent", location=f"three.py:{seq}:5",
                           request={"prompt": prompt, "descriptor": "worker"})
        op_id = f"root-{seq}"
        journal.record_requested(call, run_id=run_id, op_id=op_id, predecessor=predecessor,
                                 token=token)
        journal.update_op(run_id, op_id, token=token, state="started")
        journal.update_op(run_id, op_id, token=token, state="settled",
                          result={"output": {"summary": prompt}}, checkpoint={"s": {}})
        journal.update_op(run_id, op_id, token=token, state="committed")
        boundary = paths.run_state_dir(run_id) / "boundaries" / op_id
        boundary.mkdir(parents=True)
        (boundary / "handoff.md").write_text(f"{prompt}\n")
        predecessor = op_id
    journal.set_run_state(run_id, state, token=token, error=error)  # type: ignore[arg-type]
    return run_id


def test_a_failed_run_names_the_checkpoint_its_retry_replays_from(
    journal: Journal, host: Path, started: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from clirunner import CliRunner

    from cairn.cli import runs
    from cairn.cli.commands import app
    from cairn.daemon import views

    failed = finished_source(journal, host, state="failed", error="agent root-4 failed")
    listed = {r["run_id"]: r for r in views.ps(journal, OWNER, all_users=False)}
    assert (listed[failed]["error"], listed[failed]["replay_through"]) == (
        "agent root-4 failed", "root-3")
    assert listed[failed]["replayed_by"] == []
    shown = views.show(journal, failed, OWNER)
    assert shown["replay_through"] == "root-3"
    monkeypatch.setattr(runs, "request", lambda _body, **_kw: shown)
    out = CliRunner().invoke(app, ["show", failed])
    assert out.exit_code == 0, out.output
    assert f"retry from its last checkpoint: cairn replay {failed} --through root-3\n" \
        in out.stdout
    # retried: the list names the new run (the console's inbox leaves the failed one out)
    retried = daemon_replay.replay(journal, failed, "root-3", OWNER)["run_id"]
    listed = {r["run_id"]: r for r in views.ps(journal, OWNER, all_users=False)}
    assert listed[failed]["replayed_by"] == [retried]
    assert listed[retried]["replayed_by"] == []  # not failed: nothing is asked
    # a running run is retried by nothing: it names no replay point
    # once its storage is deleted, nothing is left to retry from
    journal.add_intents(failed, [Intent(intent_id="delete-run", run_id=failed,
                                        kind="delete-run")], token=None)
    journal.record_receipts(failed, [Receipt(
        intent_id="delete-run", run_id=failed, kind="delete-run",
        data=RunDeleted(deleted=[]).wire(), at=time.time()).model_dump(mode="json")])
    listed = {r["run_id"]: r for r in views.ps(journal, OWNER, all_users=False)}
    assert listed[failed]["replay_through"] is None
    assert views.show(journal, failed, OWNER)["replay_through"] is None
    running = finished_source(journal, host, state="running")
    assert views.show(journal, running, OWNER)["replay_through"] is None


def test_a_replay_imports_the_boundary_with_provenance_and_the_same_definition(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    before = [o.model_dump() for o in journal.list_ops(source)]
    done = daemon_replay.replay(journal, source, "root-2", OWNER)
    new = done["run_id"]
    assert new != source and started[-1] == new
    assert done["imported"] == ["root-1", "root-2"]
    old_desc, desc = journal.launch_description(source), journal.launch_description(new)
    assert desc.replay == ReplayOrigin(source_run=source, through_op="root-2",
                                       ops=["root-1", "root-2"])
    assert (desc.source, desc.review_hash, desc.args, desc.project) == (
        old_desc.source, old_desc.review_hash, old_desc.args, old_desc.project)
    assert desc.launch_hash() != old_desc.launch_hash()
    imported = journal.list_ops(new)
    assert [(o.op_id, o.state, o.result) for o in imported] == [
        ("root-1", "committed", {"output": {"summary": "one"}}),
        ("root-2", "committed", {"output": {"summary": "two"}}),
    ]
    fields = ("scope", "seq", "kind", "request_hash", "source_location", "predecessor")
    for mine, theirs in zip(imported, journal.list_ops(source), strict=False):
        assert [getattr(mine, f) for f in fields] == [getattr(theirs, f) for f in fields]
    provenance = [e.data for e in journal.events(new) if e.event == "op-imported"]
    assert provenance == [
        {"source_run": source, "source_op": "root-1", "state": "committed"},
        {"source_run": source, "source_op": "root-2", "state": "committed"},
    ]
    assert (paths.run_state_dir(new) / "boundaries/root-2/handoff.md").read_text() == "two\n"
    assert not (paths.run_state_dir(new) / "boundaries/root-3").exists()
    assert [o.model_dump() for o in journal.list_ops(source)] == before
    with read_snapshot(journal):
        view = run_view(journal, journal.get_run(new))
    assert view["replayed_from"] == {"run_id": source, "through": "root-2", "imported": 2}
    assert [o["imported_from"] for o in view["operations"]] == [
        {"run_id": source, "op_id": "root-1"}, {"run_id": source, "op_id": "root-2"}]
    assert view["integrity"]["ok"], view["integrity"]


def test_a_replay_is_refused_for_another_user_an_unfinished_run_and_deleted_storage(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    with pytest.raises(NotFound, match=f"no run {source}"):
        daemon_replay.replay(journal, source, "root-2", OWNER + 1)
    with pytest.raises(UsageError, match="no operation given"):
        daemon_replay.replay(journal, source, None, OWNER)
    run = journal.get_run(source)
    with pytest.raises(UsageError, match="is not yours; only its owner can replay it"):
        daemon_replay.check_source(run, OWNER + 1, storage_deleted=False)
    with pytest.raises(UsageError, match=r"was deleted \(cairn rm\)"):
        daemon_replay.check_source(run, OWNER, storage_deleted=True)
    with pytest.raises(UsageError, match="is running; only a finished or stopped run"):
        daemon_replay.check_source(
            run.model_copy(update={"state": "running"}), OWNER, storage_deleted=False
        )
    journal.add_intents(source, [Intent(intent_id="delete-run", run_id=source,
                                        kind="delete-run")], token=None)
    journal.record_receipts(source, [Receipt(
        intent_id="delete-run", run_id=source, kind="delete-run",
        data=RunDeleted(deleted=[]).wire(), at=time.time()).model_dump(mode="json")])
    with pytest.raises(UsageError, match="its checkpoints are gone"):
        daemon_replay.replay(journal, source, "root-2", OWNER)
    assert len(journal.list_runs(None)) == 1


# --- the broker's checks, before any snapshot ------------------------------------------


def subvolume(path: str) -> SubvolumeReceipt:
    return SubvolumeReceipt(path=path, subvol_id=256, uuid="u-" + path, fsid="f",
                            read_only=True, generation=1)


def broker_context(run_id: str) -> IntentContext:
    reader = JournalReader(paths.journal_path())
    store = ReceiptStore()
    intent = Intent(intent_id="prepare-q", run_id=run_id, kind="prepare-q")
    desc = reader.launch_description(run_id)
    if desc.replay is not None:
        pin_as_attested(desc.replay.source_run)
    return IntentContext(intent, desc, pin_as_attested(run_id), reader, store)


def test_the_broker_refuses_a_replayed_run_whose_imported_rows_were_tampered_with(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    new = daemon_replay.replay(journal, source, "root-2", OWNER)["run_id"]
    raw = sqlite3.connect(paths.journal_path())
    raw.execute("UPDATE operations SET result='{\"output\":{\"summary\":\"forged\"}}' "
                "WHERE run_id=? AND op_id='root-1'", (new,))
    raw.commit()
    raw.close()
    with pytest.raises(BrokerRefused, match=f"{new}'s root-1 is not {source}'s operation"):
        remint_q(broker_context(new))


def test_the_broker_recomputes_the_selection_and_checks_owner_and_storage(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    new = daemon_replay.replay(journal, source, "root-2", OWNER)["run_id"]
    desc = journal.launch_description(new)
    forged = desc.model_copy(update={
        "run_id": "flow_" + "e" * 32,
        "replay": ReplayOrigin(source_run=source, through_op="root-2", ops=["root-2"]),
    })
    journal.create_run(forged, intents=[], imported=journal.list_ops(source)[1:2])
    with pytest.raises(BrokerRefused, match="does not import exactly the boundary it names"):
        remint_q(broker_context(forged.run_id))
    other = desc.model_copy(update={"run_id": "flow_" + "d" * 32, "owner_uid": OWNER + 1})
    journal.create_run(other, intents=[])
    with pytest.raises(BrokerRefused, match="is not owned by the owner of"):
        remint_q(broker_context(other.run_id))
    store = ReceiptStore()
    with pytest.raises(BrokerRefused, match=f"{source} has no checkpoint of root-2"):
        remint_q(broker_context(new))
    store.put(Intent(intent_id="checkpoint.root-2", run_id=source, kind="checkpoint",
                     op_id="root-2"), Checkpointed(s=subvolume("/pool/s2"), op_id="root-2"))
    assert source_checkpoints(broker_context(new), source) == {"root-2": subvolume("/pool/s2")}
    store.put(Intent(intent_id="delete-run", run_id=source, kind="delete-run"),
              RunDeleted(deleted=[]))
    store.close()
    with pytest.raises(BrokerRefused, match=f"the storage of replay source {source} was deleted"):
        remint_q(broker_context(new))


def test_the_broker_remints_only_a_finished_source_of_the_same_run_with_a_q(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    new = daemon_replay.replay(journal, source, "root-2", OWNER)["run_id"]
    store = ReceiptStore()
    store.put(Intent(intent_id="checkpoint.root-2", run_id=source, kind="checkpoint",
                     op_id="root-2"), Checkpointed(s=subvolume("/pool/s2"), op_id="root-2"))
    store.close()
    with pytest.raises(BrokerRefused, match=f"replay source {source} has no Q"):
        remint_q(broker_context(new))

    desc = journal.launch_description(new)
    assert desc.replay is not None
    rewritten = desc.model_copy(update={"run_id": "flow_" + "b" * 32,
                                        "source": "print('another workflow')"})
    journal.create_run(rewritten, intents=[])
    with pytest.raises(BrokerRefused,
                       match=f"replay source {source} is another project or definition"):
        remint_q(broker_context(rewritten.run_id))

    unfinished = journal.launch_description(source).model_copy(
        update={"run_id": "flow_" + "c" * 32})
    journal.create_run(unfinished, intents=[])
    early = desc.model_copy(update={
        "run_id": "flow_" + "d" * 32,
        "replay": desc.replay.model_copy(update={"source_run": unfinished.run_id}),
    })
    journal.create_run(early, intents=[])
    with pytest.raises(BrokerRefused,
                       match=f"replay source {unfinished.run_id} is pending, not finished"):
        remint_q(broker_context(early.run_id))

    ghost = "flow_" + "f" * 32
    orphan = desc.model_copy(update={
        "run_id": "flow_" + "9" * 32,
        "replay": desc.replay.model_copy(update={"source_run": ghost}),
    })
    journal.create_run(orphan, intents=[])
    reader, store = JournalReader(paths.journal_path()), ReceiptStore()
    context = IntentContext(Intent(intent_id="prepare-q", run_id=orphan.run_id, kind="prepare-q"),
                      orphan, pin_as_attested(orphan.run_id), reader, store)
    with pytest.raises(BrokerRefused, match=f"replay source {ghost}: no run {ghost}"):
        remint_q(context)


def test_the_broker_remints_only_from_another_run_its_owner_attested_on_this_project(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    new = daemon_replay.replay(journal, source, "root-2", OWNER)["run_id"]
    desc = journal.launch_description(new)
    assert desc.replay is not None
    reader, store = JournalReader(paths.journal_path()), ReceiptStore()
    intent = Intent(intent_id="prepare-q", run_id=new, kind="prepare-q")
    unpinned_source = IntentContext(intent, desc, pin_as_attested(new), reader, store)
    with pytest.raises(BrokerRefused,
                       match=f"replay source {source} was never attested by its owner"):
        remint_q(unpinned_source)

    moved = pin_as_attested(new)._replace(run_id=source, project_ino=1,
                                          description=journal.launch_description(source)
                                          .model_dump_json(),
                                          launch_hash=journal.launch_description(source)
                                          .launch_hash())
    store.put_pin(moved, pid=os.getpid())
    with pytest.raises(BrokerRefused,
                       match=f"replay source {source} is another project or definition"):
        remint_q(broker_context(new))

    itself = desc.model_copy(update={
        "run_id": "flow_" + "7" * 32,
        "replay": desc.replay.model_copy(update={"source_run": "flow_" + "7" * 32}),
    })
    journal.create_run(itself, intents=[])
    with pytest.raises(BrokerRefused, match=f"{itself.run_id} cannot be replayed from itself"):
        remint_q(broker_context(itself.run_id))

    store.close()
    reader.close()


def test_the_broker_recomputes_the_boundary_from_the_sources_own_rows(
    journal: Journal, host: Path, started: list[str]
) -> None:
    source = finished_source(journal, host)
    new = daemon_replay.replay(journal, source, "root-2", OWNER)["run_id"]
    desc = journal.launch_description(new)
    assert desc.replay is not None
    nowhere = desc.model_copy(update={
        "run_id": "flow_" + "6" * 32,
        "replay": desc.replay.model_copy(update={"through_op": "root-9", "ops": ["root-9"]}),
    })
    journal.create_run(nowhere, intents=[])
    with pytest.raises(BrokerRefused,
                       match=f"replay of {source}: run {source} has no operation root-9"):
        remint_q(broker_context(nowhere.run_id))

    store = ReceiptStore()
    lane = subvolume("/pool/lane")
    store.put(Intent(intent_id="fork.root-1", run_id=source, kind="fork", op_id="root-1"),
              Forked(s=subvolume("/pool/s1"), op_id="root-1", lanes={"a": ForkLane(w=lane)}))
    store.close()
    assert source_checkpoints(broker_context(new), source) == {"root-1": subvolume("/pool/s1")}


# --- the CLI -----------------------------------------------------------------------


def test_cairn_replay_sends_the_run_and_operation_and_says_what_it_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clirunner import CliRunner

    from cairn.cli import runs
    from cairn.cli.commands import app

    sent: list[Any] = []
    source, new = "flow_" + "3fa9" * 8, "flow_" + "0b1c" * 8

    def request(body: Any, **_kwargs: Any) -> Any:
        sent.append(body)
        if body.op == "replay":
            return {"run_id": new, "source_run": source, "through": "root-2",
                    "imported": ["root-1", "root-2"], "review_hash": "sha256:0",
                    "launch_hash": "sha256:1", "state": "pending"}
        return {"run": {"run_id": new, "state": "running", "definition": "wf.py",
                        "project": "/p", "error": None},
                "replayed_from": {"run_id": source, "through": "root-2", "imported": 2},
                "operations": [{"op_id": "root-1", "kind": "agent", "state": "committed",
                                "attempt": 1, "location": "wf.py:1:5", "output": None,
                                "checkpoint": {"s": {"path": "/pool/x", "uuid": "u"}},
                                "imported_from": {"run_id": source, "op_id": "root-1"}}],
                "units": [], "storage": {"deleted": False, "deleted_at": None, "subvolumes": 0},
                "settlement": None, "settlement_summary": None, "worklists": [],
                "experiments": [], "model": None, "question": None, "divergence": None,
                "integrity": {"ok": True, "issues": []}, "latest_event": None,
                "events_shown": "all 0 events", "progress": {}}

    monkeypatch.setattr(runs, "request", request)
    cli = CliRunner()
    made = cli.invoke(app, ["replay", "3fa9", "--through", "root-2"])
    assert made.exit_code == 0, made.output
    assert (sent[0].op, sent[0].run_id, sent[0].op_id) == ("replay", "3fa9", "root-2")
    assert made.stdout == (f"{new}: replayed from {source} through root-2 (2 operations "
                           f"imported)\nfollow it with 'cairn watch {new}'\n")
    shown = cli.invoke(app, ["show", new])
    assert shown.exit_code == 0, shown.output
    assert (f"replayed from {source} through root-2 (2 operations imported, the rest run "
            "fresh)") in shown.stdout
    assert f"imported from {source} root-1" in shown.stdout
    assert "/pool/x" not in shown.stdout  # the source's checkpoint is not shown as its own
    missing = cli.invoke(app, ["replay", "3fa9"])
    assert missing.exit_code != 0 and "Missing option '--through'" in missing.stderr
