"""The broker's storage and launch handlers over a stand-in pool: each receipt body goes
into the receipt store as the JSON the broker has always recorded, and later handlers read
what earlier ones recorded (Q, W, S, a fork's lanes) through the typed bodies."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cairn import paths, storage
from cairn.broker import units, verbs
from cairn.broker.receipts import Pin, ReceiptStore
from cairn.errors import BrokerRefused
from cairn.protocol.broker import (
    AgentStarted,
    ImportDone,
    Intent,
    RunDeleted,
    SubvolumeReceipt,
    WCreated,
)
from cairn.protocol.launch import LaunchDescription, ModelRoute, ProjectSpec

REPO = Path(__file__).resolve().parents[2]
RUN = "flow_" + "1" * 32
QGROUP = (1 << 48) | 0x111111111111


class FakePool:
    """Subvolumes as directories, each with the receipt a snapshot returned."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[Path, SubvolumeReceipt] = {}
        self.qgroups: dict[Path, int | None] = {}

    def ensure_run_qgroup(self, run_id: str) -> int | None:
        return QGROUP  # as if the host had quotas on

    def create_subvolume(self, target: Path, *, qgroup: int | None = None) -> SubvolumeReceipt:
        return self.snapshot(target, target, read_only=False, qgroup=qgroup)

    def receipt(self, path: Path) -> SubvolumeReceipt:
        return self.made[path]

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def q_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "Q"

    def q_import_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "Q.import"

    def w_path(self, run_id: str, scope: str, generation: int) -> Path:
        return self.run_dir(run_id) / "W" / f"{scope}.{generation}"

    def checkpoint_path(self, run_id: str, op_id: str) -> Path:
        return self.run_dir(run_id) / "S" / op_id

    def settlement_path(self, run_id: str, name: str) -> Path:
        return self.run_dir(run_id) / name

    def snapshot(
        self, source: Path, target: Path, *, read_only: bool, qgroup: int | None = None
    ) -> SubvolumeReceipt:
        target.mkdir(parents=True)
        self.qgroups[target] = qgroup
        receipt = SubvolumeReceipt(
            path=str(target),
            subvol_id=256 + len(self.made),
            uuid=f"uuid-{len(self.made)}",
            fsid="fsid",
            read_only=read_only,
            generation=7,
        )
        self.made[target] = receipt
        return receipt

    def verify(self, path: Path, expected: SubvolumeReceipt) -> SubvolumeReceipt:
        assert self.made[Path(path)] == expected
        return expected

    def delete(self, path: Path, expected: SubvolumeReceipt) -> None:
        self.verify(path, expected)
        del self.made[path]
        path.rmdir()

    def run_subvolumes(self, run_id: str) -> list[Path]:
        return sorted(self.made)

    def delete_run(self, run_id: str) -> list[str]:
        gone = [str(path) for path in sorted(self.made, reverse=True)]
        self.made.clear()
        return gone


class FakeJournal:
    def __init__(self, ops: dict[str, Any]) -> None:
        self.ops = ops
        self.run = SimpleNamespace(state="pending", settlement=None)

    def get_run(self, run_id: str) -> Any:
        return self.run

    def get_op_by_id(self, run_id: str, op_id: str) -> Any:
        return self.ops[op_id]

    def list_ops(self, run_id: str) -> list[Any]:
        return list(self.ops.values())


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path / "host"))
    project = tmp_path / "project"
    project.mkdir()
    pool = FakePool(tmp_path / "pool")
    monkeypatch.setattr(verbs.IntentContext, "pool", lambda self: pool)
    monkeypatch.setattr(verbs, "reclaim", lambda root, timeout: 0)  # no Btrfs cleaner here
    monkeypatch.setattr(storage, "is_same_filesystem", lambda a, b: True)
    monkeypatch.setattr(storage, "containing_subvolume", lambda p: (p, Path("sub")))
    monkeypatch.setattr(units, "require_quiesced", lambda unit, cgroup: None)
    monkeypatch.setattr(units, "require_ended", lambda names, what: None)
    monkeypatch.setattr(units, "start_unit", lambda name: None)
    monkeypatch.setattr(units, "remove_proxy", lambda run_id: False)
    monkeypatch.setattr(verbs, "failpoint", lambda *args: None)
    paths.broker_db_path().parent.mkdir(parents=True)
    paths.egress_skipped_dir().mkdir(parents=True, mode=0o700)  # tmpfiles.d's, at boot
    desc = LaunchDescription(
        run_id=RUN,
        owner_uid=os.getuid(),
        owner_gid=os.getgid(),
        owner_name="owner",
        definition="builtin:implement",
        source="",
        source_filename="implement.py",
        review_hash="sha256:" + "a" * 64,
        review={},
        args={},
        project=ProjectSpec(root=str(project), owner_uid=os.getuid(), on_pool_fs=True),
        profiles={},
        cairn_version="test",
        created_at=1.0,
    )
    ops = {
        "root-1": SimpleNamespace(
            op_id="root-1", kind="agent", scope="root", state="committed", request={}
        ),
        "root-2": SimpleNamespace(
            op_id="root-2", kind="parallel", scope="root", state="started",
            request={"lanes": ["a", "b"]},
        ),
    }
    store = ReceiptStore()
    st = os.lstat(project)
    pin = Pin(RUN, os.getuid(), os.getgid(), desc.launch_hash(), st.st_dev, st.st_ino,
              desc.model_dump_json())
    store.put_pin(pin, pid=os.getpid())
    yield {"desc": desc, "pin": pin, "journal": FakeJournal(ops), "store": store, "pool": pool}
    store.close()


def _do(host: dict[str, Any], intent_id: str, kind: str, **fields: Any) -> dict[str, Any]:
    intent = Intent(intent_id=intent_id, run_id=RUN, kind=kind, **fields)  # type: ignore[arg-type]
    body = verbs.handle_intent(intent, host["desc"], host["pin"], host["journal"], host["store"])
    receipt = host["store"].put(intent, body)
    stored = host["store"].get(RUN, intent_id)
    assert stored is not None and stored.data == receipt.data
    data: dict[str, Any] = json.loads(json.dumps(receipt.data))
    return data


def _sub(pool: FakePool, path: Path) -> dict[str, Any]:
    return pool.made[path].model_dump()


def test_storage_receipts_keep_their_json_and_chain(host: dict[str, Any]) -> None:
    pool: FakePool = host["pool"]
    run = pool.run_dir(RUN)

    q = _do(host, "prepare-q", "prepare-q")
    assert list(q) == ["q", "subpath", "imported", "project_ino"]
    assert q["q"] == _sub(pool, run / "Q") and q["subpath"] == "sub" and not q["imported"]

    w = _do(host, "create-w.root.1", "create-w")
    assert w == {"w": _sub(pool, run / "W" / "root.1"), "source_uuid": q["q"]["uuid"]}

    host["store"].put(
        Intent(intent_id="start-agent.root-1.1", run_id=RUN, kind="start-agent", op_id="root-1"),
        AgentStarted(
            unit="u.service", invocation_id="i", control_group="/cg", attempt=1, capsule="c",
            op_id="root-1",
        ),
    )
    s = _do(host, "checkpoint.root-1", "checkpoint", op_id="root-1")
    assert s == {"s": _sub(pool, run / "S" / "root-1"), "op_id": "root-1"}

    fork = _do(host, "fork.root-2", "fork", op_id="root-2", lanes=["a", "b"])
    assert list(fork) == ["s", "op_id", "lanes"] and fork["op_id"] == "root-2"
    assert fork["lanes"] == {
        key: {"w": _sub(pool, run / "W" / f"root-2-{key}.1")} for key in ("a", "b")
    }

    # a lane's W comes from its fork; root's W.1 from its create-w receipt
    lane = _do(host, "drop-w.root-2-a.1", "drop-w", scope="root-2-a", generation=1)
    assert lane == {"deleted": str(run / "W" / "root-2-a.1")}
    again = _do(host, "create-w.root.2", "create-w", generation=2, from_checkpoint="root-1")
    assert again == {"w": _sub(pool, run / "W" / "root.2"), "source_uuid": s["s"]["uuid"]}
    dropped = _do(host, "drop-w.root.1", "drop-w", generation=1)
    assert dropped == {"deleted": str(run / "W" / "root.1")}

    p = _do(host, "freeze-proposal", "freeze-proposal", generation=2)
    assert p == {"p": _sub(pool, run / "P")}

    # every subvolume a receipt records, the dropped ones included (not checked on disk)
    assert _do(host, "verify-storage.1", "verify-storage") == {"problems": [], "checked": 8}
    w2 = pool.made[run / "W" / "root.2"]
    (run / "W" / "root.2").rmdir()
    report = _do(host, "verify-storage.2", "verify-storage")
    assert report["problems"] == [f"missing subvolume {w2.path} (uuid {w2.uuid})"]
    # Q snapshots the project's own subvolume: sharing its extents, no subvolume of the
    # run goes into a qgroup of the run's (that would make quota data inconsistent)
    assert set(pool.qgroups.values()) == {None}


def test_a_lane_w_is_restored_from_its_forks_s_and_nothing_else_is(host: dict[str, Any]) -> None:
    """A lane's clean retry before its first boundary restores from the fork's S (the
    broker's own fork receipt); that S is no checkpoint for any other scope."""
    pool: FakePool = host["pool"]
    run = pool.run_dir(RUN)
    _do(host, "prepare-q", "prepare-q")
    _do(host, "create-w.root.1", "create-w")
    fork = _do(host, "fork.root-2", "fork", op_id="root-2", lanes=["a", "b"])
    again = _do(host, "create-w.root-2-a.2", "create-w", scope="root-2-a", generation=2,
                from_checkpoint="root-2")
    assert again == {"w": _sub(pool, run / "W" / "root-2-a.2"),
                     "source_uuid": fork["s"]["uuid"]}
    for scope in ("root", "root-2-c", "root-3-a"):
        intent = Intent(intent_id=f"create-w.{scope}.2", run_id=RUN, kind="create-w",
                        scope=scope, generation=2, from_checkpoint="root-2")
        with pytest.raises(BrokerRefused, match="needs checkpoint.root-2, which was not done"):
            verbs.handle_intent(intent, host["desc"], host["pin"], host["journal"], host["store"])
    assert not (run / "W" / "root.2").exists()


def test_an_imported_runs_subvolumes_all_go_into_its_qgroup(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool: FakePool = host["pool"]
    monkeypatch.setattr(storage, "is_same_filesystem", lambda a, b: False)
    imported = ImportDone(unit="u", invocation_id="i")
    monkeypatch.setattr(units, "run_import", lambda desc, project, staging: imported)
    monkeypatch.setattr(os, "chown", lambda *args: None)
    q = _do(host, "prepare-q", "prepare-q")
    assert q["imported"] is True
    _do(host, "create-w.root.1", "create-w")
    _do(host, "freeze-proposal", "freeze-proposal", generation=1)
    made = {path.name: group for path, group in pool.qgroups.items()}
    assert made == {"Q.import": QGROUP, "Q": QGROUP, "root.1": QGROUP, "P": QGROUP}


def test_delete_takes_a_finished_runs_storage_and_is_then_recorded(
    host: dict[str, Any]
) -> None:
    pool: FakePool = host["pool"]
    _do(host, "prepare-q", "prepare-q")
    _do(host, "create-w.root.1", "create-w")
    host["journal"].run.state = "succeeded"
    done = _do(host, "delete-run", "delete-run")
    assert sorted(done["deleted"]) == sorted(
        str(pool.run_dir(RUN) / rel) for rel in ("Q", "W/root.1")
    )
    assert pool.made == {}
    assert _do(host, "verify-storage.3", "verify-storage") == {
        "problems": [], "checked": 0, "deleted": True
    }
    leftover = pool.run_dir(RUN) / "W" / "root.9"
    pool.snapshot(leftover, leftover, read_only=False)
    report = _do(host, "verify-storage.4", "verify-storage")
    assert report["problems"] == [f"subvolume {leftover} outlived the run's deletion"]


@pytest.mark.parametrize("state", ["running", "waiting", "paused", "blocked", "pending"])
def test_delete_refuses_a_run_that_is_not_finished(host: dict[str, Any], state: str) -> None:
    host["journal"].run.state = state
    _do(host, "prepare-q", "prepare-q")
    intent = Intent(intent_id="delete-run", run_id=RUN, kind="delete-run")
    with pytest.raises(BrokerRefused, match=f"is {state}; only finished runs are deleted"):
        verbs.handle_intent(intent, host["desc"], host["pin"], host["journal"], host["store"])
    assert host["pool"].made  # nothing deleted


def test_delete_refuses_a_frozen_proposal_never_settled(host: dict[str, Any]) -> None:
    _do(host, "prepare-q", "prepare-q")
    _do(host, "create-w.root.1", "create-w")
    _do(host, "freeze-proposal", "freeze-proposal", generation=1)
    host["journal"].run.state = "succeeded"
    intent = Intent(intent_id="delete-run", run_id=RUN, kind="delete-run")
    with pytest.raises(BrokerRefused, match="never settled"):
        verbs.handle_intent(intent, host["desc"], host["pin"], host["journal"], host["store"])
    host["journal"].run.settlement = {"status": "applied"}
    receipt = verbs.handle_intent(intent, host["desc"], host["pin"], host["journal"], host["store"])
    assert isinstance(receipt, RunDeleted)
    assert receipt.deleted


@pytest.mark.parametrize(
    "fields",
    [
        {"intent_id": "delete-run.2"},
        {"op_id": "root-1"},
        {"scope": "root-2-a"},
        {"generation": 2},
        {"lanes": ["a"]},
        {"from_checkpoint": "root-1"},
    ],
)
def test_delete_takes_nothing_but_the_run(host: dict[str, Any], fields: dict[str, Any]) -> None:
    intent = Intent(**{"intent_id": "delete-run", "run_id": RUN, "kind": "delete-run", **fields})
    with pytest.raises(BrokerRefused, match="a delete names only the run"):
        verbs.handle_intent(intent, host["desc"], host["pin"], host["journal"], host["store"])


def test_start_coordinator_receipt(host: dict[str, Any]) -> None:
    assert _do(host, "start-coordinator", "start-coordinator") == {
        "unit": f"cairn-coordinator@{RUN}.service"
    }


def _with_model_provider(host: dict[str, Any]) -> None:
    route = ModelRoute(provider="fake", base_url="http://127.0.0.1:9/v1", model="m")
    host["desc"] = host["desc"].model_copy(update={"routes": {"fake": route}})


def test_only_a_run_without_model_providers_gets_the_flag_that_skips_its_egress(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = paths.egress_skipped_dir() / RUN
    flagged_at_start: list[bool] = []
    monkeypatch.setattr(units, "start_unit", lambda name: flagged_at_start.append(flag.exists()))
    _do(host, "start-coordinator", "start-coordinator")
    assert flagged_at_start == [True]  # there before PID 1 evaluates the condition
    st = flag.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_size == 0
    assert st.st_uid == os.getuid()  # the broker's own: root in production

    flag.unlink()  # /run after a reboot; cairnd's reconciler queues a new start
    _do(host, "start-coordinator.2", "start-coordinator")
    assert flagged_at_start == [True, True]

    _with_model_provider(host)
    _do(host, "start-coordinator.3", "start-coordinator")
    assert flagged_at_start == [True, True, False] and not flag.exists()


def test_a_link_planted_as_the_egress_flag_is_replaced_not_followed(
    host: dict[str, Any], tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (paths.egress_skipped_dir() / RUN).symlink_to(target)
    _do(host, "start-coordinator", "start-coordinator")
    flag = paths.egress_skipped_dir() / RUN
    assert not flag.is_symlink() and flag.stat().st_size == 0
    assert target.read_text() == "keep\n"


def test_delete_removes_the_egress_flag(host: dict[str, Any]) -> None:
    flag = paths.egress_skipped_dir() / RUN
    _do(host, "start-coordinator", "start-coordinator")
    assert flag.exists()
    host["journal"].run.state = "succeeded"
    _do(host, "delete-run", "delete-run")
    assert not flag.exists()


def test_the_egress_unit_is_skipped_only_on_the_brokers_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``cairn-egress@.service``'s negated condition names the flag the broker makes, in
    the directory tmpfiles.d makes for root alone."""
    monkeypatch.delenv("CAIRN_ROOT", raising=False)
    flags = str(paths.egress_skipped_dir())
    unit = (REPO / "units" / "cairn-egress@.service").read_text()
    assert re.findall(r"^ConditionPathExists=(.*)$", unit, re.MULTILINE) == [f"!{flags}/%i"]
    tmpfiles = (REPO / "units" / "tmpfiles.d" / "cairn.conf").read_text()
    declared = re.findall(rf"^d {re.escape(flags)} +(\S+) +(\S+) +(\S+) +-$", tmpfiles, re.M)
    assert declared == [("0700", "root", "root")]


def test_the_coordinator_of_an_ended_run_is_never_started(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(units, "start_unit", started.append)
    host["journal"].run.state = "failed"  # e.g. its launch could not start it
    with pytest.raises(BrokerRefused, match=f"run {RUN} is failed; its coordinator is not"):
        _do(host, "start-coordinator.2", "start-coordinator")
    assert started == []
    assert host["store"].get(RUN, "start-coordinator.2") is None


def test_a_body_of_another_kind_is_refused(host: dict[str, Any]) -> None:
    intent = Intent(intent_id="drop-w.root.1", run_id=RUN, kind="drop-w")
    with pytest.raises(TypeError, match="a drop-w receipt has no WCreated body"):
        host["store"].put(intent, WCreated(w=SubvolumeReceipt(
            path="/x", subvol_id=1, uuid="u", fsid="f", read_only=False, generation=1)))
