"""Measurements and a reject on a real pool: the coordinator's experiment operations
through the broker's own ``carry_out`` (real journal, receipts and Btrfs snapshots; only
the socket and the evaluator's systemd unit are left out: the evaluator's argv runs here,
in the snapshot the broker made, and its output goes through the same strict parser)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn import paths
from cairn.broker import units, verbs
from cairn.coordinator import base
from cairn.coordinator.core import Coordinator
from cairn.coordinator.dispatch import Handlers
from cairn.errors import BrokerRefused
from cairn.journal import Journal
from cairn.protocol.broker import BrokerReply
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import EvaluatorSpec, LaunchDescription, ProfileSpec, ProjectSpec
from cairn.protocol.measurement import EvaluatorRun, parse_metric_output
from cairn.storage import Pool, is_subvolume
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
def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: Pool) -> Iterator[
    Coordinator
]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    for directory in (paths.journal_path().parent, paths.broker_db_path().parent,
                      paths.config_dir()):
        directory.mkdir(parents=True)
    paths.pool_dir().symlink_to(pool.root)
    monkeypatch.setattr(verbs.Context, "pool", lambda self: pool)
    monkeypatch.setattr(base, "call_broker", lambda verb, run_id, **_: BrokerReply(
        ok=True, receipts=verbs.carry_out(verb, run_id)))
    seen: list[str] = []

    def run_evaluator(desc: LaunchDescription, evaluator: EvaluatorSpec, workspace: Path,
                      name: str, warmup: bool) -> tuple[EvaluatorRun, str]:
        assert is_subvolume(workspace) and workspace.name == "measure"
        out = subprocess.run(evaluator.argv, cwd=workspace, capture_output=True, text=True)
        (workspace / "build.log").write_text(name)  # a run may change its copy, never W
        seen.append(name)
        return EvaluatorRun(unit=name, invocation_id="i", warmup=warmup, result="success",
                            exit_status=out.returncode,
                            values=parse_metric_output(out.stdout)), out.stdout

    monkeypatch.setattr(units, "run_evaluator", run_evaluator)
    project = pool.root / "project"
    pool.create_subvolume(project)
    (project / "score.txt").write_text("3\n")
    os.chown(project, OWNER, OWNER)
    review = review_source(SOURCE, filename="wf.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=SOURCE, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "g"},
        project=ProjectSpec(root=str(project), owner_uid=OWNER, on_pool_fs=True),
        profiles={"test:x": ProfileSpec(name="test:x", kind="scripted")},
        cairn_version="0", created_at=1.0, evaluators=[SCORE],
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    coord = Coordinator(RUN)
    coord.token = coord.journal.acquire_lease(RUN, coord.holder)
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
    handler = Handlers.answer_measure if kind == "measure_proposal" else \
        Handlers.answer_settle_experiment
    return handler(coord, op, request_)[0]


MEASURE = {"evaluator": "score", "primary": "score",
           "metrics": {"score": {"unit": "points", "direction": "lower",
                                 "aggregation": "median", "max_regression": None}}}


def test_a_measurement_runs_on_a_disposable_snapshot_and_a_reject_restores_w(
    coordinator: Coordinator, pool: Pool
) -> None:
    w1 = pool.w_path(RUN, "root", 1)
    baseline = call(coordinator, 1, "measure_proposal", MEASURE)
    assert baseline["samples"] == [{"score": 3.0}, {"score": 3.0}]
    assert coordinator.seen == [f"cairn-measure-{RUN}-root-1-1-{i}.service"  # type: ignore[attr-defined]
                                for i in range(3)]
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
    assert coordinator.w_gen["root"] == 2
    # the measure receipt is kept once; asking the broker again measures nothing
    runs = len(coordinator.seen)  # type: ignore[attr-defined]
    verbs.carry_out("launch-v1", RUN)
    assert len(coordinator.seen) == runs  # type: ignore[attr-defined]


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
    intent = coordinator.intent("measure-checkpoint", "measure.root-1.1", scope="root",
                                op_id="root-1", generation=1)
    coordinator.journal.add_intents(RUN, [intent], token=coordinator.token)
    with pytest.raises(BrokerRefused, match=refusal):
        verbs.carry_out("launch-v1", RUN)
    assert coordinator.seen == []  # type: ignore[attr-defined]
