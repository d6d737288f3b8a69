"""Measurements and a reject on a real pool: the coordinator's experiment operations
through the broker's own ``carry_out`` (real journal, receipts and Btrfs snapshots; only
the socket and the evaluator's systemd unit are left out: the evaluator's argv runs here,
in the snapshot the broker made, and its output goes through the same strict parser).
A reject after an accept takes the scope's hot spare (``broker/spare.py``) by rename."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import btrfsutil
import pytest
from attested import carry_out_attested

from cairn import failpoints, paths
from cairn.broker import spare, units
from cairn.broker.receipts import ReceiptStore
from cairn.config import Problems
from cairn.coordinator.core import Coordinator
from cairn.coordinator.experiments import ExperimentRefused, MeasurementFailed
from cairn.errors import BrokerRefused
from cairn.evaluators import frozen_evaluators
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import Checkpointed, MeasurementTaken, StorageVerified, WCreated
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import EvaluatorSpec, LaunchDescription, ProfileSpec, ProjectSpec
from cairn.protocol.measurement import EvaluatorRun, parse_metric_output
from cairn.storage import Pool, is_subvolume
from cairn.unitprops import HelperUnitSpec
from cairn.workflow.review import review_source

OWNER = 1001
RUN = "flow_" + "0" * 31 + "b"
SOURCE = '''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

M = {"score": {"unit": "points", "direction": "lower"}}

@workflow(description="measure twice", input=Goal, output=Goal)
async def run(flow, args: Goal) -> Goal:
    first = await flow.measure_proposal("score", metrics=M)
    await flow.settle_experiment(first, "accept")
    return args
'''
LINES = {kind: n for n, text in enumerate(SOURCE.splitlines(), 1)
         for kind in ("measure_proposal", "settle_experiment") if f"flow.{kind}(" in text}
SCORE = EvaluatorSpec(
    name="score", argv=["/bin/sh", "-c", 'printf \'{"cairn_metrics": {"score": %s}}\\n\' '
                        '"$(cat score.txt)"'],
    timeout_sec=10, warmups=1, samples=2, config_sha256="d" * 64,
)


@pytest.fixture
def coordinator(monkeypatch: pytest.MonkeyPatch, broker_host: Pool) -> Iterator[Coordinator]:
    pool = broker_host
    seen: list[str] = []

    def run_evaluator(desc: LaunchDescription, evaluator: EvaluatorSpec, workspace: Path,
                      name: str, warmup: bool) -> tuple[EvaluatorRun, bytes]:
        assert is_subvolume(workspace) and workspace.name == "measure"
        out = subprocess.run(evaluator.argv, cwd=workspace, capture_output=True, check=False)
        (workspace / "build.log").write_text(name)  # a run may change its copy, never W
        seen.append(name)
        return EvaluatorRun(unit=name, invocation_id="i", warmup=warmup, result="success",
                            exit_status=out.returncode,
                            values=parse_metric_output(out.stdout)), out.stdout

    def run_helper(spec: HelperUnitSpec, name: str, timeout: float) -> dict[str, Any]:
        """The trial's check: the unit's own argv, its binds as host paths, as the owner."""
        binds = {dst: src for src, dst in [*spec.binds, *spec.read_only_binds]}
        for top in (pool.root / "runs", pool.run_dir(RUN), pool.run_dir(RUN) / "scratch"):
            top.chmod(0o711)  # what the unit's binds make reachable, reachable here
        argv = [binds.get(arg, arg) for arg in spec.exec_argv[1:]]
        done = subprocess.run(
            ["setpriv", f"--reuid={spec.uid}", f"--regid={spec.gid}", "--clear-groups", "--",
             sys.executable, *argv], capture_output=True, text=True, check=False, timeout=120,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})
        assert done.returncode == 0, done.stderr
        seen.append(name)
        return {"unit": name, "invocation_id": "t"}

    monkeypatch.setattr(units, "run_evaluator", run_evaluator)
    monkeypatch.setattr(units, "run_helper", run_helper)
    project = pool.root / "project"
    pool.create_subvolume(project)
    (project / "score.txt").write_text("3\n")
    os.chown(project, OWNER, OWNER)
    # the evaluator as the administrator configures it and a launch freezes it (root
    # re-reads the file by name and hash before it runs one)
    configured = paths.config_dir() / "evaluators.d"
    configured.mkdir(parents=True, exist_ok=True)
    (configured / "score.toml").write_text(
        f"argv = {json.dumps(SCORE.argv)}\ntimeout_sec = {SCORE.timeout_sec}\n"
        f"warmups = {SCORE.warmups}\nsamples = {SCORE.samples}\n"
    )
    problems = Problems()
    (score,) = frozen_evaluators({"score": None}, problems)
    problems.check()
    review = review_source(SOURCE, filename="wf.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=SOURCE, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "g"},
        project=ProjectSpec(root=str(project), owner_uid=OWNER, on_pool_fs=True),
        profiles={"test:x": ProfileSpec(name="test:x", kind="scripted")},
        cairn_version="0", created_at=1.0, evaluators=[score],
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    coord = Coordinator(RUN)
    coord.token = coord.journal.acquire_lease(RUN, coord.lease.holder)
    coord.prepare_storage()
    coord.seen = seen  # type: ignore[attr-defined]
    yield coord
    coord.journal.close()


def call(coord: Coordinator, seq: int, kind: str, request: dict[str, Any]) -> Any:
    request_ = CallRequest(scope="root", seq=seq, kind=kind, request=request,  # type: ignore[arg-type]
                           location=f"wf.py:{LINES[kind]}:5")
    op = coord.journal.record_requested(request_, run_id=RUN, op_id=f"root-{seq}",
                                        predecessor=f"root-{seq - 1}" if seq > 1 else None,
                                        token=coord.token)
    return coord.handlers.carry_out(op, request_)[0]


MEASURE = {"evaluator": "score", "primary": "score",
           "metrics": {"score": {"unit": "points", "direction": "lower",
                                 "aggregation": "median", "max_regression": None}}}


def test_a_measurement_runs_on_a_disposable_snapshot_and_a_reject_restores_w(
    coordinator: Coordinator, pool: Pool
) -> None:
    w1 = pool.w_path(RUN, "root", 1)
    baseline = call(coordinator, 1, "measure_proposal", MEASURE)
    assert baseline["samples"] == [{"score": 3.0}, {"score": 3.0}]
    assert coordinator.seen == [  # type: ignore[attr-defined]
        *(f"cairn-measure-{RUN}-root-1-1-{i}.service" for i in range(3)),
        f"cairn-trial-{RUN}-root-1-1.service",
    ]
    assert baseline["refused"] == [] and baseline["refused_count"] == 0
    assert not (pool.run_dir(RUN) / "trial").exists()
    assert sorted(p.name for p in w1.iterdir()) == ["score.txt"]  # runs changed their copy
    assert not (pool.run_dir(RUN) / "measure").exists()
    call(coordinator, 2, "settle_experiment", {"measurement": "root-1", "disposition": "accept"})

    (w1 / "score.txt").write_text("5\n")  # what an agent would have done
    (w1 / "new.txt").write_text("new\n")
    worse = call(coordinator, 3, "measure_proposal", MEASURE)
    assert worse["values"] == {"score": 5.0}
    rejected = call(coordinator, 4, "settle_experiment",
                    {"measurement": "root-3", "disposition": "reject"})
    assert rejected["w_generation"] == 2 and rejected["checkpoint"] is None
    w2 = pool.w_path(RUN, "root", 2)
    assert sorted(p.name for p in w2.iterdir()) == ["score.txt"]
    assert (w2 / "score.txt").read_text() == "3\n"  # W is the accepted baseline again
    assert not w1.exists()
    assert coordinator.w["root"] == 2
    # the measure receipt is kept once; asking the broker again measures nothing
    runs = len(coordinator.seen)  # type: ignore[attr-defined]
    carry_out_attested("launch-v1", RUN)
    assert len(coordinator.seen) == runs  # type: ignore[attr-defined]


def test_a_trial_whose_changes_the_settlement_refuses_is_measured_but_never_accepted(
    coordinator: Coordinator, pool: Pool
) -> None:
    """The agent games the metric with what would never settle (a FIFO, a setuid file):
    the measurement names them, its accept is refused saying why, a reject is not."""
    call(coordinator, 1, "measure_proposal", MEASURE)
    call(coordinator, 2, "settle_experiment", {"measurement": "root-1", "disposition": "accept"})
    w1 = pool.w_path(RUN, "root", 1)
    (w1 / "score.txt").write_text("1\n")
    os.mkfifo(w1 / "pipe")
    (w1 / "tool").write_text("#!/bin/sh\n")
    for name in ("pipe", "tool"):
        os.lchown(w1 / name, OWNER, OWNER)
    os.chmod(w1 / "tool", 0o4755)  # after the chown, which clears it
    gamed = call(coordinator, 3, "measure_proposal", MEASURE)
    assert gamed["values"] == {"score": 1.0}
    assert gamed["refused"] == [{"path": "pipe", "reason": "fifo"},
                                {"path": "tool", "reason": "setuid/setgid bit"}]
    assert gamed["refused_count"] == 2
    with pytest.raises(ExperimentRefused, match=r"cannot accept: root-3 changed what the "
                       r"settlement refuses: pipe \(fifo\), tool \(setuid/setgid bit\); "
                       r"reject it"):
        call(coordinator, 4, "settle_experiment",
             {"measurement": "root-3", "disposition": "accept"})
    rejected = call(coordinator, 5, "settle_experiment",
                    {"measurement": "root-3", "disposition": "reject"})
    assert rejected["disposition"] == "rejected"
    assert not (pool.w_path(RUN, "root", 2) / "pipe").exists()


def test_a_run_that_prints_no_metric_line_is_recorded_as_bytes_and_read_by_the_coordinator(
    coordinator: Coordinator, pool: Pool
) -> None:
    hostile = b"\x1b]0;pwned\x07\xff{[["
    (pool.w_path(RUN, "root", 1) / "score.txt").write_bytes(hostile)  # what an agent wrote
    with pytest.raises(MeasurementFailed, match="with no metric line; its output ends") as err:
        call(coordinator, 1, "measure_proposal", MEASURE)
    assert "\x1b]0;pwned\x07\ufffd{[[" in err.value.message  # decoded on cairn's side
    taken = ReceiptStore().get(RUN, "measure.root-1.1")
    assert taken is not None
    body = taken.body(MeasurementTaken)
    assert body.output_raw is not None and "pwned" not in body.error  # root's own words
    assert hostile in base64.b64decode(body.output_raw.b64)
    assert body.samples == [] and body.runs[0].values is None


@pytest.mark.parametrize(
    ("kind", "request_", "refusal"),
    [
        ("measure_proposal", {**MEASURE, "evaluator": "other"},
         "evaluator 'other' was not frozen at launch"),
        ("settle_experiment", {"measurement": "root-1", "disposition": "accept"},
         "root-1 is not a measurement of scope root"),
    ],
)
def test_the_broker_measures_only_a_journalled_measurement_with_a_frozen_evaluator(
    coordinator: Coordinator, kind: str, request_: dict[str, Any], refusal: str
) -> None:
    forged = CallRequest(scope="root", seq=1, kind=kind, request=request_,  # type: ignore[arg-type]
                         location="wf.py:1:1")
    coordinator.journal.record_requested(forged, run_id=RUN, op_id="root-1", predecessor=None,
                                         token=coordinator.token)
    intent = coordinator.context.intent("measure-checkpoint", "measure.root-1.1", scope="root",
                                op_id="root-1", generation=1)
    coordinator.journal.add_intents(RUN, [intent], token=coordinator.token)
    with pytest.raises(BrokerRefused, match=refusal):
        carry_out_attested("launch-v1", RUN)
    assert coordinator.seen == []  # type: ignore[attr-defined]


def agent_step(coord: Coordinator, pool: Pool, seq: int, score: int) -> str:
    """What a committed agent operation leaves: W edited, its checkpoint S and the broker's
    receipt of it (the checkpoint handler's QUIESCE proof needs systemd; the rest of the
    boundary is tested in test_storage.py)."""
    w = pool.w_path(RUN, "root", coord.w["root"])
    (w / "score.txt").write_text(f"{score}\n")
    (w / "notes").mkdir(exist_ok=True)
    (w / "notes" / f"step{seq}.txt").write_text(f"step {seq}\n")
    os.symlink(f"step{seq}.txt", w / "notes" / f"latest{seq}")
    request = CallRequest(scope="root", seq=seq, kind="agent", request={"descriptor": "x"},
                          location="wf.py:1:1")
    op_id = f"root-{seq}"
    coord.journal.record_requested(request, run_id=RUN, op_id=op_id,
                                   predecessor=f"root-{seq - 1}", token=coord.token)
    s = pool.snapshot(w, pool.checkpoint_path(RUN, op_id), read_only=True)
    store = ReceiptStore()
    store.put(coord.context.intent("checkpoint", f"checkpoint.{op_id}", op_id=op_id,
                           generation=coord.w["root"]), Checkpointed(s=s, op_id=op_id))
    store.close()
    for state in ("started", "settled", "committed"):
        coord.journal.update_op(RUN, op_id, token=coord.token, state=state,
                                result={} if state == "settled" else None)
    return op_id


def tree(top: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under ``top``: its kind and content (a symlink's target)."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(top))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", b"")
            else:
                out[rel] = ("file", path.read_bytes())
    return out


def accept_a_checkpoint(coord: Coordinator, pool: Pool) -> str:
    """Baseline (Q) accepted, then an agent's better checkpoint root-3 accepted (root-5):
    the scope's hot spare is made of root-3."""
    call(coord, 1, "measure_proposal", MEASURE)
    call(coord, 2, "settle_experiment", {"measurement": "root-1", "disposition": "accept"})
    good = agent_step(coord, pool, 3, score=2)
    call(coord, 4, "measure_proposal", MEASURE)
    accepted = call(coord, 5, "settle_experiment",
                    {"measurement": "root-4", "disposition": "accept"})
    assert accepted["checkpoint"] == good
    return good


def reject_a_worse_candidate(coord: Coordinator, pool: Pool, first: int) -> dict[str, Any]:
    agent_step(coord, pool, first, score=9)
    call(coord, first + 1, "measure_proposal", MEASURE)
    return call(coord, first + 2, "settle_experiment",  # type: ignore[no-any-return]
                {"measurement": f"root-{first + 1}", "disposition": "reject"})


def receipt_of(intent_id: str) -> WCreated:
    store = ReceiptStore()
    try:
        done = store.get(RUN, intent_id)
        assert done is not None, intent_id
        return done.body(WCreated)
    finally:
        store.close()


def storage_problems(coord: Coordinator, name: str) -> list[str]:
    intent = coord.context.intent("verify-storage", name)
    coord.journal.add_intents(RUN, [intent], token=coord.token)
    done = {r.intent_id: r for r in carry_out_attested("storage-v1", RUN)}
    return done[name].body(StorageVerified).problems


def test_a_reject_after_an_accept_takes_the_hot_spare_by_rename(
    coordinator: Coordinator, pool: Pool
) -> None:
    good = accept_a_checkpoint(coordinator, pool)
    s = pool.checkpoint_path(RUN, good)
    spare5 = pool.w_path(RUN, "root", 1).with_name("spare.root-5")
    made = receipt_of("spare.root-5").w
    assert made.path == str(spare5) and not made.read_only
    assert bytes(btrfsutil.subvolume_info(str(spare5)).parent_uuid).hex() == \
        pool.receipt(s).uuid
    # not read here: a read updates access times (relatime), which is a change of its own
    assert os.stat(spare5).st_uid == OWNER

    rejected = reject_a_worse_candidate(coordinator, pool, 6)
    assert (rejected["checkpoint"], rejected["w_generation"]) == (good, 2)
    w2 = pool.w_path(RUN, "root", 2)
    assert receipt_of("create-w.root.2").w.uuid == made.uuid == pool.receipt(w2).uuid
    assert not spare5.exists() and not pool.w_path(RUN, "root", 1).exists()
    assert tree(w2) == tree(s) and (w2 / "score.txt").read_text() == "2\n"
    assert os.stat(w2).st_uid == OWNER and not pool.receipt(w2).read_only
    # the next reject's spare, made after the swap
    spare8 = spare5.with_name("spare.root-8")
    assert bytes(btrfsutil.subvolume_info(str(spare8)).parent_uuid).hex() == \
        pool.receipt(s).uuid
    assert storage_problems(coordinator, "verify-storage.a") == []

    reject_a_worse_candidate(coordinator, pool, 9)  # and again: the second spare
    w3 = pool.w_path(RUN, "root", 3)
    assert pool.receipt(w3).uuid == receipt_of("spare.root-8").w.uuid
    assert tree(w3) == tree(s) and not spare8.exists()
    assert storage_problems(coordinator, "verify-storage.b") == []


@pytest.mark.parametrize("damage", ["written", "missing", "read-only"])
def test_a_spare_that_is_not_the_untouched_snapshot_is_not_taken(
    coordinator: Coordinator, pool: Pool, damage: str
) -> None:
    good = accept_a_checkpoint(coordinator, pool)
    s = pool.checkpoint_path(RUN, good)
    spare5 = pool.w_path(RUN, "root", 1).with_name("spare.root-5")
    made = receipt_of("spare.root-5").w
    if damage == "written":
        (spare5 / "score.txt").write_text("1\n")
        # in an earlier transaction: a write the current one has not committed yet leaves
        # the generation where it was until the commit (at most the commit interval)
        btrfsutil.sync(str(spare5))
    elif damage == "missing":
        btrfsutil.delete_subvolume(str(spare5))
    else:
        btrfsutil.set_subvolume_read_only(str(spare5), True)

    reject_a_worse_candidate(coordinator, pool, 6)
    w2 = pool.w_path(RUN, "root", 2)
    assert pool.receipt(w2).uuid != made.uuid  # a fresh snapshot of S instead
    assert bytes(btrfsutil.subvolume_info(str(w2)).parent_uuid).hex() == pool.receipt(s).uuid
    assert tree(w2) == tree(s) and os.stat(w2).st_uid == OWNER
    assert not spare5.exists()  # the damaged spare went with the new one's making
    assert spare5.with_name("spare.root-8").is_dir()
    assert storage_problems(coordinator, "verify-storage.a") == []


def test_a_crash_between_the_rename_and_the_receipt_redoes_nothing(
    coordinator: Coordinator, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = accept_a_checkpoint(coordinator, pool)
    made = receipt_of("spare.root-5").w

    class Crash(Exception):
        pass

    def crash(name: str, marker_dir: Path) -> None:
        assert name == "broker-after-spare-rename"
        raise Crash(name)

    real_failpoint = failpoints.failpoint
    monkeypatch.setattr(spare, "failpoint", crash)
    with pytest.raises(Crash):
        reject_a_worse_candidate(coordinator, pool, 6)
    w2 = pool.w_path(RUN, "root", 2)
    assert pool.receipt(w2).uuid == made.uuid  # renamed, no receipt yet
    store = ReceiptStore()
    assert store.get(RUN, "create-w.root.2") is None
    store.close()

    monkeypatch.setattr(spare, "failpoint", real_failpoint)
    done = {r.intent_id: r for r in carry_out_attested("storage-v1", RUN)}  # the broker again
    assert done["create-w.root.2"].body(WCreated).w.uuid == made.uuid
    assert not pool.w_path(RUN, "root", 1).exists() and "spare.root-8" in done
    assert tree(w2) == tree(pool.checkpoint_path(RUN, good))
    assert storage_problems(coordinator, "verify-storage.a") == []


@pytest.mark.parametrize(
    ("intent_id", "op_id", "checkpoint", "refusal"),
    [
        ("spare.root-4", "root-4", "root-3", "root-4 did not settle scope root on root-3"),
        ("spare.root-2", "root-2", "root-3", "root-2 did not settle scope root on root-3"),
        ("spare.other", "root-5", "root-3", "a spare names its settlement and checkpoint"),
    ],
)
def test_the_broker_makes_a_spare_only_of_what_a_settlement_settled_on(
    coordinator: Coordinator, pool: Pool, intent_id: str, op_id: str, checkpoint: str,
    refusal: str
) -> None:
    accept_a_checkpoint(coordinator, pool)
    forged = coordinator.context.intent("make-spare", intent_id, op_id=op_id,
                                        from_checkpoint=checkpoint)
    coordinator.journal.add_intents(RUN, [forged], token=coordinator.token)
    with pytest.raises(BrokerRefused, match=refusal):
        carry_out_attested("storage-v1", RUN)
    assert sorted(p.name for p in pool.w_path(RUN, "root", 1).parent.iterdir()) == [
        "W.1", "spare.root-5"]
