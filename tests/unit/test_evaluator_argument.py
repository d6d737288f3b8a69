"""An evaluator named by a launch argument: ``flow.measure_proposal(args.<field>, ...)``
passes review only for a ``str`` field of the workflow's own, never rebound ``args``; the
launch freezes exactly the evaluator the argument names (or refuses in one line), and the
coordinator accepts a measurement only with that evaluator. Runs end to end in
tests/system/test_experiments.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_experiment_coordinator import METRICS, RUN, FakeBroker, Script, coordinator_of

from cairn.config import ConfigError, Problems
from cairn.coordinator.core import Coordinator
from cairn.coordinator.experiments import ExperimentRefused
from cairn.daemon.launch import validate_args
from cairn.evaluators import frozen_evaluators
from cairn.operations.measure_proposal import evaluators_of, site_evaluator
from cairn.protocol.jsonvalue import JSONObject
from cairn.workflow.review import ReviewRejected, render_review, review_source

HEAD = '''
from cairn.workflow import Field, Model, workflow

class Choice(Model):
    evaluator: str = Field(default="bench", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    check: str
    count: int = 1
    maybe: str | None = None

class Report(Model):
    summary: str = ""

METRICS = {"runtime": {"unit": "s", "direction": "lower"}}

'''


def source(body: str, *, signature: str = "flow, args: Choice") -> str:
    return HEAD + (
        '@workflow(description="measure", input=Choice, output=Report)\n'
        f"async def run({signature}) -> Report:\n{body}    return Report()\n"
    )


MEASURE = "    await flow.measure_proposal(args.evaluator, metrics=METRICS)\n"


def test_a_str_argument_names_the_evaluator_in_the_manifest_and_the_review_text() -> None:
    review = review_source(source(MEASURE), filename="wf.py")
    (call,) = review.calls
    assert call.capabilities == ["evaluator:$args.evaluator"]
    assert review.capabilities == ["evaluator:$args.evaluator"]
    text = render_review(review)
    assert "measures with the host evaluator named by the argument 'evaluator'" in text
    literal = review_source(source(MEASURE.replace("args.evaluator", '"bench"')),
                            filename="wf.py")
    assert literal.capabilities == ["evaluator:bench"]
    assert literal.review_hash != review.review_hash
    assert "named by the argument" not in render_review(literal)


@pytest.mark.parametrize("body", [
    "    await flow.measure_proposal(args.check, metrics=METRICS)\n",  # required, no default
    # a nested function of the workflow reads the workflow's own args
    "    async def holds() -> None:\n"
    "        await flow.measure_proposal(args.check, metrics=METRICS)\n"
    "    await holds()\n",
])
def test_other_accepted_forms(body: str) -> None:
    review = review_source(source(body), filename="wf.py")
    assert review.capabilities == ["evaluator:$args.check"]


@pytest.mark.parametrize(("body", "why"), [
    ("    await flow.measure_proposal(args.count, metrics=METRICS)\n",
     "Choice.count is int, not str"),
    ("    await flow.measure_proposal(args.maybe, metrics=METRICS)\n",
     "Choice.maybe is str | None, not str"),
    ("    await flow.measure_proposal(args.missing, metrics=METRICS)\n",
     "Choice has no field 'missing'"),
    ("    await flow.measure_proposal(args.evaluator.strip(), metrics=METRICS)\n",
     "it is computed, neither a literal nor a launch argument"),
    ("    await flow.measure_proposal(args.evaluator + 'x', metrics=METRICS)\n",
     "it is computed, neither a literal nor a launch argument"),
    ("    await flow.measure_proposal(f'{args.evaluator}', metrics=METRICS)\n",
     "it is computed, neither a literal nor a launch argument"),
    ("    await flow.measure_proposal('Bench', metrics=METRICS)\n",
     "not an evaluator name ([a-z0-9][a-z0-9_-]*)"),
    ("    await flow.measure_proposal(metrics=METRICS)\n",
     "'nothing': no evaluator is given"),
    ("    name = args\n    await flow.measure_proposal(name.evaluator, metrics=METRICS)\n",
     "it is not a field of the launch arguments (args.<field>)"),
    ("    args = Choice(evaluator='other', check='x')\n"
     "    await flow.measure_proposal(args.evaluator, metrics=METRICS)\n",
     "'args' is bound again in the @workflow function"),
    ("    for args in [Choice(check='x')]:\n"
     "        await flow.measure_proposal(args.evaluator, metrics=METRICS)\n",
     "'args' is bound again in the @workflow function"),
    ("    try:\n        pass\n    except ValueError as args:\n        pass\n"
     "    await flow.measure_proposal(args.evaluator, metrics=METRICS)\n",
     "'args' is bound again in the @workflow function"),
    ("    async def inner(args: Choice) -> None:\n"
     "        await flow.measure_proposal(args.evaluator, metrics=METRICS)\n"
     "    await inner(Choice(evaluator='other', check='x'))\n",
     "'args' is bound again in the @workflow function"),
])
def test_anything_but_a_plain_str_field_of_the_workflows_args_is_refused(
    body: str, why: str
) -> None:
    with pytest.raises(ReviewRejected) as caught:
        review_source(source(body), filename="wf.py")
    messages = [v.message for v in caught.value.violations
                if "flow.measure_proposal" in v.message]
    assert len(messages) == 1, caught.value.violations
    assert messages[0].endswith(why)


def test_a_module_level_helper_cannot_name_the_evaluator_by_its_own_args() -> None:
    helper = source(
        "    await measure(flow, Choice(evaluator='other', check='x'))\n"
    ).replace(
        "@workflow(",
        "async def measure(flow, args: Choice) -> None:\n"
        "    await flow.measure_proposal(args.evaluator, metrics=METRICS)\n\n\n@workflow(",
    )
    with pytest.raises(ReviewRejected, match="it is outside the @workflow function"):
        review_source(helper, filename="wf.py")


@pytest.fixture
def evaluators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    directory = tmp_path / "etc/cairn/evaluators.d"
    directory.mkdir(parents=True)
    (directory / "bench.toml").write_text('argv = ["/usr/bin/make", "bench"]\ntimeout_sec = 5\n')
    (directory / "score.toml").write_text('argv = ["/usr/bin/score"]\ntimeout_sec = 7\n')
    return directory


def launch_freezes(args: dict[str, Any]) -> tuple[list[str], Problems]:
    """What ``daemon/launch.py`` freezes for a launch of the argument-named workflow."""
    review = review_source(source(MEASURE), filename="wf.py")
    problems = Problems()
    wanted = evaluators_of(review.manifest(), validate_args(review, args))
    return [spec.name for spec in frozen_evaluators(wanted, problems)], problems


def test_a_launch_freezes_exactly_the_evaluator_the_argument_names(evaluators: Path) -> None:
    named, problems = launch_freezes({"check": "x", "evaluator": "score"})
    assert named == ["score"] and len(problems) == 0
    named, problems = launch_freezes({"check": "x"})  # the field's default
    assert named == ["bench"] and len(problems) == 0


@pytest.mark.parametrize("name", ["nope", "Bench", "../../../home/alice/evil", "/tmp/evil"])
def test_a_launch_naming_an_unconfigured_evaluator_is_refused_in_one_line(
    evaluators: Path, name: str
) -> None:
    review = review_source(source(MEASURE.replace("args.evaluator", "args.check")),
                           filename="wf.py")
    problems = Problems()
    wanted = evaluators_of(review.manifest(), validate_args(review, {"check": name}))
    assert frozen_evaluators(wanted, problems) == []
    with pytest.raises(ConfigError) as caught:
        problems.check()
    assert "\n" not in caught.value.message
    assert caught.value.message.endswith(
        f"the launch argument 'check' names evaluator {name!r}, which is not configured"
    )
    assert caught.value.hint is not None
    assert caught.value.hint.startswith("launch with check set to one of: bench, score;")


def test_builtin_goal_refuses_a_check_the_host_does_not_configure(evaluators: Path) -> None:
    source = (Path(__file__).parents[2] / "cairn/builtin/workflows/goal.py").read_text()
    review = review_source(source, filename="goal.py")
    problems = Problems()
    args = validate_args(review, {"goal": "green", "check": "tests"})
    assert frozen_evaluators(evaluators_of(review.manifest(), args), problems) == []
    with pytest.raises(ConfigError) as caught:
        problems.check()
    assert caught.value.message.endswith(
        "tests.toml: the launch argument 'check' names evaluator 'tests', which is not "
        "configured"
    )
    args = validate_args(review, {"goal": "green", "check": "score"})
    (score,) = frozen_evaluators(evaluators_of(review.manifest(), args), Problems())
    assert (score.name, score.argv, score.timeout_sec) == ("score", ["/usr/bin/score"], 7)


def test_the_sites_evaluator_is_the_literal_or_the_launch_argument() -> None:
    args = {"evaluator": "score", "count": 2}
    assert site_evaluator(["evaluator:bench"], args) == "bench"
    assert site_evaluator(["evaluator:$args.evaluator"], args) == "score"
    assert site_evaluator(["evaluator:$args.count"], args) is None  # never a str, never one
    assert site_evaluator(["write"], args) is None


CHOSEN = '''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)
    evaluator: str = "bench"

class Report(Model):
    summary: str = ""

METRICS = {"runtime": {"unit": "s", "direction": "lower"},
           "rss": {"unit": "MB", "direction": "lower", "max_regression": 0.1}}

@workflow(description="measure", input=Goal, output=Report)
async def run(flow, args: Goal) -> Report:
    await flow.measure_proposal(args.evaluator, metrics=METRICS, primary="runtime")
    return Report()
'''
CHOSEN_LINES = {"measure_proposal": 16}


def measure_with(coord: Coordinator, evaluator: str) -> JSONObject:
    broker = coord.context.broker
    assert isinstance(broker, FakeBroker)
    broker.samples.append([{"runtime": 1.0, "rss": 100.0}] * 2)
    op, call = Script(coord, CHOSEN_LINES).call(
        "measure_proposal", {"evaluator": evaluator, "primary": "runtime", "metrics": METRICS}
    )
    return coord.handlers.answer_measure(op, call)[0]


def test_the_coordinator_measures_only_with_the_argument_named_evaluator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CHOSEN.splitlines()[CHOSEN_LINES["measure_proposal"] - 1].strip().startswith(
        "await flow.measure_proposal(")
    args = {"goal": "faster", "evaluator": "score"}
    with coordinator_of(tmp_path, monkeypatch, CHOSEN, args, ("score",)) as coord:
        assert measure_with(coord, "score")["evaluator"] == "score"


@pytest.mark.parametrize(("evaluator", "frozen", "why"), [
    # the workflow's default, but the launch chose score
    ("bench", ("score",), r"is not the reviewed one \(this call's is score\)"),
    # configured and frozen, yet not the argument's
    ("bench", ("bench", "score"), r"is not the reviewed one \(this call's is score\)"),
    # the argument's, but not in the launch description
    ("score", ("bench",), "was not frozen at launch"),
])
def test_a_measurement_naming_another_evaluator_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, evaluator: str, frozen: tuple[str, ...],
    why: str,
) -> None:
    args = {"goal": "faster", "evaluator": "score"}
    with coordinator_of(tmp_path, monkeypatch, CHOSEN, args, frozen) as coord:
        with pytest.raises(ExperimentRefused, match=f"^root-1: evaluator {evaluator} {why}"):
            measure_with(coord, evaluator)
        assert coord.journal.intents(RUN) == []  # the broker was never asked
