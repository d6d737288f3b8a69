"""Experiments (ARCHITECTURE §4.1): what a measurement records, when two measurements may be
compared, and whether a candidate may be accepted.

A measurement is the result of ``flow.measure_proposal``: the metric definitions the
workflow gave (one of them primary), the evaluator's environment and the raw samples the
broker recorded. ``flow.settle_experiment`` compares a candidate with the baseline (the
first accepted measurement of the scope) and the best accepted one:

- the comparison is refused unless evaluator, environment, metric definitions and sample
  count equal the baseline's (:func:`dishonesty`);
- an accept is refused when the primary metric is worse than the best's or a guardrail
  (a metric's ``max_regression``) is exceeded (:func:`judge`).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from cairn.protocol.base import Frozen
from cairn.protocol.jsonvalue import JSONValue
from cairn.protocol.measurement import MeasurementEnvironment, MetricName
from cairn.protocol.settlement import RefusedPath

MAX_TRIALS = 100
METRIC_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class MetricDefinition(Frozen):
    """How one metric is read and compared: its unit, which way is better, how its samples
    become one value, and for a guardrail the largest regression allowed against the best
    accepted measurement (a fraction: 0.05 is 5 %)."""

    unit: str = Field(max_length=32)
    direction: Literal["lower", "higher"]
    aggregation: Literal["median", "mean", "min", "max"] = "median"
    max_regression: float | None = Field(default=None, ge=0, le=100)


class Measurement(Frozen):
    """What ``flow.measure_proposal`` returns and the journal keeps as its result.

    ``checkpoint``: the agent operation whose checkpoint W held when measured (None: W
    still held what the scope started from). ``refused``: the first of W's changes since
    the run began that the settlement would refuse (outside the write paths, or an entry
    it refuses), ``refused_count`` how many; a measurement with any is never accepted.
    ``allowlist``: the domains the evaluator's file let its runs reach (None: no network)."""

    measurement: str
    evaluator: str
    primary: MetricName
    metrics: dict[MetricName, MetricDefinition] = Field(min_length=1)
    environment: MeasurementEnvironment
    samples: list[dict[str, float]] = Field(min_length=1)
    values: dict[str, float]
    checkpoint: str | None
    refused: list[RefusedPath] = []
    refused_count: int = Field(default=0, ge=0)
    allowlist: list[str] | None = None

    @model_validator(mode="after")
    def _complete(self) -> Measurement:
        if self.primary not in self.metrics:
            raise ValueError(f"the primary metric {self.primary!r} is not defined")
        return self


def unsettleable(measured: Measurement) -> str:
    """What of a measured W the settlement would refuse, for a refusal's message."""
    shown = ", ".join(f"{r.path} ({r.reason})" for r in measured.refused)
    more = measured.refused_count - len(measured.refused)
    return (f"{measured.measurement} changed what the settlement refuses: {shown}"
            + (f" and {more} more" if more > 0 else ""))


def measurement_request(
    evaluator: str, metrics: Mapping[str, JSONValue], primary: str | None
) -> dict[str, Any]:
    """What ``flow.measure_proposal`` sends and the journal stores (checked here, in the
    workflow's sandbox, and again by the coordinator)."""
    for name in metrics:
        if not isinstance(name, str) or not METRIC_NAME_RE.fullmatch(name):
            raise ValueError(f"metric name {name!r} is not [a-z][a-z0-9_]*")
    defined = {name: MetricDefinition.model_validate(d) for name, d in metrics.items()}
    if not defined:
        raise ValueError("flow.measure_proposal needs at least one metric definition")
    chosen = primary or next(iter(defined))
    if chosen not in defined:
        raise ValueError(f"the primary metric {chosen!r} is not among the metrics")
    return {
        "evaluator": evaluator,
        "primary": chosen,
        "metrics": {name: d.model_dump(mode="json") for name, d in defined.items()},
    }


_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "mean": statistics.fmean,
    "min": min,
    "max": max,
}


def aggregate(samples: list[dict[str, float]], metrics: dict[str, MetricDefinition]) -> dict[
    str, float
]:
    """Each metric's value over the samples by its aggregation; a metric a sample lacks is
    an error (ValueError)."""
    values: dict[str, float] = {}
    for name, definition in metrics.items():
        try:
            column = [sample[name] for sample in samples]
        except KeyError:
            raise ValueError(
                f"the evaluator did not report metric {name!r} in every sample"
            ) from None
        if not column:
            raise ValueError("no samples")
        values[name] = _AGGREGATIONS[definition.aggregation](column)
    return values


def dishonesty(baseline: Measurement, candidate: Measurement) -> list[str]:
    """Why ``candidate`` may not be compared with ``baseline`` (empty: it may)."""
    reasons = []
    if candidate.evaluator != baseline.evaluator:
        reasons.append(f"evaluator {candidate.evaluator} differs from {baseline.evaluator}")
    if candidate.environment != baseline.environment:
        reasons.append("the environment (evaluator configuration, kernel or CPU) differs")
    if candidate.metrics != baseline.metrics or candidate.primary != baseline.primary:
        reasons.append("the metric definitions differ")
    if len(candidate.samples) != len(baseline.samples):
        reasons.append(
            f"{len(candidate.samples)} samples against the baseline's {len(baseline.samples)}"
        )
    return reasons


def regression(definition: MetricDefinition, best: float, value: float) -> float:
    """How much worse ``value`` is than ``best`` as a fraction of ``best`` (negative:
    better)."""
    worse = value - best if definition.direction == "lower" else best - value
    if best:
        return worse / abs(best)
    return 0.0 if worse == 0 else math.copysign(math.inf, worse)


def reached(best: Measurement, target: float) -> bool:
    """Whether ``best``'s primary metric is at ``target`` or beyond it, the way the
    metric's definition says is better."""
    value = best.values[best.primary]
    if best.metrics[best.primary].direction == "lower":
        return value <= target
    return value >= target


@dataclass(frozen=True)
class Verdict:
    """The primary metric's gain over the best (a fraction; positive is better) and the
    reasons an accept is refused (empty: acceptable)."""

    gain: float
    refusals: list[str]


def judge(best: Measurement, candidate: Measurement) -> Verdict:
    """Whether ``candidate`` may be accepted over ``best``: only the primary metric and the
    guardrails decide."""
    primary = candidate.primary
    gain = -regression(
        candidate.metrics[primary], best.values[primary], candidate.values[primary]
    )
    refusals = []
    if gain < 0:
        refusals.append(f"{primary} is worse than the best accepted ({gain:+.2%})")
    for name, definition in candidate.metrics.items():
        if name == primary or definition.max_regression is None:
            continue
        lost = regression(definition, best.values[name], candidate.values[name])
        if lost > definition.max_regression:
            refusals.append(
                f"guardrail {name}: {lost:.2%} worse than the best accepted, more than "
                f"{definition.max_regression:.2%}"
            )
    return Verdict(gain=gain, refusals=refusals)

