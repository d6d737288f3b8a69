"""The coordinator's side of experiments on a real journal, with the broker faked (its
measure-checkpoint and W restore are real in tests/system/test_experiments.py): what a
measurement records, accept and reject with the baseline and the best, a reject's new W
generation recorded before the workflow continues, the honesty rules and the guardrails
refusing, and a settlement interrupted after its decision finishing the same way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cairn import retention
from cairn.cli.runs import experiment_lines
from cairn.coordinator.core import Coordinator
from cairn.coordinator.experiments import ExperimentRefused
from cairn.errors import StorageError
from cairn.journal.readwrite import Journal
from cairn.operations import settle_experiment
from cairn.protocol.broker import Intent, Receipt, Verb
from cairn.protocol.control import CallRequest
from cairn.protocol.launch import EvaluatorSpec, LaunchDescription, ProfileSpec, ProjectSpec
from cairn.workflow.review import review_source

SOURCE = '''
from cairn.workflow import Field, Model, agent, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

class Report(Model):
    summary: str = Field(min_length=1)

change = agent(profile="test:fetch", access="write", output=Report)
METRICS = {"runtime": {"unit": "s", "direction": "lower"},
           "rss": {"unit": "MB", "direction": "lower", "max_regression": 0.1}}

@workflow(description="measure", input=Goal, output=Report)
async def run(flow, args: Goal) -> Report:
    result = await flow.agent(change, prompt=args.goal)
    measured = await flow.measure_proposal("bench", metrics=METRICS, primary="runtime")
    await flow.settle_experiment(measured, "accept")
    return result.output
'''
LINES = {kind: n for n, text in enumerate(SOURCE.splitlines(), 1)
         for kind in ("agent", "measure_proposal", "settle_experiment")
         if f"flow.{kind}(" in text}
METRICS: dict[str, Any] = {
    "runtime": {"unit": "s", "direction": "lower", "aggregation": "median",
                "max_regression": None},
    "rss": {"unit": "MB", "direction": "lower", "aggregation": "median", "max_regression": 0.1},
}
OWNER = 1001
RUN = "flow_" + "0" * 31 + "e"
ENV = {"evaluator": "bench", "config_sha256": "c" * 64, "kernel": "6.1.0", "cpu": "test cpu"}


class FakeBroker:
    """Receipts for the intents the coordinator sends; the samples each measurement gets
    are queued by the test."""

    def __init__(self) -> None:
        self.samples: list[list[dict[str, float]]] = []
        self.environment = dict(ENV)
        self.sent: list[Intent] = []
        self.done: dict[str, Receipt] = {}

    def __call__(self, verb: Verb, intents: list[Intent], *, queued: bool = False) -> list[
        Receipt
    ]:
        out = []
        for intent in intents:
            if intent.intent_id not in self.done:
                self.sent.append(intent)
                self.done[intent.intent_id] = Receipt(
                    intent_id=intent.intent_id, run_id=RUN, kind=intent.kind,
                    data=self.body(intent), at=time.time(),
                )
            out.append(self.done[intent.intent_id])
        return out

    def body(self, intent: Intent) -> dict[str, Any]:
        if intent.kind == "measure-checkpoint":
            return {"op_id": intent.op_id, "environment": self.environment, "runs": [],
                    "samples": self.samples.pop(0), "error": ""}
        if intent.kind == "drop-w":
            return {"deleted": f"w.{intent.generation}"}
        subvolume = {"path": "w", "subvol_id": 300, "uuid": "u", "fsid": "f",
                     "read_only": False, "generation": 1}
        return {"w": subvolume}


@contextmanager
def coordinator_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str = SOURCE,
    args: dict[str, Any] | None = None, evaluators: tuple[str, ...] = ("bench",),
) -> Iterator[Coordinator]:
    """A coordinator holding the lease of a running run of ``source`` launched with
    ``args`` and ``evaluators`` frozen, over a real journal and a fake broker."""
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "var/lib/cairn/journal").mkdir(parents=True)
    review = review_source(source, filename="wf.py")
    desc = LaunchDescription(
        run_id=RUN, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=source, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "faster"} if args is None else args,
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=False),
        profiles={"test:fetch": ProfileSpec(name="test:fetch", kind="scripted")},
        cairn_version="0", created_at=time.time(),
        evaluators=[EvaluatorSpec(name=name, argv=["/usr/bin/bench"], timeout_sec=5,
                                  warmups=0, samples=2, config_sha256="c" * 64)
                    for name in evaluators],
    )
    with Journal(tmp_path / "var/lib/cairn/journal/journal.db", create=True) as journal:
        journal.create_run(desc, intents=[])
    coordinator = Coordinator(RUN)
    coordinator.token = coordinator.journal.acquire_lease(RUN, coordinator.lease.holder, ttl=60)
    coordinator.journal.set_run_state(RUN, "running", token=coordinator.token)
    coordinator.context.broker = FakeBroker()
    # the pool's reserve is checked for real in tests/btrfs/test_retention_pool.py
    monkeypatch.setattr(retention, "admit", lambda what: 1 << 40)
    yield coordinator
    coordinator.journal.close()


@pytest.fixture
def coord(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    with coordinator_of(tmp_path, monkeypatch) as coordinator:
        yield coordinator


class Script:
    """Calls of the root scope in order, as the control worker would make them."""

    def __init__(self, coord: Coordinator, lines: dict[str, int] | None = None) -> None:
        self.coord = coord
        self.seq = 0
        self.lines = LINES if lines is None else lines

    def call(self, kind: str, request: dict[str, Any]) -> tuple[Any, CallRequest]:
        self.seq += 1
        call = CallRequest(scope="root", seq=self.seq, kind=kind, request=request,  # type: ignore[arg-type]
                           location=f"wf.py:{self.lines[kind]}:5")
        predecessor = f"root-{self.seq - 1}" if self.seq > 1 else None
        op = self.coord.journal.record_requested(
            call, run_id=RUN, op_id=f"root-{self.seq}", predecessor=predecessor,
            token=self.coord.token,
        )
        return op, call

    def agent(self) -> str:
        """An agent boundary committed (its checkpoint is what W then holds)."""
        op, _ = self.call("agent", {"descriptor": "change", "prompt": "p", "title": "change"})
        for state in ("started", "settled", "committed"):
            self.coord.journal.update_op(RUN, op.op_id, token=self.coord.token, state=state,
                                         result={"output": {}} if state == "settled" else None)
        return str(op.op_id)

    def measure(self, runtime: float, rss: float = 100.0) -> dict[str, Any]:
        broker: FakeBroker = self.coord.context.broker  # type: ignore[assignment]
        broker.samples.append([{"runtime": runtime, "rss": rss}] * 2)
        op, call = self.call("measure_proposal",
                             {"evaluator": "bench", "primary": "runtime", "metrics": METRICS})
        result, fresh = self.coord.handlers.answer_measure(op, call)
        assert fresh
        return result

    def settle(self, measured: dict[str, Any], disposition: str,
               report: dict[str, str] | None = None,
               target: float | None = None) -> dict[str, Any]:
        request = settle_experiment.request(measured, disposition, report, target)
        op, call = self.call("settle_experiment", request)
        return self.coord.handlers.answer_settle_experiment(op, call)[0]


def test_accept_then_reject_restores_w_from_the_best_accepted_checkpoint(
    coord: Coordinator,
) -> None:
    script = Script(coord)
    baseline = script.measure(2.0)
    assert baseline["checkpoint"] is None and baseline["values"] == {"runtime": 2.0, "rss": 100}
    assert baseline["environment"] == ENV and len(baseline["samples"]) == 2
    first = script.settle(baseline, "accept")
    assert (first["disposition"], first["baseline"], first["best"]) == ("accepted", "root-1",
                                                                          "root-1")
    good = script.agent()
    better = script.measure(1.0)
    assert better["checkpoint"] == good
    accepted = script.settle(better, "accept")
    assert accepted["best"] == better["measurement"] and accepted["gain"] == pytest.approx(0.5)
    assert accepted["baseline"] == "root-1"
    script.agent()
    worse = script.measure(3.0)
    rejected = script.settle(worse, "reject")
    assert rejected["disposition"] == "rejected" and rejected["checkpoint"] == good
    assert rejected["w_generation"] == 2 and coord.w["root"] == 2
    broker: FakeBroker = coord.context.broker  # type: ignore[assignment]
    create, drop, spare = broker.sent[-3:]
    assert (create.intent_id, create.from_checkpoint, create.generation) == (
        "create-w.root.2", good, 2)
    assert (drop.intent_id, drop.generation) == ("drop-w.root.1", 1)
    # the next reject's spare of the same checkpoint; the accept of it made the first
    rejected_op = rejected_op_id(coord)
    assert (spare.intent_id, spare.op_id, spare.from_checkpoint) == (
        f"spare.{rejected_op}", rejected_op, good)
    assert [(i.intent_id, i.from_checkpoint) for i in broker.sent if i.kind == "make-spare"
            ] == [("spare.root-5", good), (f"spare.{rejected_op}", good)]
    # W now holds the best accepted checkpoint: the next measurement says so
    assert script.measure(1.0)["checkpoint"] == good
    op = coord.journal.get_op_by_id(RUN, rejected_op_id(coord))
    assert op.state == "committed"
    (facet,) = settle_experiment.experiments(coord.journal.list_ops(RUN))
    assert facet["metric"] == "runtime" and facet["guardrails"] == {"rss": 0.1}
    assert facet["baseline"] == {"measurement": "root-1", "value": 2.0}
    assert facet["best"] == {"measurement": "root-4", "value": 1.0}
    assert facet["latest"] == {"measurement": "root-9", "value": 1.0}
    assert facet["gain"] == pytest.approx(0.5)
    assert [(c["measurement"], c["disposition"]) for c in facet["candidates"]] == [
        ("root-1", "accepted"), ("root-4", "accepted"), ("root-7", "rejected")]


def rejected_op_id(coord: Coordinator) -> str:
    (op,) = [o for o in coord.journal.list_ops(RUN)
             if (o.result or {}).get("disposition") == "rejected"]
    return op.op_id


def test_an_accept_that_loses_or_breaks_a_guardrail_is_refused(coord: Coordinator) -> None:
    script = Script(coord)
    script.settle(script.measure(2.0), "accept")
    slower = script.measure(2.5)
    with pytest.raises(ExperimentRefused, match="runtime is worse than the best accepted"):
        script.settle(slower, "accept")
    assert coord.journal.get_op_by_id(RUN, f"root-{script.seq}").state == "not-started"
    bloated = script.measure(1.0, rss=120.0)
    with pytest.raises(ExperimentRefused, match="guardrail rss: 20.00% worse"):
        script.settle(bloated, "accept")
    assert coord.w["root"] == 1  # a refusal changes nothing
    (facet,) = settle_experiment.experiments(coord.journal.list_ops(RUN))
    assert [c["disposition"] for c in facet["candidates"]] == ["accepted", "refused", "refused"]
    assert "guardrail rss" in facet["candidates"][2]["reason"]
    assert facet["best"] == {"measurement": "root-1", "value": 2.0}


def test_dishonest_comparisons_are_refused_either_way(coord: Coordinator) -> None:
    script = Script(coord)
    script.settle(script.measure(2.0), "accept")
    broker: FakeBroker = coord.context.broker  # type: ignore[assignment]
    broker.environment["kernel"] = "6.9.0"
    moved = script.measure(1.0)
    for disposition in ("accept", "reject"):
        with pytest.raises(ExperimentRefused, match="dishonest comparison: the environment"):
            script.settle(moved, disposition)


def test_a_reject_needs_something_accepted_and_a_measurement_of_the_record(
    coord: Coordinator,
) -> None:
    script = Script(coord)
    first = script.measure(2.0)
    with pytest.raises(ExperimentRefused, match="nothing was accepted yet"):
        script.settle(first, "reject")
    with pytest.raises(ExperimentRefused, match="root-9 is not a finished measurement"):
        script.settle({"measurement": "root-9"}, "accept")


def test_a_settlement_interrupted_after_its_decision_finishes_the_same_way(
    coord: Coordinator,
) -> None:
    script = Script(coord)
    script.settle(script.measure(2.0), "accept")
    worse = script.measure(3.0)
    op, call = script.call("settle_experiment",
                           {"measurement": worse["measurement"], "disposition": "reject"})
    result, intents = coord.experiments.decide(op, call)
    coord.journal.update_op(RUN, op.op_id, token=coord.token, state="started", result=result,
                            intents=intents)
    # the crash: a new coordinator's w_gen comes from the journal's storage intents
    assert [i.intent_id for i in coord.journal.intents(RUN, "storage-v1")] == [
        "create-w.root.2", "drop-w.root.1"]
    started = coord.journal.get_op_by_id(RUN, op.op_id)
    again = coord.handlers.answer_settle_experiment(started, call)[0]
    assert again == result and coord.w["root"] == 2
    assert coord.journal.get_op_by_id(RUN, op.op_id).state == "committed"


def test_cairn_show_renders_the_experiment_facet(coord: Coordinator) -> None:
    script = Script(coord)
    script.settle(script.measure(2.0), "accept")
    script.agent()
    script.settle(script.measure(1.0), "accept")
    script.agent()
    script.settle(script.measure(3.0), "reject")
    (facet,) = settle_experiment.experiments(coord.journal.list_ops(RUN))
    assert experiment_lines(facet) == [
        "◆ experiment root · runtime · baseline 2 (root-1) · best 1 (root-4) · gain +50.0% "
        "· guardrails rss ≤10%",
        "  ✓ root-1 2 accepted",
        "  ✓ root-4 1 accepted",
        "  ✗ root-7 3 rejected",
    ]


REPORT = {"hypothesis": "caching the parse helps", "intervention": "an lru_cache",
          "conclusion": "runtime\x1b[2J halved"}


def test_a_target_is_judged_against_the_best_and_reports_are_shown(
    coord: Coordinator,
) -> None:
    script = Script(coord)
    first = script.settle(script.measure(2.0), "accept", target=1.0)
    assert first["target_reached"] is False
    script.agent()
    better = script.settle(script.measure(1.0), "accept", REPORT, target=1.0)
    assert better["target_reached"] is True  # at the target is reached ("lower" is better)
    script.agent()
    worse = script.settle(script.measure(3.0), "reject", target=0.5)
    assert worse["target_reached"] is False  # the best (1.0) is not at 0.5
    (facet,) = settle_experiment.experiments(coord.journal.list_ops(RUN))
    assert facet["target"] == {"value": 0.5, "reached": False}
    assert facet["candidates"][1]["report"] == REPORT
    assert experiment_lines(facet) == [
        "◆ experiment root · runtime · baseline 2 (root-1) · best 1 (root-4) · gain +50.0% "
        "· guardrails rss ≤10% · target 0.5 not reached",
        "  ✓ root-1 2 accepted",
        "  ✓ root-4 1 accepted",
        "      hypothesis: caching the parse helps",
        "      intervention: an lru_cache",
        "      conclusion: runtime\\x1b[2J halved",  # the workflow's text, escaped
        "  ✗ root-7 3 rejected",
    ]
    no_target = script.settle(script.measure(1.0), "accept")
    assert "target_reached" not in no_target


@pytest.mark.parametrize("extra", [
    {"report": ["not", "a", "report"]}, {"target": "1"}, {"target": float("inf")},
    {"report": {"hypothesis": "h", "intervention": "i", "conclusion": "c", "x": "y"}},
    {"besides": 1}])
def test_a_settlement_flow_never_sends_is_refused_and_shown_without_it(
    coord: Coordinator, extra: dict[str, Any]
) -> None:
    """The attack is the workflow sandbox's: a request it made up rather than one
    flow.settle_experiment built. The coordinator refuses it, and the facet (what cairn
    show prints) leaves out a report that is none."""
    script = Script(coord)
    measured = script.measure(2.0)
    op, call = script.call("settle_experiment", {"measurement": measured["measurement"],
                                                 "disposition": "accept", **extra})
    with pytest.raises(ExperimentRefused, match="not a settlement of flow.settle_experiment"):
        coord.handlers.answer_settle_experiment(op, call)
    (facet,) = settle_experiment.experiments(coord.journal.list_ops(RUN))
    (candidate,) = facet["candidates"]
    assert candidate["disposition"] == "refused" and "report" not in candidate
    assert "target" not in facet
    experiment_lines(facet)  # renders


def test_below_the_reserve_a_measurement_is_refused_before_its_intent(
    coord: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(what: str) -> int:
        raise StorageError(f"{what} refused: storage pool /pool has 10 MiB free")

    monkeypatch.setattr(retention, "admit", full)
    script = Script(coord)
    op, call = script.call("measure_proposal",
                           {"evaluator": "bench", "primary": "runtime", "metrics": METRICS})
    with pytest.raises(StorageError, match="^measurement refused: "):
        coord.handlers.answer_measure(op, call)
    assert coord.journal.intents(RUN) == []  # the broker was never asked
    assert coord.journal.get_op_by_id(RUN, op.op_id).state == "requested"
