"""`cairn upgrade`: a dry run replays the journal against new source in a real control
worker; only a clean one moves a blocked run, with the move in the journal."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from cairn import paths
from cairn.daemon import attest
from cairn.daemon import upgrade as upgrade_module
from cairn.daemon.upgrade import upgrade as upgrade_reply
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply
from cairn.protocol.control import (
    CallRequest,
    CallResult,
    JoinRequest,
    StartWorkflow,
    parse_worker_message,
)
from cairn.protocol.daemon import UpgradeRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source


def upgrade(journal: Journal, request: UpgradeRequest, uid: int) -> dict[str, Any]:
    """cairnd's answer (:class:`cairn.protocol.run_replies.UpgradeReply` as sent), read here
    as the plain JSON it is."""
    return upgrade_reply(journal, request, uid)

RUN = "flow_" + "cd" * 16
SOURCE = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()
OWNER = 1001


def coordinator_in_another_process(journal: Journal, run_id: str) -> str:
    """What the broker's start-coordinator does for the dry run: a coordinator process
    (here only its check, without systemd) serves the request cairnd recorded."""
    subprocess.run([sys.executable, "-m", "cairn.coordinator.upgradecheck", run_id],
                   check=True, env=os.environ.copy())
    return "start-coordinator.1"


@pytest.fixture(autouse=True)
def coordinator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upgrade_module, "restart_coordinator", coordinator_in_another_process)


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


LANES = RUN[:-4] + "1a2b"
LANES_SOURCE = """
from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Note(Model):
    text: str


build = agent(profile="p:build", access="write", output=Note)
merge = agent(profile="p:merge", output=Note)


@workflow(description="fork and join", input=Goal, output=Note)
async def run(flow: Any, args: Goal) -> Note:
    lanes = await flow.parallel({
        "a": lambda: flow.agent(build, prompt="a"),
        "b": lambda: flow.agent(build, prompt="b"),
    })
    done = ",".join(sorted(k for k, r in lanes.items() if r.ok))
    merged = await flow.agent(merge, prompt=done)
    result: Note = merged.output
    return result
"""


def record_lanes_run(j: Journal) -> None:
    """A blocked run whose fork finished (both lanes committed, the join recorded) and
    whose next call was never committed: recorded by driving a real control worker the
    way the coordinator does."""
    review = review_source(LANES_SOURCE, filename="wf.py")
    desc = LaunchDescription(
        run_id=LANES, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="./wf.py", source=LANES_SOURCE, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "g"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={p: ProfileSpec(name=p, kind="scripted") for p in ("p:build", "p:merge")},
        cairn_version="0", created_at=time.time(),
    )
    j.create_run(desc, intents=[])
    token = j.acquire_lease(LANES, "test")
    worker = subprocess.Popen([sys.executable, "-I", "-m", "cairn.workflow.runtime"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin and worker.stdout
    last: dict[str, str | None] = {}

    def send(line: str) -> None:
        assert worker.stdin
        worker.stdin.write(line + "\n")
        worker.stdin.flush()

    send(StartWorkflow(source=LANES_SOURCE, filename="wf.py", args={"goal": "g"})
         .model_dump_json())
    try:
        while True:
            message = parse_worker_message(worker.stdout.readline())
            if isinstance(message, JoinRequest):
                op_id = f"{message.scope}-{message.seq}"
                outcomes = {k: {**v, "scope": f"{op_id}-{k}", "boundary": v["last_op"],
                                "checkpoint": None} for k, v in message.outcomes.items()}
                result = {"joined": True, "outcomes": outcomes, "order": list(outcomes)}
                j.update_op(LANES, op_id, token=token, state="settled", result=result)
                j.update_op(LANES, op_id, token=token, state="committed")
                last[message.scope] = op_id
                send(CallResult(scope=message.scope, seq=message.seq, value=result)
                     .model_dump_json())
                continue
            assert isinstance(message, CallRequest)
            call = message
            if call.request.get("descriptor") == "merge":
                break  # the frontier: the run blocked before its merge committed
            op_id = f"{call.scope}-{call.seq}"
            j.record_requested(call, run_id=LANES, op_id=op_id,
                               predecessor=last.get(call.scope), token=token)
            last[call.scope] = op_id
            value: dict[str, Any]
            if call.kind == "parallel":
                j.update_op(LANES, op_id, token=token, state="started")
                value = {"forked": True, "lanes": call.request["lanes"]}
            else:
                value = {"output": {"text": call.request["prompt"]}, "handoff": "",
                         "op_id": op_id}
                j.update_op(LANES, op_id, token=token, state="committed", result=value)
            send(CallResult(scope=call.scope, seq=call.seq, value=value).model_dump_json())
    finally:
        worker.kill()
        worker.wait()
    j.release_lease(LANES, token)
    j.db.execute("UPDATE runs SET state='blocked' WHERE run_id=?", (LANES,))


def lanes_request(source: str) -> UpgradeRequest:
    return UpgradeRequest(run_id=LANES, source=source, dry_run=True)


def test_finished_fork_is_no_divergence(journal: Journal) -> None:
    record_lanes_run(journal)
    assert {o.op_id for o in journal.list_ops(LANES)} == {"root-1", "root-1-a-1", "root-1-b-1"}
    moved = "# moved\n" + LANES_SOURCE
    report = upgrade(journal, lanes_request(moved), OWNER)
    assert report["divergence"] is None
    # the fork and each lane's call were answered in their own scope and compared
    assert report["checked"] == report["committed"] == 3
    assert report["locations"]["root-1-b-1"].startswith("wf.py:")
    # the dry run changed nothing of the run
    assert journal.get_run(LANES).state == "blocked"
    assert journal.launch_description(LANES).source == LANES_SOURCE


def test_changed_call_inside_a_lane_diverges_there(journal: Journal) -> None:
    record_lanes_run(journal)
    changed = LANES_SOURCE.replace('prompt="b"', 'prompt="b!"')
    report = upgrade(journal, lanes_request(changed), OWNER)
    assert report["divergence"]["op_id"] == "root-1-b-1"
    assert report["divergence"]["field"] == "request"
    assert report["divergence"]["actual"]["prompt"] == "b!"


CAIRND_UPGRADE = """
import json, os, subprocess, sys
from cairn.daemon import upgrade as u
from cairn.journal.readwrite import Journal
from cairn import paths
from cairn.protocol.daemon import UpgradeRequest
pids = []
def start(journal, run_id):
    proc = subprocess.Popen([sys.executable, "-m", "cairn.coordinator.upgradecheck", run_id])
    pids.append(proc.pid)
    proc.wait()
    return "start-coordinator.1"
u.restart_coordinator = start
with Journal(paths.journal_path()) as j:
    report = u.upgrade(j, UpgradeRequest(run_id=sys.argv[1], source=sys.argv[2],
                                         dry_run=True), int(sys.argv[3]))
loaded = sorted(m for m in sys.modules if m.startswith(("cairn.workflow.runtime",
                                                         "cairn.coordinator")))
print(json.dumps({"report": report, "loaded": loaded, "pids": pids, "me": os.getpid()}))
"""


def test_cairnd_never_runs_the_workflow_for_an_upgrade(journal: Journal) -> None:
    """cairnd's side of a dry run, in a fresh interpreter: the source is re-executed in
    another process, and neither the workflow runtime nor the coordinator is ever
    imported into cairnd's."""
    record_lanes_run(journal)
    out = subprocess.run(
        [sys.executable, "-I", "-c", CAIRND_UPGRADE, LANES, "# moved\n" + LANES_SOURCE,
         str(OWNER)],
        check=True, capture_output=True, text=True, env=os.environ.copy(),
    )
    seen = json.loads(out.stdout)
    assert seen["report"]["divergence"] is None and seen["report"]["checked"] == 3
    assert seen["loaded"] == []
    assert len(seen["pids"]) == 1 and seen["pids"][0] != seen["me"]
