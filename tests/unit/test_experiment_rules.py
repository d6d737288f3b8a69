"""Experiments: the evaluators a launch freezes, the one metric line an evaluator prints,
and the rules that keep a comparison honest and let guardrails bind. The runs themselves
(units over a snapshot of W) are in tests/system/test_experiments.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from test_control_worker import answer, drive

from cairn.config import ConfigError, Problems
from cairn.evaluators import frozen_evaluators
from cairn.experiments import (
    Measurement,
    MetricDefinition,
    aggregate,
    dishonesty,
    judge,
    measurement_request,
    unsettleable,
)
from cairn.operations import settle_experiment
from cairn.operations.measure_proposal import evaluators_of
from cairn.protocol.limits import TRIAL_REFUSED_SHOWN
from cairn.protocol.measurement import MeasurementEnvironment, parse_metric_output
from cairn.workflow.review import review_source


@pytest.fixture
def evaluators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    directory = tmp_path / "etc/cairn/evaluators.d"
    directory.mkdir(parents=True)
    return directory


def test_a_launch_freezes_only_the_evaluators_the_workflow_names(evaluators: Path) -> None:
    (evaluators / "bench.toml").write_text(
        'argv = ["/usr/bin/make", "bench"]\ntimeout_sec = 60\nwarmups = 1\nsamples = 5\n'
        '[environment]\nLANG = "C.UTF-8"\n'
    )
    (evaluators / "size.toml").write_text('argv = ["/usr/bin/du"]\ntimeout_sec = 5\n')
    problems = Problems()
    (bench,) = frozen_evaluators({"bench": None}, problems)
    assert (bench.name, bench.argv, bench.warmups, bench.samples) == (
        "bench", ["/usr/bin/make", "bench"], 1, 5
    )
    assert bench.environment == {"LANG": "C.UTF-8"}
    (size,) = frozen_evaluators({"size": None}, problems)
    assert (size.warmups, size.samples) == (0, 1)
    assert size.config_sha256 != bench.config_sha256
    assert len(problems) == 0


def test_an_unconfigured_or_invalid_evaluator_is_a_named_problem(evaluators: Path) -> None:
    (evaluators / "net.toml").write_text(
        'argv = ["/usr/bin/curl"]\ntimeout_sec = 5\nnetwork = true\n'
    )
    (evaluators / "rel.toml").write_text('argv = ["bench"]\ntimeout_sec = 5\nsamples = 0\n')
    problems = Problems()
    assert frozen_evaluators(dict.fromkeys(["missing", "net", "rel"]), problems) == []
    with pytest.raises(ConfigError) as caught:
        problems.check()
    text = caught.value.message
    assert "'missing', which is not configured" in text
    assert "net.toml: network" in text
    assert "rel.toml: argv: argv[0] 'bench' must be an absolute path" in text
    assert "rel.toml: samples" in text


def test_the_last_valid_metric_line_counts() -> None:
    output = (
        b'warming up\n{"cairn_metrics": {"runtime": 2.0}}\nnoise {"cairn_metrics": 1}\n'
        b'  {"cairn_metrics": {"runtime": 1.5, "rss": 40}}  \n{"other": 1}\n'
    )
    assert parse_metric_output(output) == {"runtime": 1.5, "rss": 40.0}


@pytest.mark.parametrize(
    "line",
    [
        '{"cairn_metrics": {}}',
        '{"cairn_metrics": {"Runtime": 1}}',
        '{"cairn_metrics": {"runtime": "fast"}}',
        '{"cairn_metrics": {"runtime": NaN}}',
        '{"cairn_metrics": {"runtime": Infinity}}',
        '{"cairn_metrics": {"runtime": 1}, "extra": 2}',
        '{"cairn_metrics": {"runtime": 1' + " " * 5000 + "}}",
        '{"cairn_metrics": {' + ", ".join(f'"m{i}": 1' for i in range(33)) + "}}",
        '{"cairn_metrics": {"runtime": true}}',  # no coercion: a bool is not a number
        '{"cairn_metrics": {"runtime": "1.5"}}',
        '{"cairn_metrics": {"runtime": [1]}}',
        '{"cairn_metrics": {"runtime": {"x": 1}}}',
        '{"cairn_metrics": ' + "[" * 2000 + "]" * 2000 + "}",  # a JSON bomb: never parsed
        '{"cairn_metrics": {"run\u001b[2Jtime": 1}}',
    ],
)
def test_a_malformed_metric_line_is_no_measurement(line: str) -> None:
    assert parse_metric_output(line.encode()) is None


def test_a_metric_line_in_invalid_utf8_is_no_measurement() -> None:
    assert parse_metric_output(b'{"cairn_metrics": {"r\xffx": 1}}\n') is None
    assert parse_metric_output(b'\xff\xfe\n{"cairn_metrics": {"r": 1}}\n') == {"r": 1.0}


ENV = MeasurementEnvironment(evaluator="bench", config_sha256="a" * 64, kernel="6.1", cpu="x")
METRICS: dict[str, Any] = {
    "runtime": {"unit": "s", "direction": "lower"},
    "rss": {"unit": "MB", "direction": "lower", "aggregation": "max", "max_regression": 0.1},
}


def measured(runtime: list[float], rss: list[float], **changes: Any) -> Measurement:
    request = measurement_request("bench", METRICS, "runtime")
    definitions = {n: MetricDefinition.model_validate(d) for n, d in request["metrics"].items()}
    samples = [{"runtime": r, "rss": m} for r, m in zip(runtime, rss, strict=True)]
    fields: dict[str, Any] = {
        "measurement": "root-3",
        "evaluator": "bench",
        "primary": "runtime",
        "metrics": definitions,
        "environment": ENV,
        "samples": samples,
        "values": aggregate(samples, definitions),
        "checkpoint": None,
        **changes,
    }
    return Measurement.model_validate(fields)


def test_samples_aggregate_by_each_metrics_definition() -> None:
    m = measured([3.0, 1.0, 2.0], [40, 50, 45])
    assert m.values == {"runtime": 2.0, "rss": 50.0}
    with pytest.raises(ValueError, match="did not report metric 'rss'"):
        aggregate([{"runtime": 1.0}], m.metrics)


def test_a_request_names_a_defined_primary_metric() -> None:
    assert measurement_request("bench", METRICS, None)["primary"] == "runtime"
    with pytest.raises(ValueError, match="primary metric 'speed'"):
        measurement_request("bench", METRICS, "speed")
    with pytest.raises(ValidationError):
        measurement_request("bench", {"runtime": {"unit": "s", "direction": "up"}}, None)
    with pytest.raises(ValueError, match="at least one"):
        measurement_request("bench", {}, None)


def test_comparisons_with_a_different_setup_are_refused() -> None:
    base = measured([2.0, 2.0], [40, 40])
    assert dishonesty(base, measured([1.0, 1.0], [40, 40])) == []
    other_env = ENV.model_copy(update={"kernel": "6.2"})
    assert dishonesty(base, measured([1.0, 1.0], [40, 40], environment=other_env)) == [
        "the environment (evaluator configuration, kernel or CPU) differs"
    ]
    assert dishonesty(base, measured([1.0], [40])) == ["1 samples against the baseline's 2"]
    changed = dict(base.metrics)
    changed["runtime"] = MetricDefinition(unit="s", direction="lower", aggregation="min")
    assert dishonesty(base, measured([1.0, 1.0], [40, 40], metrics=changed)) == [
        "the metric definitions differ"
    ]
    assert "evaluator other differs from bench" in dishonesty(
        base, measured([1.0, 1.0], [40, 40], evaluator="other")
    )


def test_only_the_primary_metric_and_its_guardrails_decide() -> None:
    best = measured([2.0], [100])
    better = judge(best, measured([1.5], [105]))
    assert better.refusals == [] and better.gain == pytest.approx(0.25)
    worse = judge(best, measured([2.5], [100]))
    assert worse.gain == pytest.approx(-0.25)
    assert worse.refusals == ["runtime is worse than the best accepted (-25.00%)"]
    broke = judge(best, measured([1.0], [111]))
    assert broke.refusals == [
        "guardrail rss: 11.00% worse than the best accepted, more than 10.00%"
    ]


def guide_example() -> str:
    guide = Path(__file__).parents[2] / "docs" / "writing-workflows.md"
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", guide.read_text(), re.DOTALL)
                if "measure_proposal" in b]
    return str(block)


def test_the_guide_example_passes_review_and_names_its_evaluator() -> None:
    review = review_source(guide_example(), filename="guide.py")
    assert evaluators_of(review.manifest(), {}) == {"bench": None}
    assert {c.kind for c in review.calls} >= {"measure_proposal", "settle_experiment"}


def test_the_guide_example_reports_its_trial_and_names_its_target() -> None:
    """The guide's workflow run by the control worker: its refused accept and its reject
    both carry the report and the target; the output reads the target's verdict."""
    refused = {"error": "root-5: cannot accept: runtime is worse", "kind": "experiment-refused"}
    answers: list[dict[str, Any]] = [
        {"measurement": "root-1", "values": {"runtime": 2.0}}, {"disposition": "accepted"},
        answer("summary", "inlined the hot loop", "root-3"),
        {"measurement": "root-4", "values": {"runtime": 2.5}}, refused,
        {"disposition": "rejected", "gain": -0.25, "target_reached": False},
    ]
    calls, end = drive(guide_example(), {"objective": "faster"}, answers)
    accept, reject = (c.request for c in calls[4:])
    assert (accept["disposition"], reject["disposition"]) == ("accept", "reject")
    assert accept["report"] == reject["report"] == {
        "hypothesis": "one change can make the suite faster",
        "intervention": "inlined the hot loop", "conclusion": "runtime 2.5 s"}
    assert accept["target"] == reject["target"] == 1.0
    assert end == {"type": "return", "output": {
        "summary": "rejected, gain -0.25, target reached: False"}}


def test_builtin_optimize_accepts_an_improvement_and_rejects_a_loss() -> None:
    """The control worker runs builtin:optimize against scripted answers: a baseline, a
    trial the runtime accepts, one whose accept is refused and that the workflow then
    rejects; every call is at a reviewed site."""
    source = (Path(__file__).parents[2] / "cairn/builtin/workflows/optimize.py").read_text()
    review = review_source(source, filename="wf.py")
    sites = {(c.kind, c.line) for c in review.calls}
    refused = {"error": "root-8: cannot accept: runtime is worse", "kind": "experiment-refused"}

    def measured(op: str, value: float) -> dict[str, Any]:
        return {"measurement": op, "values": {"runtime": value}}

    answers = [
        measured("root-1", 2.0), {"disposition": "accepted"},
        answer("summary", "cached", "root-3"), measured("root-4", 1.0),
        {"disposition": "accepted"},
        answer("summary", "unrolled", "root-6"), measured("root-7", 3.0), refused,
        {"disposition": "rejected"},
    ]
    calls, end = drive(source, {"objective": "faster", "max_trials": 2}, answers)
    assert [c.kind for c in calls] == [
        "measure_proposal", "settle_experiment", "agent", "measure_proposal",
        "settle_experiment", "agent", "measure_proposal", "settle_experiment",
        "settle_experiment",
    ]
    assert all((c.kind, int(c.location.split(":")[1])) in sites for c in calls)
    assert calls[0].request["evaluator"] == "bench" and calls[0].request["primary"] == "runtime"
    assert [c.request["disposition"] for c in calls if c.kind == "settle_experiment"] == [
        "accept", "accept", "accept", "reject"]
    assert "best so far 1.0" in calls[5].request["prompt"]
    assert end == {"type": "return", "output": {
        "summary": "1 of 2 trials accepted; runtime went from 2.0 to 1.0",
        "trials": 2, "accepted": 1, "target_reached": False,
    }}
    first_trial = calls[4].request
    assert first_trial["report"] == {
        "hypothesis": "trial 1: a change can make runtime lower",
        "intervention": "cached",
        "conclusion": "runtime measured 1.0 against the best 2.0",
    }
    assert "target" not in first_trial  # none given: the request reads as before
    assert calls[8].request["report"]["intervention"] == "unrolled"


def test_builtin_optimize_stops_once_the_target_is_reached() -> None:
    source = (Path(__file__).parents[2] / "cairn/builtin/workflows/optimize.py").read_text()
    answers: list[dict[str, Any]] = [
        {"measurement": "root-1", "values": {"runtime": 2.0}},
        {"disposition": "accepted", "target_reached": False},
        answer("summary", "cached", "root-3"),
        {"measurement": "root-4", "values": {"runtime": 0.9}},
        {"disposition": "accepted", "target_reached": True},
    ]
    calls, end = drive(source, {"objective": "faster", "max_trials": 5, "target": 1.0},
                       answers)
    assert [c.kind for c in calls] == [
        "measure_proposal", "settle_experiment", "agent", "measure_proposal",
        "settle_experiment"]  # four trials left, none made
    assert {c.request["target"] for c in calls if c.kind == "settle_experiment"} == {1.0}
    assert end == {"type": "return", "output": {
        "summary": "1 of 1 trials accepted; runtime went from 2.0 to 0.9; target 1.0 reached",
        "trials": 1, "accepted": 1, "target_reached": True,
    }}


@pytest.mark.parametrize(("report", "said"), [
    ({"hypothesis": "h", "intervention": "i"}, "exactly hypothesis, intervention and"),
    ({"hypothesis": "h", "intervention": "i", "conclusion": ""}, "conclusion must be text"),
    ({"hypothesis": "h", "intervention": 3, "conclusion": "c"}, "intervention must be text"),
    ({"hypothesis": "x" * 4_001, "intervention": "i", "conclusion": "c"}, "1 to 4000"),
    ("a report", "exactly hypothesis"),
])
def test_a_report_is_three_bounded_texts(report: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        settle_experiment.request({"measurement": "root-1"}, "accept", report)


def test_a_target_is_a_finite_number() -> None:
    for target in ("1", True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="target= takes a number"):
            settle_experiment.request({"measurement": "root-1"}, "accept", None, target)
    assert settle_experiment.request({"measurement": "root-1"}, "reject", None, 2)[
        "target"] == 2.0


def test_a_broken_evaluator_refuses_only_the_launches_that_measure_with_one(
    evaluators: Path,
) -> None:
    (evaluators / "broken.toml").write_text("argv = [")
    problems = Problems()
    assert frozen_evaluators({}, problems) == [] and len(problems) == 0
    frozen_evaluators({"broken": None}, problems)
    assert len(problems) >= 1


def test_the_guide_states_the_trial_refusal_as_the_runtime_says_it() -> None:
    """The guide's count of named refusals and its example refusal are the code's."""
    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "writing-workflows.md")
                     .read_text().split())
    assert f"measurement records the first {TRIAL_REFUSED_SHOWN} (`refused`" in guide
    gamed = measured([1.0], [40], measurement="root-4", refused_count=1,
                     refused=[{"path": "score.txt", "reason": "outside the write paths"}])
    assert f"(`cannot accept: {unsettleable(gamed)}; reject it, or declare the paths in " \
        "@workflow(write_paths=...)`)" in guide
    many = measured([1.0], [40], refused_count=3,
                    refused=[{"path": "a", "reason": "fifo"}])
    assert unsettleable(many) == "root-3 changed what the settlement refuses: a (fifo) and 2 more"
