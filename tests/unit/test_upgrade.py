"""`cairn upgrade`: a dry run replays the journal against new source in a real control
worker; only a clean one moves a blocked run, with the move in the journal."""

from __future__ import annotations

import queue
import time
from importlib import resources
from pathlib import Path

import pytest

from cairn import paths
from cairn.daemon import attest
from cairn.daemon.upgrade import upgrade
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply
from cairn.protocol.control import CallRequest
from cairn.protocol.daemon import UpgradeRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source

RUN = "flow_" + "cd" * 16
SOURCE = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()
OWNER = 1001


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    review = review_source(SOURCE, filename="implement.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="builtin:implement", source=SOURCE, source_filename="implement.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"objective": "x"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={"builtin:implementer": ProfileSpec(name="builtin:implementer",
                                                     kind="scripted")},
        cairn_version="0", created_at=time.time(),
    )
    j = Journal(paths.journal_path(), create=True)
    j.create_run(desc, intents=[])
    token = j.acquire_lease(RUN, "test")
    line = review.calls[0].line
    call = CallRequest(scope="root", seq=1, kind="agent",
                       request={"descriptor": "implement", "prompt": "x", "title": "implement"},
                       location=f"implement.py:{line}:14")
    j.record_requested(call, run_id=RUN, op_id="root-1", predecessor=None, token=token)
    j.update_op(RUN, "root-1", token=token, state="committed",
                result={"output": {"summary": "done"}, "handoff": "", "op_id": "root-1"})
    j.release_lease(RUN, token)
    j.db.execute("UPDATE runs SET state='blocked' WHERE run_id=?", (RUN,))
    return j


def request(source: str, *, dry_run: bool, confirm: str | None = None) -> UpgradeRequest:
    return UpgradeRequest(run_id=RUN, source=source, dry_run=dry_run, confirm=confirm)


def test_moved_call_is_clean_and_upgrade_records_new_locations(
    journal: Journal, owner_channel: queue.Queue[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    repinned: list[tuple[str, str, bool]] = []

    def broker(verb: str, run_id: str, *, timeout: float = 0,
               attestation: int | None = None) -> BrokerReply:
        repinned.append((verb, run_id, attestation is not None))
        return BrokerReply(ok=True)

    monkeypatch.setattr(attest, "call_broker", broker)
    shifted = SOURCE.replace('"""Implement one', '# a comment\n\n"""Implement one', 1)
    report = upgrade(journal, request(shifted, dry_run=True), OWNER)
    assert report["divergence"] is None and report["checked"] == 1
    new_hash = review_source(shifted, filename="implement.py").review_hash
    with pytest.raises(CairnError, match="not confirmed"):
        upgrade(journal, request(shifted, dry_run=False), OWNER)
    upgrade(journal, request(shifted, dry_run=False, confirm=new_hash), OWNER)
    assert journal.get_run(RUN).review_hash == new_hash
    assert journal.launch_description(RUN).source == shifted
    op = journal.get_op_by_id(RUN, "root-1")
    assert op.source_location == report["locations"]["root-1"]
    assert any(e.event == "source-upgraded" for e in journal.events(RUN))
    # root acts on the new source only once its owner attested it: the broker was asked
    # to re-pin with the owner's channel, on which cairnd showed the new description
    assert repinned == [("launch-v1", RUN, True)]
    shown = LaunchDescription.model_validate_json(owner_channel.get(timeout=10))
    assert (shown.source, shown.review_hash) == (shifted, new_hash)


def test_changed_request_diverges_and_nothing_moves(journal: Journal) -> None:
    changed = SOURCE.replace("prompt=args.objective", 'prompt=args.objective + "!"')
    report = upgrade(journal, request(changed, dry_run=True), OWNER)
    assert report["divergence"]["op_id"] == "root-1"
    assert report["divergence"]["field"] == "request"
    assert report["divergence"]["actual"]["prompt"] == "x!"
    before = journal.get_run(RUN).review_hash
    with pytest.raises(CairnError, match="diverges at root-1"):
        upgrade(journal, request(changed, dry_run=False, confirm="sha256:x"), OWNER)
    assert journal.get_run(RUN).review_hash == before


def test_another_user_cannot_upgrade(journal: Journal) -> None:
    with pytest.raises(CairnError, match=f"no run {RUN}"):
        upgrade(journal, request(SOURCE, dry_run=True), 1002)
