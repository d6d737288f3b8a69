"""Replay identity on a real journal: a diverging call fails closed, and `cairn show`
gets both sides of it."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

import pytest

from cairn import paths
from cairn.coordinator.base import Nondeterminism
from cairn.coordinator.core import Coordinator, holder_is_dead, lease_holder
from cairn.coordinator.lease import is_coordinator_cmdline
from cairn.daemon.views import show
from cairn.journal.readwrite import Journal
from cairn.journal.runs import Busy
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source

RUN = "flow_" + "ab" * 16
SOURCE = (resources.files("cairn.builtin") / "workflows" / "implement.py").read_text()


@pytest.fixture
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Coordinator:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    review = review_source(SOURCE, filename="implement.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=1001, owner_gid=1001, owner_name="alice",
        definition="builtin:implement", source=SOURCE, source_filename="implement.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"objective": "x"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=1001, on_pool_fs=False),
        profiles={"builtin:implementer": ProfileSpec(name="builtin:implementer",
                                                     kind="scripted")},
        cairn_version="0", created_at=time.time(),
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    c = Coordinator(RUN)
    c.token = c.journal.acquire_lease(RUN, c.lease.holder)
    return c


def call(prompt: str, line: int = 25) -> CallRequest:
    return CallRequest(scope="root", seq=1, kind="agent",
                       request={"descriptor": "implement", "prompt": prompt,
                                "title": "implement"},
                       location=f"implement.py:{line}:14")


def test_identical_call_is_answered_from_the_journal(coordinator: Coordinator) -> None:
    first = call("x")
    op = coordinator.journal.record_requested(first, run_id=RUN, op_id="root-1",
                                              predecessor=None, token=coordinator.token)
    coordinator.journal.update_op(RUN, "root-1", token=coordinator.token, state="committed",
                                  result={"output": {"summary": "s"}, "handoff": "",
                                          "op_id": "root-1"})
    value, op_id, fresh = coordinator.replayer.answer(call("x"), None)
    assert (value["output"], op_id, fresh) == ({"summary": "s"}, op.op_id, False)


def test_diverging_request_fails_closed_with_both_sides(coordinator: Coordinator) -> None:
    coordinator.journal.record_requested(call("old objective"), run_id=RUN, op_id="root-1",
                                         predecessor=None, token=coordinator.token)
    with pytest.raises(Nondeterminism, match="request_hash"):
        coordinator.replayer.answer(call("new objective"), None)
    view = show(coordinator.journal, RUN, 1001)
    divergence = view["divergence"]
    assert divergence["op_id"] == "root-1" and divergence["fields"] == ["request_hash"]
    assert divergence["journal"]["request"]["prompt"] == "old objective"
    assert divergence["replay"]["request"]["prompt"] == "new objective"


def test_call_outside_the_manifest_is_refused(coordinator: Coordinator) -> None:
    with pytest.raises(Nondeterminism, match="not in the reviewed manifest"):
        coordinator.replayer.answer(call("x", line=3), None)


def test_dead_holder_is_reclaimed_live_one_is_busy(coordinator: Coordinator) -> None:
    journal = coordinator.journal
    host_boot = lease_holder().rsplit(":", 1)[0]
    assert holder_is_dead(RUN, f"{host_boot}:999999999")  # no such process
    assert holder_is_dead(RUN, f"{host_boot.split(':')[0]}:another-boot:1")
    assert not holder_is_dead(RUN, "other-host:boot:1")  # not ours to judge
    installed = b"/usr/bin/python3\0-I\0/usr/libexec/cairn/cairn-coordinator\0" + RUN.encode()
    assert is_coordinator_cmdline(installed + b"\0", RUN)
    assert is_coordinator_cmdline(b"python3\0-m\0cairn.coordinator\0" + RUN.encode(), RUN)
    assert not is_coordinator_cmdline(installed, "flow_" + "f" * 32)  # another run's
    assert not is_coordinator_cmdline(b"cat\0" + RUN.encode(), RUN)
    journal.db.execute("UPDATE runs SET lease_holder=? WHERE run_id=?",
                       (f"{host_boot}:999999999", RUN))
    token = journal.acquire_lease(RUN, "me", holder_is_dead=lambda h: holder_is_dead(RUN, h))
    assert token == coordinator.token + 1
    journal.db.execute("UPDATE runs SET lease_holder='other-host:b:1' WHERE run_id=?", (RUN,))
    with pytest.raises(Busy):
        journal.acquire_lease(RUN, "me2", holder_is_dead=lambda h: holder_is_dead(RUN, h))


def commit(coordinator: Coordinator, prompt: str) -> None:
    """Commit root-1 as the real worker asks for it (``flow`` at line 25, column 20)."""
    asked = call(prompt).model_copy(update={"location": "implement.py:25:20"})
    coordinator.journal.record_requested(asked, run_id=RUN, op_id="root-1",
                                         predecessor=None, token=coordinator.token)
    coordinator.journal.update_op(RUN, "root-1", token=coordinator.token, state="committed",
                                  result={"output": {"summary": "s"}, "handoff": "",
                                          "op_id": "root-1"})


def test_a_recovered_run_replays_committed_calls_with_the_real_worker(
    coordinator: Coordinator,
) -> None:
    commit(coordinator, "x")
    recovered = Coordinator(RUN)  # started after the commit, as after a crash
    assert set(recovered.replayer.committed) == {("root", 1)}
    assert recovered.replayer.replay_once() == {"summary": "s"}


def test_a_recovered_run_whose_source_diverges_fails_closed(coordinator: Coordinator) -> None:
    commit(coordinator, "an objective the run was not launched with")
    recovered = Coordinator(RUN)
    with pytest.raises(Nondeterminism, match="request_hash"):
        recovered.replayer.replay_once()
    assert show(coordinator.journal, RUN, 1001)["divergence"]["fields"] == ["request_hash"]


def test_the_prestarted_control_worker_is_the_one_the_replay_uses(
    coordinator: Coordinator,
) -> None:
    commit(coordinator, "x")
    recovered = Coordinator(RUN)
    recovered.replayer.prestart_control_worker()
    prestarted = recovered.replayer.prestarted
    assert prestarted is not None and prestarted.poll() is None  # waiting for its start
    assert recovered.replayer.take_control_worker() is prestarted
    assert recovered.replayer.prestarted is None
    prestarted.kill()
    prestarted.wait()
    recovered.replayer.prestart_control_worker()
    assert recovered.replayer.replay_once() == {"summary": "s"}
    assert recovered.replayer.prestarted is None


def test_a_prestarted_worker_that_died_is_replaced(coordinator: Coordinator) -> None:
    coordinator.replayer.prestart_control_worker()
    dead = coordinator.replayer.prestarted
    assert dead is not None
    dead.kill()
    dead.wait()
    fresh = coordinator.replayer.take_control_worker()
    try:
        assert fresh is not dead and fresh.poll() is None
    finally:
        fresh.kill()
        fresh.wait()


def test_a_run_that_ends_before_its_replay_leaves_no_worker(coordinator: Coordinator) -> None:
    coordinator.replayer.prestart_control_worker()
    worker = coordinator.replayer.prestarted
    assert worker is not None
    coordinator.replayer.discard_prestarted_worker()
    assert worker.returncode is not None and coordinator.replayer.prestarted is None
    coordinator.replayer.discard_prestarted_worker()  # nothing left: a no-op
