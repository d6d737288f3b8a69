"""A replay on a real pool: cairnd records the replayed run, its coordinator asks for
storage, and the broker's own ``carry_out`` remints the source's Q and checkpoints as the
new run's snapshots and makes its root W from the checkpoint it was replayed through.
Real journal, receipts and Btrfs; only the socket and the coordinator's unit start are
left out. The source's checkpoints are snapshots the test takes where its agents would
have run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from attested import owner_channel

from cairn import paths
from cairn.broker.receipts import ReceiptStore
from cairn.coordinator.core import Coordinator
from cairn.daemon import attest
from cairn.daemon import replay as daemon_replay
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply, Checkpointed, Intent, QPrepared, Receipt
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.settle.changes import changes
from cairn.settle.inventory import inventories_equal
from cairn.storage import Pool
from cairn.workflow.review import review_source

pytestmark = pytest.mark.btrfs

OWNER = 65534  # an account every host has; the daemon looks the owner up
SOURCE_RUN = "flow_" + "0" * 31 + "a"
WORKFLOW = '''
from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Ask(Model):
    text: str = Field(min_length=1)


worker = agent(profile="test:x", access="write", network="none", output=Ask)


@workflow(description="three agents", input=Ask, output=Ask)
async def run(flow: Any, args: Ask) -> Ask:
    await flow.agent(worker, prompt="one")
    await flow.agent(worker, prompt="two")
    result = await flow.agent(worker, prompt="three")
    done: Ask = result.output
    return done
'''


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, broker_host: Pool) -> Path:
    pool = broker_host
    monkeypatch.setattr(attest, "call_broker", lambda verb, run_id, **_: BrokerReply(ok=True))
    project = pool.root / "project"
    pool.create_subvolume(project)
    (project / "notes.txt").write_text("before\n")
    os.chown(project, OWNER, OWNER)
    return project


def finished_source(project: Path, pool: Pool) -> None:
    """The source run: Q and W by the broker, then three agents whose W changes the test
    makes and whose checkpoints it takes as the broker would, all committed."""
    review = review_source(WORKFLOW, filename="wf.py")
    desc = LaunchDescription(
        run_id=SOURCE_RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="nobody",
        definition="/home/x/wf.py", source=WORKFLOW, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"text": "go"},
        project=ProjectSpec(root=str(project), owner_uid=OWNER, on_pool_fs=True),
        profiles={"test:x": ProfileSpec(name="test:x", kind="scripted")},
        cairn_version="0", created_at=1.0,
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    coord = Coordinator(SOURCE_RUN)
    coord.token = coord.journal.acquire_lease(SOURCE_RUN, coord.lease.holder)
    coord.prepare_storage()
    w = pool.w_path(SOURCE_RUN, "root", 1)
    store = ReceiptStore()
    predecessor = None
    for seq, prompt in enumerate(("one", "two", "three"), start=1):
        op_id = f"root-{seq}"
        (w / "notes.txt").write_text(f"after {prompt}\n")
        s = pool.snapshot(w, pool.checkpoint_path(SOURCE_RUN, op_id), read_only=True)
        receipt = store.put(Intent(intent_id=f"checkpoint.{op_id}", run_id=SOURCE_RUN,
                                   kind="checkpoint", op_id=op_id),
                            Checkpointed(s=s, op_id=op_id))
        call = CallRequest(scope="root", seq=seq, kind="agent", location=f"wf.py:{seq}:5",
                           request={"prompt": prompt, "descriptor": "worker"})
        coord.journal.record_requested(call, run_id=SOURCE_RUN, op_id=op_id,
                                       predecessor=predecessor, token=coord.token)
        coord.journal.update_op(SOURCE_RUN, op_id, token=coord.token, state="started")
        coord.journal.update_op(SOURCE_RUN, op_id, token=coord.token, state="settled",
                                result={"output": {"text": prompt}}, checkpoint=receipt.data)
        coord.journal.update_op(SOURCE_RUN, op_id, token=coord.token, state="committed")
        predecessor = op_id
    store.close()
    coord.journal.set_run_state(SOURCE_RUN, "succeeded", token=coord.token)
    coord.journal.close()


def receipts(run_id: str) -> dict[str, Receipt]:
    store = ReceiptStore()
    try:
        return {r.intent_id: r for r in store.for_run(run_id)}
    finally:
        store.close()


def test_a_replay_remints_the_sources_snapshots_and_starts_from_its_checkpoint(
    host: Path, pool: Pool
) -> None:
    finished_source(host, pool)
    before = {name: pool.receipt(pool.checkpoint_path(SOURCE_RUN, name))
              for name in ("root-1", "root-2", "root-3")}
    with Journal(paths.journal_path()) as journal, owner_channel():
        done: dict[str, Any] = daemon_replay.replay(journal, SOURCE_RUN, "root-2", OWNER)
    new = done["run_id"]
    coord = Coordinator(new)
    coord.token = coord.journal.acquire_lease(new, coord.lease.holder)
    coord.prepare_storage()
    coord.verify_storage()  # every reminted snapshot is explained by a receipt
    coord.journal.close()

    prepared = receipts(new)["prepare-q"].body(QPrepared)
    assert sorted(prepared.reminted or {}) == ["root-1", "root-2"]
    source_q = receipts(SOURCE_RUN)["prepare-q"].body(QPrepared).q
    assert prepared.q.uuid != source_q.uuid and prepared.q.read_only
    for op_id in ("root-1", "root-2"):
        mine = pool.receipt(pool.checkpoint_path(new, op_id))
        assert mine.uuid == (prepared.reminted or {})[op_id].uuid
        assert mine.uuid != before[op_id].uuid and mine.read_only
        assert inventories_equal(pool.checkpoint_path(new, op_id),
                                 pool.checkpoint_path(SOURCE_RUN, op_id))
    assert not pool.checkpoint_path(new, "root-3").exists()
    w = pool.w_path(new, "root", 1)
    assert (w / "notes.txt").read_text() == "after two\n"
    (w / "notes.txt").write_text("the replay's own work\n")
    (w / "third.txt").write_text("new\n")
    # Settlement compares the proposal with the reminted Q: the kernel's change stream
    # names what the source's agents and the replay's own changed, nothing else.
    p = pool.snapshot(w, pool.settlement_path(new, "P"), read_only=True)
    found = changes(pool.q_path(new), Path(p.path), subpath=prepared.subpath)
    assert sorted(found.paths()) == ["notes.txt", "third.txt"]
    assert list(found.created) == ["third.txt"] and list(found.modified) == ["notes.txt"]
    for name, receipt in before.items():  # the source is untouched
        assert pool.verify(pool.checkpoint_path(SOURCE_RUN, name), receipt).uuid == receipt.uuid
    assert (pool.checkpoint_path(SOURCE_RUN, "root-2") / "notes.txt").read_text() == \
        "after two\n"
    assert (pool.w_path(SOURCE_RUN, "root", 1) / "notes.txt").read_text() == "after three\n"
