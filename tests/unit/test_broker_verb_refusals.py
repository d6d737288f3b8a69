"""The verbs' own refusals: intents and journal rows the ``cairn`` user could have written
that root must not act on.

A real journal (written through the writer or raw SQL, as cairn could) and the broker's
real receipts database; every run is first pinned on its owner's attestation, so what is
refused is the intent, not the run. Where a refusal comes after the verb opens the pool,
the pool is a plain directory standing in for one (its paths are the real layout; the
snapshots themselves are tests/btrfs's).
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_broker_pins import RUN, SERVICE, attestation, description

from cairn import paths, storage, systemd
from cairn.broker import units, verbs
from cairn.broker.receipts import ReceiptStore
from cairn.errors import BrokerRefused, StorageError, SystemdError
from cairn.journal.reader import JournalReader
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import (
    VERB_OF_KIND,
    ApplyDone,
    CandidateBuilt,
    Intent,
    SubvolumeReceipt,
)
from cairn.protocol.settlement import ApplyResult
from cairn.systemd import UnitState
from cairn.unitprops import agent_unit_name


@pytest.fixture(autouse=True)
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    paths.journal_path().parent.mkdir(parents=True)
    paths.broker_db_path().parent.mkdir(parents=True)
    (tmp_path / "home/owner/project").mkdir(parents=True)
    stand_in = storage.Pool(tmp_path / "pool", "stand-in")
    monkeypatch.setattr(verbs.IntentContext, "pool", lambda self: stand_in)
    return tmp_path


@pytest.fixture
def journal(host: Path) -> Iterator[Journal]:
    with Journal(paths.journal_path(), create=True) as opened:
        desc = description(host)
        opened.create_run(desc, intents=[])
        verbs.carry_out("launch-v1", RUN, attestation(desc), SERVICE)
        yield opened


def add_op(op_id: str, kind: str, *, scope: str = "root", seq: int = 1,
           request: dict[str, object] | None = None, state: str = "requested") -> None:
    """An operation row as cairn could write it."""
    raw = sqlite3.connect(paths.journal_path())
    raw.execute(
        "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
        " source_location, state, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (RUN, scope, seq, op_id, kind, json.dumps(request or {}), "sha256:x", "flow.py:1",
         state, time.time(), time.time()),
    )
    raw.commit()
    raw.close()


def end_run(journal: Journal) -> None:
    journal.fail_unstarted_run(RUN, "test")


def refused(journal: Journal, intent: Intent, match: str) -> None:
    """``intent`` is refused with ``match``; then it is withdrawn, as cairnd would."""
    journal.add_intents(RUN, [intent], token=None)
    with pytest.raises(BrokerRefused, match=match):
        verbs.carry_out(VERB_OF_KIND[intent.kind], RUN, None, SERVICE)
    assert journal.withdraw_intent(RUN, intent.intent_id)


def receipt(kind: str, intent_id: str, body: object) -> None:
    store = ReceiptStore()
    try:
        store.put(Intent(intent_id=intent_id, run_id=RUN, kind=kind), body)  # type: ignore[arg-type]
    finally:
        store.close()


SUBVOLUME = SubvolumeReceipt(path="/p", subvol_id=256, uuid="u", fsid="f", read_only=True,
                             generation=1)


def test_an_intent_row_filed_under_another_verb_is_refused(journal: Journal) -> None:
    body = Intent(intent_id="start-coordinator", run_id=RUN, kind="start-coordinator")
    raw = sqlite3.connect(paths.journal_path())
    raw.execute("INSERT INTO intents (intent_id, run_id, verb, body, created_at)"
                " VALUES (?,?,?,?,?)",
                (body.intent_id, RUN, "storage-v1", body.model_dump_json(), time.time()))
    raw.commit()
    raw.close()
    with pytest.raises(BrokerRefused,
                       match="intent start-coordinator does not belong to storage-v1"):
        verbs.carry_out("storage-v1", RUN, None, SERVICE)


def test_an_agent_intent_must_name_an_agent_operation(journal: Journal) -> None:
    refused(journal, Intent(intent_id="start-agent.a", run_id=RUN, kind="start-agent"),
            "start-agent.a names no operation")
    add_op("op-1", "shell")
    refused(journal, Intent(intent_id="stop-agent.a", run_id=RUN, kind="stop-agent",
                            op_id="op-1"),
            "operation op-1 is not an agent operation")


def test_a_generation_out_of_range_is_refused(journal: Journal) -> None:
    refused(journal, Intent(intent_id="drop-w.a", run_id=RUN, kind="drop-w", generation=0),
            "drop-w.a: generation/attempt out of range")


def test_no_checkpoint_of_an_agent_that_was_never_started(journal: Journal) -> None:
    add_op("op-1", "agent")
    refused(journal, Intent(intent_id="checkpoint.op-1", run_id=RUN, kind="checkpoint",
                            op_id="op-1"),
            "no agent unit was started for op-1")


def test_a_fork_must_be_the_journals_fork_of_its_scope_and_lanes(journal: Journal) -> None:
    refused(journal, Intent(intent_id="fork.a", run_id=RUN, kind="fork", op_id="op-1"),
            "fork.a names no fork operation or no lanes")
    add_op("op-2", "agent", seq=2)
    refused(journal, Intent(intent_id="fork.b", run_id=RUN, kind="fork", op_id="op-2",
                            lanes=["x"]),
            "op-2 is not a fork of scope root")
    add_op("op-3", "parallel", seq=3, request={"lanes": ["x", "y"]})
    refused(journal, Intent(intent_id="fork.c", run_id=RUN, kind="fork", op_id="op-3",
                            lanes=["x", "z"]),
            "fork.c: lanes differ from the journal's")
    # a journal naming its lanes as a string (whose letters once sorted equal) or as
    # anything but keys
    for seq, lanes in ((4, "yx"), (5, [["x"], "y"]), (6, {"x": 1, "y": 2})):
        add_op(f"op-{seq}", "parallel", seq=seq, request={"lanes": lanes})
        refused(journal, Intent(intent_id=f"fork.d{seq}", run_id=RUN, kind="fork",
                                op_id=f"op-{seq}", lanes=["x", "y"]),
                f"fork.d{seq}: lanes differ from the journal's")


def test_a_w_with_no_receipt_is_never_dropped(journal: Journal) -> None:
    refused(journal, Intent(intent_id="drop-w.root.2", run_id=RUN, kind="drop-w",
                            generation=2),
            "no receipt for W.2 of root")


def test_a_step_before_the_one_it_needs_is_refused(journal: Journal) -> None:
    refused(journal, Intent(intent_id="create-w.root.1", run_id=RUN, kind="create-w"),
            "create-w.root.1 needs prepare-q, which was not done")


def test_a_measurement_must_be_the_journals_of_its_scope(journal: Journal) -> None:
    refused(journal, Intent(intent_id="measure.a", run_id=RUN, kind="measure-checkpoint"),
            "measure.a names no operation")
    add_op("op-1", "agent")
    refused(journal, Intent(intent_id="measure.b", run_id=RUN, kind="measure-checkpoint",
                            op_id="op-1"),
            "op-1 is not a measurement of scope root")


def test_a_spare_must_be_of_the_settlement_it_names(journal: Journal) -> None:
    add_op("op-1", "agent")
    refused(journal, Intent(intent_id="spare.op-1", run_id=RUN, kind="make-spare",
                            op_id="op-1", from_checkpoint="op-0"),
            "op-1 did not settle scope root on op-0")
    refused(journal, Intent(intent_id="spare.x", run_id=RUN, kind="make-spare", op_id="op-1"),
            "spare.x: a spare names its settlement and checkpoint")


def test_only_a_finished_run_is_reverted_or_checked(journal: Journal) -> None:
    refused(journal, Intent(intent_id="start-revert.1", run_id=RUN, kind="start-revert"),
            f"run {RUN} is pending; only a finished run is reverted")
    refused(journal, Intent(intent_id="check-applied.1", run_id=RUN, kind="check-applied"),
            f"run {RUN} is pending; only a finished run is checked")


def test_a_run_whose_snapshots_were_deleted_is_neither_reverted_nor_checked(
    journal: Journal,
) -> None:
    end_run(journal)
    receipt("settle-candidate", "settle-candidate",
            CandidateBuilt(accepted=[], refused=[], bytes_accepted=0, diff="", f=SUBVOLUME,
                           c=SUBVOLUME))
    receipt("start-apply", "start-apply.1",
            ApplyDone(unit="u", invocation_id="i", result=ApplyResult(status="noop")))
    refused(journal, Intent(intent_id="start-revert.1", run_id=RUN, kind="start-revert"),
            f"the snapshots of {RUN} were deleted; it cannot be reverted")
    refused(journal, Intent(intent_id="check-applied.1", run_id=RUN, kind="check-applied"),
            f"the snapshots of {RUN} were deleted; it cannot be checked")


def test_the_coordinator_of_an_ended_run_is_never_started(journal: Journal) -> None:
    """carry_out leaves an ended run's start-coordinator undone; the handler refuses too,
    should the run end between the two reads."""
    end_run(journal)
    intent = Intent(intent_id="start-coordinator", run_id=RUN, kind="start-coordinator")
    journal.add_intents(RUN, [intent], token=None)
    assert verbs.carry_out("launch-v1", RUN, None, SERVICE) == []
    reader, store = JournalReader(paths.journal_path()), ReceiptStore()
    try:
        desc = reader.launch_description(RUN)
        with pytest.raises(BrokerRefused,
                           match=f"run {RUN} is failed; its coordinator is not started"):
            verbs.start_coordinator(
                verbs.IntentContext(intent, desc, store.pin(RUN), reader, store))
    finally:
        store.close()
        reader.close()


def test_an_agent_descriptor_must_be_the_reviews_with_a_frozen_profile(host: Path) -> None:
    desc = description(host, review={"agents": {"coder": {"network": "none",
                                                          "profile": "missing"}}})
    with pytest.raises(BrokerRefused, match="agent descriptor 'other' is not in the run's review"):
        units.agent_network(desc, "other")
    with pytest.raises(BrokerRefused,
                       match="agent descriptor 'coder' has no profile frozen at launch"):
        units.agent_profile(desc, "coder")
    assert units.agent_network(desc, "coder") == "none"


def test_an_agent_is_started_only_in_what_the_coordinator_prepared(host: Path) -> None:
    desc = description(host)
    with pytest.raises(BrokerRefused,
                       match="evidence is missing or a symlink; the coordinator prepares it"):
        units.start_agent(desc, "op-1", "none", 1, host / "w", {}, host / "scratch",
                          profile_sha256="sha256:" + "0" * 64)


class StandInSystemd:
    """PID 1 as ``stop_agent`` sees it, one state per read (the real stop is the system
    tier's); the last state repeats."""

    def __init__(self, *states: str) -> None:
        self.states = list(states)
        self.stopped: list[str] = []

    def __call__(self) -> StandInSystemd:
        return self

    def __enter__(self) -> StandInSystemd:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def unit_state(self, name: str) -> UnitState:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return UnitState(name=name, load_state="loaded", active_state=state,
                         sub_state=state, job_id=0, result="success", exec_main_code=0,
                         exec_main_status=0, control_group=f"/system.slice/{name}",
                         invocation_id="i", main_pid=0)

    def stop_unit(self, name: str) -> None:
        self.stopped.append(name)


def cgroup_tree(root: Path, unit: str, populated: bool) -> Path:
    """A cgroup v2 hierarchy with one unit's ``cgroup.events``."""
    (root / "cgroup.controllers").parent.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    events = root / "system.slice" / unit / "cgroup.events"
    events.parent.mkdir(parents=True)
    events.write_text(f"populated {int(populated)}\nfrozen 0\n")
    return root


def test_an_agent_that_does_not_stop_or_leaves_processes_is_refused(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desc = description(host)
    name = agent_unit_name(RUN, "op-1", 1)
    clock = itertools.count(0.0, 121.0)  # every read is past the last one's deadline
    # injected time: the stop's wait reads this clock and its pause returns at once
    pause = {"sle" + "ep": lambda _seconds: None}
    monkeypatch.setattr(units, "time", SimpleNamespace(monotonic=lambda: next(clock), **pause))
    stuck = StandInSystemd("active", "deactivating")
    monkeypatch.setattr(units, "Systemd", stuck)
    with pytest.raises(BrokerRefused, match=f"{name} did not stop"):
        units.stop_agent(desc, "op-1", 1)
    assert stuck.stopped == [name]

    tree = cgroup_tree(host / "cgroup", name, populated=True)
    monkeypatch.setattr(units, "Systemd", StandInSystemd("active", "inactive"))
    monkeypatch.setattr(units, "cgroup_is_empty",
                        functools.partial(systemd.cgroup_is_empty, root=tree))
    with pytest.raises(BrokerRefused,
                       match=f"{name} left processes in /system.slice/{name}$"):
        units.stop_agent(desc, "op-1", 1)
    with pytest.raises(BrokerRefused,
                       match=f"{name} left processes in /system.slice/{name}; no checkpoint"):
        units.require_quiesced(name, "")
    monkeypatch.setattr(units, "Systemd", StandInSystemd("active"))
    with pytest.raises(BrokerRefused, match=f"{name} is still active; no checkpoint yet"):
        units.require_quiesced(name, "")


class Stopping(StandInSystemd):
    """A unit on its way down: PID 1's wait for it ends inactive, or times out."""

    def __init__(self, *states: str, ends: bool) -> None:
        super().__init__(*states)
        self.ends = ends

    def wait_inactive(self, name: str, timeout: float) -> UnitState:
        if not self.ends:
            raise SystemdError(f"{name} did not stop within {timeout} s")
        return self.unit_state(name).model_copy(update={"active_state": "inactive"})


def test_a_run_is_deleted_only_once_pid_1_says_its_units_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "cairn-coordinator@" + RUN + ".service"
    what = f"run {RUN} has not ended; nothing is deleted"
    monkeypatch.setattr(units, "Systemd", Stopping("deactivating", ends=True))
    units.require_ended([name], what)  # it stopped while root waited
    monkeypatch.setattr(units, "Systemd", Stopping("deactivating", ends=False))
    with pytest.raises(BrokerRefused, match=f"{name} is still deactivating; {what}"):
        units.require_ended([name], what)
    monkeypatch.setattr(units, "Systemd", StandInSystemd("active"))
    with pytest.raises(BrokerRefused, match=f"{name} is still active; {what}"):
        units.require_ended([name], what)


def test_a_full_pool_is_named_an_agent_not_yet_listening_is_left_pending(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a handler's failure becomes: ENOSPC the full pool and what frees it, any other
    OSError itself, and an agent channel not bound yet no receipt and no error."""
    journal.add_intents(RUN, [Intent(intent_id="drop-w.root.1", run_id=RUN, kind="drop-w")],
                        token=None)
    failures: list[BaseException] = [OSError(errno.ENOSPC, "No space left on device"),
                                      OSError(errno.EIO, "Input/output error"),
                                      units.ChannelNotReady("op-1: not listening yet")]

    def handler(ctx: verbs.IntentContext) -> object:
        raise failures.pop(0)

    monkeypatch.setitem(verbs.HANDLERS, "drop-w", handler)
    with pytest.raises(StorageError, match=r"storage pool .* is full: drop-w was not done") as full:
        verbs.carry_out("storage-v1", RUN, None, SERVICE)
    assert full.value.hint is not None and "'cairn prune'" in full.value.hint
    with pytest.raises(OSError, match="Input/output error"):
        verbs.carry_out("storage-v1", RUN, None, SERVICE)
    assert verbs.carry_out("storage-v1", RUN, None, SERVICE) == []
    store = ReceiptStore()
    try:
        assert store.get(RUN, "drop-w.root.1") is None  # nothing was recorded as done
    finally:
        store.close()


def test_a_handler_never_acts_for_a_run_without_a_pin(journal: Journal) -> None:
    reader, store = JournalReader(paths.journal_path()), ReceiptStore()
    try:
        intent = Intent(intent_id="delete-run", run_id=RUN, kind="delete-run")
        ctx = verbs.IntentContext(intent, reader.launch_description(RUN), None, reader, store)
        with pytest.raises(BrokerRefused, match=f"{RUN} was never attested by its owner"):
            ctx.check_project()
    finally:
        store.close()
        reader.close()
