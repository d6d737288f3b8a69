"""Questions, approvals and control requests on a real journal, driven by a real
coordinator replaying a real control worker (up to the point where the broker would
be needed), and decided through cairnd's functions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, overload

import pytest

from cairn.coordinator import interactions
from cairn.coordinator.core import Coordinator
from cairn.daemon import interactions as people
from cairn.errors import CairnError, ValidationFailed
from cairn.journal.people import AlreadyAnswered, StaleRequest
from cairn.journal.readwrite import Journal
from cairn.journal.runs import RunEnded
from cairn.policy import PolicyError, RequestExpired
from cairn.protocol.daemon import (
    AnswerRequest,
    ApproveRequest,
    DaemonRequest,
    RejectRequest,
    WatchRequest,
    daemon_request,
)
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source

SOURCE = '''
from cairn.workflow import Field, Model, agent, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

class Choice(Model):
    colour: str = Field(min_length=1)

class Report(Model):
    summary: str = Field(min_length=1)

fetch = agent(profile="test:fetch", access="write", network="host", output=Report)

@workflow(description="ask, then fetch", input=Goal, output=Report)
async def run(flow, args: Goal) -> Report:
    choice = await flow.ask(f"Which colour for {args.goal}?", schema=Choice)
    result = await flow.agent(fetch, prompt=f"paint {choice.colour}")
    return result.output
'''
OWNER = 1001
RUN = "flow_" + "0" * 31 + "a"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "var/lib/cairn/journal").mkdir(parents=True)
    (tmp_path / "etc/cairn").mkdir(parents=True)
    return tmp_path


def set_policy(root: Path, text: str) -> None:
    (root / "etc/cairn/policy.toml").write_text(text)


def journal_of(root: Path, clock: Callable[[], float] = time.time) -> Journal:
    return Journal(root / "var/lib/cairn/journal/journal.db", create=True, clock=clock)


def create_run(root: Path, run_id: str = RUN, source: str = SOURCE) -> None:
    review = review_source(source, filename="wf.py")
    desc = LaunchDescription(
        run_id=run_id, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=source, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "the shed"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={"test:fetch": ProfileSpec(name="test:fetch", kind="scripted")},
        cairn_version="0", created_at=time.time(),
    )
    with journal_of(root) as journal:
        journal.create_run(desc, intents=[])


def incarnation(run_id: str = RUN) -> Coordinator:
    """A coordinator holding the lease with the run ``running``, as ``run()`` leaves it
    before it replays."""
    coord = Coordinator(run_id)
    coord.token = coord.journal.acquire_lease(run_id, coord.lease.holder, ttl=60)
    coord.journal.set_run_state(run_id, "running", token=coord.token)
    return coord


def replay_until_suspended(coord: Coordinator) -> interactions.RunSuspended:
    with pytest.raises(interactions.RunSuspended) as caught:
        coord.replay()
    return caught.value


# The op names the request's model (the union's discriminator).
@overload
def request(op: Literal["answer"], **fields: object) -> AnswerRequest: ...
@overload
def request(op: Literal["approve"], **fields: object) -> ApproveRequest: ...
@overload
def request(op: Literal["reject"], **fields: object) -> RejectRequest: ...
@overload
def request(op: Literal["watch"], **fields: object) -> WatchRequest: ...
@overload
def request(op: str, **fields: object) -> DaemonRequest: ...
def request(op: str, **fields: object) -> DaemonRequest:
    return daemon_request(op, run_id=RUN, **fields)


def ask_and_exit(root: Path) -> str:
    """First incarnation: the workflow asks; the coordinator records the question and
    exits with the run waiting. Returns the challenge."""
    create_run(root)
    coord = incarnation()
    suspended = replay_until_suspended(coord)
    assert suspended.state == "waiting"
    assert interactions.suspend(coord.context, suspended) == 0
    coord.journal.release_lease(RUN, coord.token)
    with journal_of(root) as journal:
        assert journal.get_run(RUN).state == "waiting"
        (question,) = journal.questions(RUN)
        assert question.state == "waiting" and question.question == "Which colour for the shed?"
        assert question.schema_name == "Choice"
        assert journal.get_op_by_id(RUN, "root-1").state == "waiting"
        return question.challenge


def test_question_answer_binds_actor_and_challenge_and_resumes_there(root: Path) -> None:
    challenge = ask_and_exit(root)
    set_policy(root, '[capabilities]\n"network:host" = "require_approval"\n')
    with journal_of(root) as journal:
        # a paused run records the answer without waking anything
        assert journal.request_control(RUN, "pause", actor_uid=OWNER) == ("paused", False)
        with pytest.raises(StaleRequest, match="the current one is " + challenge):
            people.answer(journal, RUN, request("answer", challenge="sha256:" + "0" * 64,
                                                 answer='{"colour": "red"}'), OWNER)
        with pytest.raises(ValidationFailed, match="does not match Choice: colour"):
            people.answer(journal, RUN, request("answer", challenge=challenge,
                                                 answer='{"colour": ""}'), OWNER)
        with pytest.raises(ValidationFailed, match="must be JSON"):
            people.answer(journal, RUN, request("answer", challenge=challenge,
                                                 answer="red"), OWNER)
        done = people.answer(journal, RUN, request("answer", challenge=challenge,
                                                    answer='{"colour": "red"}'), OWNER)
        assert done == {"run_id": RUN, "op_id": "root-1", "outcome": "answered",
                        "woken": False}
        again = people.answer(journal, RUN, request("answer", challenge=challenge,
                                                     answer=' {"colour":"red"} '), OWNER)
        assert again["outcome"] == "duplicate"
        with pytest.raises(AlreadyAnswered, match="already answered"):
            people.answer(journal, RUN, request("answer", challenge=challenge,
                                                 answer='{"colour": "blue"}'), OWNER)
        (question,) = journal.questions(RUN)
        assert question.answer == {"colour": "red"} and question.actor_uid == OWNER

    # the next incarnation commits the answer and continues exactly there: the agent's
    # prompt carries the answer, and policy holds the dispatch for an approval
    coord = incarnation()
    suspended = replay_until_suspended(coord)
    assert suspended.state == "waiting" and "approval" in suspended.message
    ask_op = coord.journal.get_op_by_id(RUN, "root-1")
    assert ask_op.state == "committed" and ask_op.result is not None
    assert ask_op.result["answer"] == {"colour": "red"}
    (approval,) = coord.journal.approvals(RUN)
    assert approval.request_id == "root-2-approval" and approval.state == "waiting"
    assert approval.prepared["prompt"] == "paint red"
    assert approval.evaluation["capabilities"]["network:host"] == "require_approval"
    assert coord.journal.get_op_by_id(RUN, "root-2").state == "requested"
    # the stale challenge of the answered question is refused as such
    with journal_of(root) as journal, pytest.raises(AlreadyAnswered):
        people.answer(journal, RUN, request("answer", challenge=challenge,
                                             answer='{"colour": "green"}'), OWNER)

    # two concurrent approvals while the coordinator is still on its way out: one wins
    outcomes: list[str] = []

    def approve() -> None:
        with journal_of(root) as journal:
            try:
                out = people.decide(journal, RUN, request(
                    "approve", request_id=approval.request_id,
                    fingerprint=approval.fingerprint), OWNER + 1)
                outcomes.append(out["outcome"])
            except CairnError as exc:
                outcomes.append(exc.code)

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["already-answered", "approved"]
    # decided meanwhile: the coordinator does not leave the run waiting, it restarts
    assert interactions.suspend(coord.context, suspended) == interactions.EXIT_RESTART
    assert coord.journal.get_run(RUN).state == "running"
    decided = coord.journal.approval(RUN, approval.request_id)
    assert decided is not None and decided.actor_uid == OWNER + 1


def wait_for_approval(root: Path, policy: str) -> tuple[Coordinator, str, str]:
    """A run whose agent waits for approval, with its question answered."""
    challenge = ask_and_exit(root)
    set_policy(root, policy)
    with journal_of(root) as journal:
        journal.answer_question(RUN, challenge=challenge, answer={"colour": "red"},
                                actor_uid=OWNER)
    coord = incarnation()
    suspended = replay_until_suspended(coord)
    assert interactions.suspend(coord.context, suspended) == 0
    coord.journal.release_lease(RUN, coord.token)
    (approval,) = coord.journal.approvals(RUN)
    return coord, approval.request_id, approval.fingerprint


def test_approval_refused_when_policy_now_denies_or_fingerprint_is_stale(root: Path) -> None:
    coord, req, print_ = wait_for_approval(root, 'default = "require_approval"\n')
    with journal_of(root) as journal:
        with pytest.raises(StaleRequest, match="fingerprint"):
            people.decide(journal, RUN, request("approve", request_id=req,
                                                fingerprint="sha256:" + "1" * 64), OWNER)
        set_policy(root, '[capabilities]\n"network:host" = "deny"\n')
        with pytest.raises(people.PolicyDenies, match="now denies network:host"):
            people.decide(journal, RUN, request("approve", request_id=req,
                                                fingerprint=print_), OWNER)
        assert journal.approval(RUN, req).state == "waiting"  # type: ignore[union-attr]
        journal.request_control(RUN, "pause", actor_uid=OWNER)  # keep the broker out of it
        out = people.decide(journal, RUN, request("reject", request_id=req,
                                                  reason="not today"), OWNER)
        assert out["outcome"] == "rejected"
    # rejected: the next incarnation records the operation as not started; the workflow
    # sees OperationFailed and, not handling it, fails
    set_policy(root, 'default = "require_approval"\n')
    coord = incarnation()
    with pytest.raises(CairnError, match="OperationFailed: .*rejected by uid 1001: not today"):
        coord.replay()
    assert coord.journal.get_op_by_id(RUN, "root-2").state == "not-started"


def test_an_invalid_policy_refuses_approvals_and_dispatch_naming_the_field(root: Path) -> None:
    coord, req, print_ = wait_for_approval(root, 'default = "require_approval"\n')
    set_policy(root, 'default = "allw"\n')
    named = r"policy.toml: default: Input should be 'allow', 'deny' or 'require_approval'"
    with journal_of(root) as journal:
        with pytest.raises(PolicyError, match=named) as caught:
            people.decide(journal, RUN, request("approve", request_id=req,
                                                fingerprint=print_), OWNER)
        assert caught.value.code == "policy"
        assert journal.approval(RUN, req).state == "waiting"  # type: ignore[union-attr]
    coord = incarnation()
    with pytest.raises(PolicyError, match=named):  # the coordinator's run then fails with it
        coord.replay()


def test_approval_after_deadline_is_refused_and_recorded_expired(root: Path) -> None:
    coord, req, print_ = wait_for_approval(
        root, 'approval_deadline_sec = 1\n[capabilities]\nwrite = "require_approval"\n')
    later = time.time() + 1.2  # past the deadline, without waiting for it
    with journal_of(root, clock=lambda: later) as journal:
        journal.request_control(RUN, "pause", actor_uid=OWNER)  # keep the broker out of it
        with pytest.raises(RequestExpired, match="recorded as expired"):
            people.decide(journal, RUN, request("approve", request_id=req,
                                                fingerprint=print_), OWNER)
        expired = journal.approval(RUN, req)
        assert expired is not None and expired.state == "expired"
        # a second try, or one after cairnd's timer expired it, hears the same
        with pytest.raises(RequestExpired, match="recorded as expired"):
            people.decide(journal, RUN, request("approve", request_id=req,
                                                fingerprint=print_), OWNER)
        with pytest.raises(RequestExpired, match="recorded as expired"):
            people.decide(journal, RUN, request("reject", request_id=req), OWNER)
        assert len([e for e in journal.events(RUN) if e.event == "approval-expired"]) == 1
    coord = incarnation()
    with pytest.raises(CairnError, match="OperationFailed: .*expired \\(its deadline passed\\)"):
        coord.replay()


APPROVING = '''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

class Report(Model):
    summary: str = Field(min_length=1)

@workflow(description="approve, then ask", input=Goal, output=Report)
async def run(flow, args: Goal) -> Report:
    decision = await flow.approve(f"Ship {args.goal}?")
    await flow.ask(f"approved: {decision.approved}")
    return Report(summary="done")
'''


def test_a_flow_approve_is_approved_by_its_fingerprint_and_the_workflow_gets_it(
    root: Path,
) -> None:
    """A ``flow.approve`` prepares no agent: approving it checks its fingerprint only (it
    was once refused as an internal error, re-prepared as if it were an agent's)."""
    create_run(root, source=APPROVING)
    coord = incarnation()
    assert interactions.suspend(coord.context, replay_until_suspended(coord)) == 0
    coord.journal.release_lease(RUN, coord.token)
    (approval,) = coord.journal.approvals(RUN)
    assert approval.prepared["subject"] == "Ship the shed?"
    with journal_of(root) as journal:
        with pytest.raises(StaleRequest, match="fingerprint"):
            people.decide(journal, RUN, request("approve", request_id=approval.request_id,
                                                fingerprint="sha256:" + "1" * 64), OWNER)
        out = people.decide(journal, RUN, request(
            "approve", request_id=approval.request_id, fingerprint=approval.fingerprint),
            OWNER)
        assert out["outcome"] == "approved"
    coord = incarnation()
    replay_until_suspended(coord)
    (question,) = coord.journal.questions(RUN)
    assert question.question == "approved: True"


def test_control_requests_at_safe_points_and_on_waiting_runs(root: Path) -> None:
    create_run(root)
    coord = incarnation()
    with journal_of(root) as journal:
        assert journal.request_control(RUN, "pause", actor_uid=OWNER) == (
            "pause requested", False)
        assert journal.request_control(RUN, "pause", actor_uid=OWNER)[0] == (
            "pause already requested")
        # resume before the pause was honoured withdraws it
        assert journal.request_control(RUN, "resume", actor_uid=OWNER)[0] == "pause withdrawn"
        journal.request_control(RUN, "stop", actor_uid=OWNER)
    suspended = replay_until_suspended(coord)
    assert suspended.state == "stopped"
    assert interactions.suspend(coord.context, suspended) == 0
    assert coord.journal.get_run(RUN).state == "stopped"
    assert coord.journal.list_ops(RUN) == []  # stopped before the first operation
    assert coord.journal.pending_controls(RUN) == []
    with journal_of(root) as journal, pytest.raises(RunEnded, match="already stopped"):
        journal.request_control(RUN, "cancel", actor_uid=OWNER)


def test_cancel_of_a_waiting_run_withdraws_its_question(root: Path) -> None:
    challenge = ask_and_exit(root)
    with journal_of(root) as journal:
        assert journal.request_control(RUN, "cancel", actor_uid=OWNER) == ("cancelled", False)
        assert journal.get_run(RUN).state == "cancelled"
        assert journal.questions(RUN)[0].state == "cancelled"
        assert journal.get_op_by_id(RUN, "root-1").state == "not-started"
        with pytest.raises(RunEnded):
            journal.answer_question(RUN, challenge=challenge, answer={"colour": "red"},
                                    actor_uid=OWNER)
        events = [e.event for e in journal.events(RUN)]
        assert "cancel-requested" in events and "run-cancelled" in events


def test_inbox_lists_only_the_callers_waiting_items(root: Path) -> None:
    challenge = ask_and_exit(root)
    with journal_of(root) as journal:
        (item,) = people.inbox(journal, OWNER, all_users=False)
        assert item["kind"] == "question" and item["challenge"] == challenge
        assert item["json_schema"]["properties"]["colour"]["type"] == "string"
        assert people.inbox(journal, OWNER + 1, all_users=True) == []
        watched: dict[str, Any] = people.watch(journal, request("watch", cursor=0), OWNER)
        assert watched["state"] == "waiting" and not watched["finished"]
        assert watched["waiting"][0]["challenge"] == challenge
        later = people.watch(journal, request("watch", cursor=watched["cursor"]), OWNER)
        assert later["events"] == []
