"""``cairn checkpoints RUN`` in cairnd, on a real journal: every checkpoint receipt with
the operation it froze, its time and size, and what a deleted run's list says. The
snapshots themselves are made on a real pool in tests/btrfs and end to end in
tests/system/test_undo.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_journal import RUN, description

from cairn.daemon.checkpoints import checkpoints
from cairn.errors import NotFound
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import Intent
from cairn.protocol.control import CallRequest

ALICE = 1001
AT = 1_700_000_000.0


def subvolume(op_id: str, subvol_id: int) -> dict[str, object]:
    return {
        "path": f"/pool/runs/{RUN}/checkpoints/{op_id}",
        "subvol_id": subvol_id,
        "uuid": f"00000000-0000-0000-0000-{subvol_id:012d}",
        "fsid": "11111111-1111-1111-1111-111111111111",
        "read_only": True,
        "generation": 7,
    }


def checkpoint_receipt(op_id: str, subvol_id: int, at: float) -> dict[str, Any]:
    return {
        "intent_id": f"checkpoint.{op_id}",
        "run_id": RUN,
        "kind": "checkpoint",
        "data": {"s": subvolume(op_id, subvol_id), "op_id": op_id},
        "at": at,
    }


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal.db", create=True)
    j.create_run(description(), intents=[])
    token = j.acquire_lease(RUN, "t", ttl=60)
    for seq, scope in ((1, "root"), (2, "root")):
        call = CallRequest(scope=scope, seq=seq, kind="agent",
                           request={"descriptor": "implement", "prompt": "p", "title": "t"},
                           location=f"implement.py:{seq}:1")
        j.record_requested(call, run_id=RUN, op_id=f"root-{seq}", predecessor=None, token=token)
    j.update_op(RUN, "root-1", token=token, state="started")
    j.update_op(RUN, "root-1", token=token, state="committed", result={"output": {}})
    j.add_intents(RUN, [
        Intent(intent_id=f"checkpoint.{op}", run_id=RUN, kind="checkpoint", op_id=op)
        for op in ("root-1", "root-2")
    ], token=token)
    j.record_receipts(RUN, [checkpoint_receipt("root-1", 261, AT),
                            checkpoint_receipt("root-2", 262, AT + 60)])
    return j


def test_every_checkpoint_with_its_operation_time_and_size(journal: Journal) -> None:
    sizes = {261: 4096, 262: None}
    listed = checkpoints(journal, RUN, ALICE, size_of=sizes.__getitem__)
    assert listed["run_id"] == RUN and listed["storage"]["deleted"] is False
    first, second = listed["checkpoints"]
    assert first == {
        "op_id": "root-1", "kind": "agent", "scope": "root", "attempt": 1,
        "op_state": "committed", "at": AT, "path": f"/pool/runs/{RUN}/checkpoints/root-1",
        "uuid": "00000000-0000-0000-0000-000000000261", "subvol_id": 261,
        "exclusive": 4096, "deleted": False, "reminted": False,
    }
    # A checkpoint whose operation never committed (a crash after the snapshot) is listed
    # too: its subvolume exists and takes space.
    assert (second["op_id"], second["op_state"], second["exclusive"]) == (
        "root-2", "requested", None)


def test_without_a_pool_the_sizes_are_unknown_and_the_list_stays(
    journal: Journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path / "nohost"))
    listed = checkpoints(journal, RUN, ALICE)
    assert [c["exclusive"] for c in listed["checkpoints"]] == [None, None]
    assert [c["op_id"] for c in listed["checkpoints"]] == ["root-1", "root-2"]


def test_a_deleted_runs_checkpoints_say_so_and_have_no_size(journal: Journal) -> None:
    journal.add_intents(
        RUN, [Intent(intent_id="delete-run", run_id=RUN, kind="delete-run")], token=None)
    journal.record_receipts(RUN, [{
        "intent_id": "delete-run", "run_id": RUN, "kind": "delete-run",
        "data": {"deleted": ["a", "b"], "proxy_removed": False}, "at": AT + 120,
    }])

    def never(_subvol_id: int) -> int | None:
        raise AssertionError("a deleted run's sizes are not read")

    listed = checkpoints(journal, RUN, ALICE, size_of=never)
    assert listed["storage"] == {"deleted": True, "deleted_at": AT + 120, "subvolumes": 2}
    assert [(c["deleted"], c["exclusive"]) for c in listed["checkpoints"]] == [
        (True, None), (True, None)]


def test_a_replayed_runs_reminted_checkpoints_are_listed_as_such(journal: Journal) -> None:
    reminted = checkpoint_receipt("root-1", 263, AT)["data"]["s"]
    q = {**reminted, "path": f"/pool/runs/{RUN}/Q", "subvol_id": 264}
    journal.add_intents(
        RUN, [Intent(intent_id="prepare-q", run_id=RUN, kind="prepare-q")], token=None)
    journal.record_receipts(RUN, [{
        "intent_id": "prepare-q", "run_id": RUN, "kind": "prepare-q", "at": AT - 60,
        "data": {"q": q, "subpath": "", "imported": True, "project_ino": 7,
                 "reminted": {"root-1": reminted}},
    }])
    listed = checkpoints(journal, RUN, ALICE, size_of=lambda _id: None)
    assert [(c["op_id"], c["subvol_id"], c["reminted"]) for c in listed["checkpoints"]] == [
        ("root-1", 263, True), ("root-1", 261, False), ("root-2", 262, False)]


def test_another_users_run_is_not_found(journal: Journal) -> None:
    with pytest.raises(NotFound):
        checkpoints(journal, RUN, 1002, size_of=lambda _id: None)
