"""``flow.approve``: the review of its arguments, and on a real journal with a real
coordinator replaying a real control worker: a decision reaches the workflow as a value
with its reason, an expiry (cairnd's timer) is journalled once and replayed, a rejection
fails the run only when the workflow asked for it; a blocked run reaches ``cairn inbox``
and the notifier with the commands to run next."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cairn.coordinator import interactions
from cairn.coordinator.core import Coordinator
from cairn.daemon import interactions as people
from cairn.daemon.expiry import LOOK_AGAIN_SEC, expire_due, seconds_to_next
from cairn.daemon.notifications import notifications
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.operations.approve import MIN_EXPIRY_SEC
from cairn.protocol.daemon import NotificationsRequest, RejectRequest, daemon_request
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.workflow.review import review_source
from cairn.workflow.review.manifest import ReviewRejected

OWNER = 1001
RUN = "flow_" + "0" * 31 + "b"


def source(call: str) -> str:
    return f'''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

class Report(Model):
    summary: str = Field(min_length=1)

@workflow(description="approve, then report", input=Goal, output=Report)
async def run(flow, args: Goal) -> Report:
    decision = await {call}
    return Report(summary=f"{{decision.approved}} {{decision.outcome}}: {{decision.reason}}")
'''


def rejection(**fields: object) -> RejectRequest:
    made = daemon_request("reject", run_id=RUN, **fields)
    assert isinstance(made, RejectRequest)
    return made


EXPIRING = source('flow.approve(f"Ship {args.goal}?", expires_in=60, on_expiry="reject")')


# --- review ---------------------------------------------------------------------------


def test_review_lists_the_approval_and_its_capability() -> None:
    review = review_source(
        source('flow.approve("Ship?", expires_in=3600, on_expiry="approve", on_reject="fail")'),
        filename="wf.py",
    )
    (site,) = review.calls
    assert site.kind == "approve" and site.capabilities == ["human"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('flow.approve("Ship?", expires_in=30)', "expires_in= must be an int literal"),
        ('flow.approve("Ship?", expires_in=args.goal)', "expires_in= must be an int literal"),
        ('flow.approve("Ship?", expires_in=60.0)', "expires_in= must be an int literal"),
        ('flow.approve("Ship?", expires_in=True)', "expires_in= must be an int literal"),
        ('flow.approve("Ship?", on_expiry="maybe")', "on_expiry= must be one of"),
        ('flow.approve("Ship?", on_reject=args.goal)', "on_reject= must be one of"),
        ('flow.approve("Ship?", deadline=60)', "not deadline="),
        ("flow.approve(expires_in=60)", "takes one subject"),
    ],
)
def test_review_refuses_arguments_it_cannot_check(call: str, message: str) -> None:
    with pytest.raises(ReviewRejected) as caught:
        review_source(source(call), filename="wf.py")
    assert message in caught.value.message
    assert caught.value.violations[0].line == 12


# --- the decision on a real journal -------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "var/lib/cairn/journal").mkdir(parents=True)
    (tmp_path / "etc/cairn").mkdir(parents=True)
    return tmp_path


def journal_of(root: Path) -> Journal:
    return Journal(root / "var/lib/cairn/journal/journal.db", create=True)


def create_run(root: Path, text: str) -> None:
    review = review_source(text, filename="wf.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=text, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "1.2"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={}, cairn_version="0", created_at=time.time(),
    )
    with journal_of(root) as journal:
        journal.create_run(desc, intents=[])


def incarnation() -> Coordinator:
    coord = Coordinator(RUN)
    coord.token = coord.journal.acquire_lease(RUN, coord.lease.holder, ttl=60)
    coord.journal.set_run_state(RUN, "running", token=coord.token)
    return coord


def wait_and_exit(root: Path, text: str) -> None:
    """First incarnation: the workflow asks for approval; the run waits, nothing runs."""
    create_run(root, text)
    coord = incarnation()
    with pytest.raises(interactions.RunSuspended) as caught:
        coord.replay()
    assert interactions.suspend(coord.context, caught.value) == 0
    coord.journal.release_lease(RUN, coord.token)


def finish(coord: Coordinator) -> JSONObject:
    output = coord.replay()
    coord.journal.set_run_state(RUN, "succeeded", token=coord.token, output=output)
    coord.journal.release_lease(RUN, coord.token)
    return output


def test_an_expired_approval_is_journalled_once_and_replayed(root: Path) -> None:
    before = time.time()
    wait_and_exit(root, EXPIRING)
    with journal_of(root) as journal:
        (approval,) = journal.approvals(RUN)
        assert approval.state == "waiting" and approval.prepared["subject"] == "Ship 1.2?"
        assert before + 60 <= approval.deadline <= time.time() + 60
        assert journal.get_run(RUN).state == "waiting"
        assert journal.get_op_by_id(RUN, "root-1").state == "waiting"
        # cairnd's timer waits until the deadline, and expires nothing before it
        assert 0 < seconds_to_next(journal, time.time()) <= LOOK_AGAIN_SEC
        woken: list[str] = []

        def wake(_journal: Journal, run_id: str) -> bool:
            woken.append(run_id)
            return True

        assert expire_due(journal, approval.deadline - 1, wake) == []
        assert expire_due(journal, approval.deadline + 1, wake) == [RUN]
        assert woken == [RUN] and journal.get_run(RUN).state == "pending"
        expired = journal.approval(RUN, approval.request_id)
        assert expired is not None and expired.state == "expired" and expired.actor_uid is None
        # a person too late hears it expired, as if they had been the one to expire it;
        # the decision was journalled once
        with pytest.raises(CairnError, match="recorded as expired"):
            people.decide(journal, RUN, rejection(
                request_id=approval.request_id, reason="late"), OWNER)
        assert seconds_to_next(journal, time.time()) == LOOK_AGAIN_SEC

    coord = incarnation()
    output = coord.replay()
    coord.journal.release_lease(RUN, coord.token)
    assert str(output["summary"]).startswith("False expired: no decision before the deadline")
    with journal_of(root) as journal:
        op = journal.get_op_by_id(RUN, "root-1")
        assert op.state == "committed" and op.result is not None
        assert op.result["outcome"] == "expired" and op.result["approved"] is False
        events = [e.event for e in journal.events(RUN, after=0, limit=500)]
    assert events.count("approval-expired") == 1

    # replayed again: the same value from the journal, nothing asked or decided again
    coord = incarnation()
    assert coord.replay() == output
    assert len(coord.journal.approvals(RUN)) == 1
    assert coord.journal.get_op_by_id(RUN, "root-1").result == op.result


def test_a_rejection_reaches_the_workflow_with_its_reason(root: Path) -> None:
    wait_and_exit(root, EXPIRING)
    with journal_of(root) as journal:
        (approval,) = journal.approvals(RUN)
        out = people.decide(journal, RUN, rejection(
            request_id=approval.request_id, reason="not on a Friday"),
            OWNER)
        assert out["outcome"] == "rejected"
    assert finish(incarnation())["summary"] == "False rejected: not on a Friday"


def test_on_reject_fail_fails_the_run_and_replays_the_failure(root: Path) -> None:
    wait_and_exit(root, source('flow.approve("Ship?", on_reject="fail")'))
    with journal_of(root) as journal:
        (approval,) = journal.approvals(RUN)
        assert approval.deadline > time.time() + 86_000  # the policy's default deadline
        people.decide(journal, RUN, rejection(
            request_id=approval.request_id, reason="no"), OWNER)
    for _ in range(2):  # the second replay finds the refusal in the journal
        coord = incarnation()
        with pytest.raises(CairnError, match="OperationFailed: root-1 .*rejected: no"):
            coord.replay()
        coord.journal.release_lease(RUN, coord.token)
    with journal_of(root) as journal:
        assert journal.get_op_by_id(RUN, "root-1").state == "not-started"


def test_policy_denial_is_a_value_and_an_approval_with_on_expiry_approve(root: Path) -> None:
    (root / "etc/cairn/policy.toml").write_text('[capabilities]\nhuman = "deny"\n')
    create_run(root, source('flow.approve("Ship?")'))
    output = finish(incarnation())
    assert output["summary"] == (
        "False denied: host policy denies approvals from people (capability human)"
    )
    assert MIN_EXPIRY_SEC == 60


# --- blocked runs in the inbox and the notifications --------------------------------------


def test_a_blocked_run_is_in_the_inbox_and_notified_with_what_to_run(root: Path) -> None:
    create_run(root, EXPIRING)
    coord = incarnation()
    with journal_of(root) as journal:
        start = journal.last_event_cursor()
    coord.journal.set_run_state(RUN, "blocked", token=coord.token,
                                error="storage integrity: W root.1 is missing")
    coord.journal.release_lease(RUN, coord.token)
    with journal_of(root) as journal:
        (item,) = people.inbox(journal, OWNER, all_users=False)
        assert item["kind"] == "blocked" and item["run_id"] == RUN
        assert item["reason"] == "storage integrity: W root.1 is missing"
        assert item["commands"] == [f"cairn doctor {RUN}", f"cairn cancel {RUN}"]
        assert people.inbox(journal, OWNER + 1, all_users=False) == []
        batch = notifications(journal, NotificationsRequest(cursor=start), OWNER)
    (event,) = batch["events"]
    assert event["event"] == "blocked" and event["state"] == "blocked"
    assert event["waiting"][0]["command"] == f"cairn doctor {RUN}"
    assert f"next: cairn doctor {RUN}" in event["summary"]
