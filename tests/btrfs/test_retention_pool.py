"""Retention on a real pool: ``cairn rm`` and ``cairn prune`` (cairnd's side) through the
broker's ``delete-v1`` handler, with a real journal and receipt store (only the socket
between them is left out), space coming back, ``cairn storage df`` and the reserve."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from owner_pins import pin_as_owner

from cairn import paths, proc, retention
from cairn.broker import units, verbs
from cairn.broker.receipts import ReceiptStore
from cairn.coordinator.core import Coordinator
from cairn.daemon import lifecycle, oneshot, views
from cairn.errors import BrokerRefused, StorageError, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply, Intent
from cairn.protocol.control import CallRequest
from cairn.protocol.daemon import PruneRequest, RmRequest, StorageDfRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.storage import Pool, is_subvolume
from cairn.storage_init import init_loop_pool, remove_loop_pool
from cairn.workflow.review import review_source

OWNER = 1001
DATA = 64 << 20


def settle_space(pool: Pool) -> int:
    """Free bytes once deleted subvolumes are cleaned up and the transaction committed."""
    proc.run(["btrfs", "subvolume", "sync", pool.root], timeout=120)
    proc.run(["btrfs", "filesystem", "sync", pool.root], timeout=120)
    return pool.free_bytes()


def make_run_storage(pool: Pool, run_id: str) -> None:
    """Q (of a project subvolume), a W holding DATA bytes the run alone has, and a
    read-only checkpoint of it."""
    project = pool.root / f"project-{run_id}"
    pool.create_subvolume(project)
    pool.snapshot(project, pool.q_path(run_id), read_only=True)
    w = pool.w_path(run_id, "root", 1)
    pool.snapshot(pool.q_path(run_id), w, read_only=False)
    with open(w / "blob", "wb") as f:
        for _ in range(DATA >> 20):
            f.write(os.urandom(1 << 20))
    pool.snapshot(w, pool.checkpoint_path(run_id, "root-1"), read_only=True)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, broker_host: Pool) -> Iterator[dict[str, Any]]:
    """``broker_host``, with cairnd's one-shot broker calls answered by the broker's own
    ``carry_out`` too."""
    monkeypatch.setattr(units, "remove_proxy", lambda run_id: False)
    # No PID 1 here: every unit of these runs has ended (asking it is the system tier's).
    monkeypatch.setattr(units, "require_ended", lambda units, what: None)

    def through_the_broker(verb: str, run_id: str, *, timeout: float) -> BrokerReply:
        return BrokerReply(ok=True, receipts=verbs.carry_out(verb, run_id))

    monkeypatch.setattr(oneshot, "call_broker", through_the_broker)
    monkeypatch.setattr(lifecycle, "is_admin", lambda uid: uid == 0)
    monkeypatch.setattr(views, "is_admin", lambda uid: uid == 0)
    with Journal(paths.journal_path(), create=True) as journal:
        yield {"journal": journal, "pool": broker_host}


def record_run(journal: Journal, run_id: str, state: str) -> None:
    desc = LaunchDescription(
        run_id=run_id, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="builtin:implement", source="", source_filename="implement.py",
        review_hash="sha256:" + "a" * 64, review={}, args={},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={}, cairn_version="0", created_at=1.0,
    )
    journal.create_run(desc, intents=[Intent(intent_id="prepare-q", run_id=run_id,
                                             kind="prepare-q")])
    pin_as_owner(run_id)
    with journal.transaction() as db:
        db.execute("UPDATE runs SET state=? WHERE run_id=?", (state, run_id))


def test_rm_deletes_every_subvolume_gives_the_space_back_and_keeps_the_history(
    host: dict[str, Any], run_id: str
) -> None:
    journal, pool = host["journal"], host["pool"]
    record_run(journal, run_id, "succeeded")
    make_run_storage(pool, run_id)
    before = settle_space(pool)

    done = lifecycle.rm(journal, RmRequest(run_id=run_id), OWNER)

    assert done == {"run_id": run_id, "already_gone": False, "subvolumes": 3}
    assert not pool.run_dir(run_id).exists()
    after = settle_space(pool)
    assert after - before > DATA // 2, (before, after)
    shown = views.show(journal, run_id, OWNER)
    assert shown["run"]["state"] == "succeeded"
    assert shown["storage"]["deleted"] and shown["storage"]["subvolumes"] == 3
    store = ReceiptStore()
    try:
        assert [r.kind for r in store.for_run(run_id)] == ["delete-run"]
    finally:
        store.close()


def test_a_running_run_is_refused_by_cairnd_and_by_the_broker(
    host: dict[str, Any], run_id: str
) -> None:
    journal, pool = host["journal"], host["pool"]
    record_run(journal, run_id, "running")
    make_run_storage(pool, run_id)
    with pytest.raises(UsageError, match="is kept: it is running"):
        lifecycle.rm(journal, RmRequest(run_id=run_id), OWNER)
    # The broker trusts nobody: the same intent written behind cairnd's back is refused.
    journal.add_intents(
        run_id, [Intent(intent_id="delete-run", run_id=run_id, kind="delete-run")], token=None
    )
    with pytest.raises(BrokerRefused, match="only finished runs are deleted"):
        verbs.carry_out("delete-v1", run_id)
    assert is_subvolume(pool.checkpoint_path(run_id, "root-1"))


def test_prune_dry_run_deletes_nothing_and_prune_deletes_what_it_listed(
    host: dict[str, Any], run_id: str
) -> None:
    journal, pool = host["journal"], host["pool"]
    record_run(journal, run_id, "failed")
    make_run_storage(pool, run_id)
    listed = lifecycle.prune(journal, PruneRequest(keep=0, dry_run=True), OWNER)
    assert [r["run_id"] for r in listed["delete"]] == [run_id]
    assert is_subvolume(pool.q_path(run_id))
    pruned = lifecycle.prune(journal, PruneRequest(keep=0), OWNER)
    assert pruned["deleted"] == [{"run_id": run_id, "subvolumes": 3}] and not pruned["failed"]
    assert not pool.run_dir(run_id).exists()


def test_df_reports_the_pool_and_a_run_without_quotas_as_unknown(
    host: dict[str, Any], run_id: str
) -> None:
    journal, pool = host["journal"], host["pool"]
    retention.policy_file().write_text('reserve = "64M"\n')
    record_run(journal, run_id, "running")
    make_run_storage(pool, run_id)
    data = lifecycle.df(journal, StorageDfRequest(), OWNER)
    usage = data["pool"]
    assert 900 << 20 < usage["size"] <= 1 << 30
    assert usage["used"] + usage["free"] <= usage["size"] and usage["used"] >= DATA
    assert usage["reserve"] == 64 << 20 and usage["quotas"] is False
    assert data["runs"] == [
        {
            "run_id": run_id,
            "owner_uid": OWNER,
            "state": "running",
            "finished_at": data["runs"][0]["finished_at"],
            "exclusive": None,
            "held": "it is running; only finished runs are deleted",
        }
    ]


def test_below_the_reserve_a_launch_is_refused_in_one_line(host: dict[str, Any]) -> None:
    retention.policy_file().write_text('reserve = "100G"\n')
    with pytest.raises(StorageError) as caught:
        retention.admit("launch")
    message = caught.value.message
    assert message.startswith("launch refused: storage pool ")
    assert "MiB free, below the reserve of 102400 MiB" in message
    assert "'cairn prune'" in message and "\n" not in message
    retention.policy_file().write_text('reserve = "1M"\n')
    assert retention.admit("launch") > 1 << 20


def test_with_quotas_on_an_imported_runs_storage_is_its_own_and_df_reports_it(
    run_id: str,
) -> None:
    """As the broker makes an imported run's storage with quotas on: every subvolume in
    the run's qgroup, and quota data stays consistent (snapshots are never refused)."""
    base = Path(tempfile.mkdtemp(prefix="cairn-retention-"))
    loop = None
    try:
        loop = init_loop_pool(base / "pool.img", "300M", base / "mnt")
        pool = Pool.open(Path(loop.mountpoint))
        assert retention.run_exclusive_bytes(pool, run_id) is None  # quotas off: unknown
        proc.run(["btrfs", "quota", "enable", loop.mountpoint])
        proc.run(["btrfs", "quota", "rescan", "-w", loop.mountpoint])
        qid = pool.ensure_run_qgroup(run_id)
        staging = pool.q_import_path(run_id)
        pool.create_subvolume(staging, qgroup=qid)
        (staging / "project-file").write_bytes(os.urandom(4 << 20))
        pool.snapshot(staging, pool.q_path(run_id), read_only=True, qgroup=qid)
        w = pool.w_path(run_id, "root", 1)
        pool.snapshot(pool.q_path(run_id), w, read_only=False, qgroup=qid)
        (w / "blob").write_bytes(os.urandom(8 << 20))
        proc.run(["btrfs", "filesystem", "sync", loop.mountpoint])
        pool.snapshot(w, pool.checkpoint_path(run_id, "root-1"), read_only=True, qgroup=qid)
        assert pool.quota_problem() is None
        exclusive = retention.run_exclusive_bytes(pool, run_id)
        assert exclusive is not None and exclusive >= 12 << 20
        # cairn checkpoints: once W is gone its blob is the checkpoint's alone
        checkpoint = pool.receipt(pool.checkpoint_path(run_id, "root-1"))
        pool.delete(w, pool.receipt(w))
        proc.run(["btrfs", "subvolume", "sync", loop.mountpoint], timeout=120)
        proc.run(["btrfs", "filesystem", "sync", loop.mountpoint])
        own = retention.subvolume_exclusive_bytes(pool, checkpoint.subvol_id)
        assert own is not None and own >= 8 << 20
        pool.delete_run(run_id)
    finally:
        if loop is not None:
            remove_loop_pool(loop)
        if not os.path.ismount(base / "mnt"):
            shutil.rmtree(base, ignore_errors=True)


def _coordinator(journal: Journal, run_id: str) -> Coordinator:
    """A coordinator of a run of builtin:implement holding its lease, as at its start."""
    source = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()
    review = review_source(source, filename="implement.py")
    desc = LaunchDescription(
        run_id=run_id, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="builtin:implement", source=source, source_filename="implement.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"objective": "x"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={"builtin:implementer": ProfileSpec(name="builtin:implementer",
                                                     kind="scripted")},
        cairn_version="0", created_at=1.0,
    )
    journal.create_run(desc, intents=[])
    pin_as_owner(run_id)
    coordinator = Coordinator(run_id)
    coordinator.token = coordinator.journal.acquire_lease(run_id, coordinator.holder)
    return coordinator


def test_below_the_reserve_a_runs_import_and_a_fork_are_refused_before_any_intent(
    host: dict[str, Any], run_id: str
) -> None:
    retention.policy_file().write_text('reserve = "100G"\n')
    coordinator = _coordinator(host["journal"], run_id)
    with pytest.raises(StorageError, match="^the project's import or snapshot refused: "):
        coordinator.prepare_storage()
    coordinator.w_gen["root"] = 1
    fork = CallRequest(scope="root", seq=1, kind="parallel", request={"lanes": ["a", "b"]},
                       location="implement.py:1:1")
    op = coordinator.journal.record_requested(fork, run_id=run_id, op_id="root-1",
                                              predecessor=None, token=coordinator.token)
    with pytest.raises(StorageError, match="^fork refused: .*'cairn prune'"):
        coordinator.fork(op, fork)
    assert host["journal"].intents(run_id) == []  # the broker was never asked
    assert host["journal"].get_op_by_id(run_id, "root-1").state == "requested"


def test_an_ended_runs_leftover_intents_are_never_carried_out_by_a_later_check(
    host: dict[str, Any], run_id: str
) -> None:
    """The full pool stopped the run's freeze: the intent stays behind, and the doctor's
    storage check of the failed run later must not freeze P as a side effect."""
    journal, pool = host["journal"], host["pool"]
    record_run(journal, run_id, "failed")
    make_run_storage(pool, run_id)
    leftover = Intent(intent_id="freeze-proposal", run_id=run_id, kind="freeze-proposal",
                      generation=1)
    check = Intent(intent_id="verify-storage.doctor.1", run_id=run_id, kind="verify-storage")
    journal.add_intents(run_id, [leftover, check], token=None)

    receipts = verbs.carry_out("storage-v1", run_id)

    assert [r.kind for r in receipts] == ["verify-storage"]
    assert not pool.settlement_path(run_id, "P").exists()
