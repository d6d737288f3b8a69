"""``cairn launch --apply ask|never`` on a real journal: the proposal held back from the
live project, the approval request ``cairn apply`` decides, and the labels a person sees.
The apply itself and the wait with no process alive are in tests/system/test_undo.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_interactions import OWNER, RUN, SOURCE, incarnation, journal_of, request, root

from cairn.coordinator import interactions
from cairn.daemon import interactions as people
from cairn.daemon import views
from cairn.errors import UsageError
from cairn.protocol.broker import CandidateBuilt, SubvolumeReceipt
from cairn.protocol.launch import ApplyMode, LaunchDescription, ProfileSpec, ProjectSpec
from cairn.protocol.settlement_record import SettlementRecord
from cairn.settle.outcome import APPLY_REQUEST_ID, summary
from cairn.workflow.review import review_source

__all__ = ["root"]  # the fixture, shared with test_interactions

SNAPSHOT = SubvolumeReceipt(
    path="/pool/F", subvol_id=300, uuid="f" * 32, fsid="0" * 32, read_only=True, generation=9
)
BUILT = CandidateBuilt(
    accepted=["CHANGELOG.md", "src/new.py"], refused=[], bytes_accepted=10,
    f=SNAPSHOT, c=SNAPSHOT, diff="--- a/CHANGELOG.md\n",
)
WAITING = SettlementRecord(status="waiting")  # what the run keeps while it waits


def create_run(root: Path, mode: ApplyMode) -> None:
    review = review_source(SOURCE, filename="wf.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=SOURCE, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "the shed"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={"test:fetch": ProfileSpec(name="test:fetch", kind="scripted")},
        cairn_version="0", created_at=0.0, apply_mode=mode,
    )
    with journal_of(root) as journal:
        journal.create_run(desc, intents=[])


def test_auto_applies_at_once(root: Path) -> None:
    create_run(root, "auto")
    assert incarnation().settlement.held_back(BUILT, WAITING) is None


def test_never_holds_without_asking(root: Path) -> None:
    create_run(root, "never")
    coord = incarnation()
    assert coord.settlement.held_back(BUILT, WAITING) == "launched with --apply never"
    assert coord.journal.approval(RUN, APPLY_REQUEST_ID) is None


def test_ask_waits_then_cairn_apply_lets_it_through(root: Path) -> None:
    create_run(root, "ask")
    coord = incarnation()
    with pytest.raises(interactions.RunSuspended) as caught:
        coord.settlement.held_back(BUILT, WAITING)
    assert caught.value.state == "waiting"
    settlement = coord.journal.get_run(RUN).settlement
    assert settlement is not None and settlement["status"] == "waiting"
    waiting = summary(SettlementRecord.read(settlement))
    assert waiting is not None and waiting["label"] == "waiting for 'cairn apply', 0 paths"
    assert interactions.suspend(coord.context, caught.value) == 0
    coord.journal.release_lease(RUN, coord.token)
    with journal_of(root) as journal:
        assert journal.get_run(RUN).state == "waiting"
        (item,) = journal.waiting_for_people(OWNER)
        assert item["request_id"] == APPLY_REQUEST_ID
        assert item["prepared"]["accepted"] == ["CHANGELOG.md", "src/new.py"]
        assert journal.waiting_for_people(OWNER + 1) == []
        view = views.show(journal, RUN, OWNER)
        assert view["integrity"]["issues"] == []  # the settlement is no operation, yet no lie
        assert view["question"]["request_id"] == APPLY_REQUEST_ID
        journal.request_control(RUN, "pause", actor_uid=OWNER)  # keep the broker out of it
        out = people.dispatch(journal, request("apply"), OWNER)
        assert out["outcome"] == "approved"
    assert incarnation().settlement.held_back(BUILT, WAITING) is None


def test_a_rejected_proposal_is_held_with_who_and_why(root: Path) -> None:
    create_run(root, "ask")
    coord = incarnation()
    with pytest.raises(interactions.RunSuspended):
        coord.settlement.held_back(BUILT, WAITING)
    coord.journal.release_lease(RUN, coord.token)
    with journal_of(root) as journal:
        journal.request_control(RUN, "pause", actor_uid=OWNER)
        people.dispatch(
            journal, request("reject", request_id=APPLY_REQUEST_ID, reason="not this"), OWNER
        )
    held = incarnation().settlement.held_back(BUILT, WAITING)
    assert held == "apply rejected by uid 1001: not this"


def test_apply_of_a_run_that_holds_nothing_says_what_to_do(root: Path) -> None:
    create_run(root, "auto")
    with journal_of(root) as journal, pytest.raises(UsageError, match="no proposal waiting"):
        people.dispatch(journal, request("apply"), OWNER)


def test_held_label() -> None:
    settlement = SettlementRecord(status="held", candidate={"accepted": ["a", "b"], "refused": []})
    out = summary(settlement)
    assert out is not None
    assert (out["label"], out["complete"]) == ("held, 2 paths not applied", False)
