"""What an evaluator prints and what a measurement records (ARCHITECTURE §4.1).

An evaluator run reports its metric values as one line of JSON on stdout::

    {"cairn_metrics": {"runtime": 1.25, "rss": 48.0}}

Names are ``[a-z][a-z0-9_]*`` (at most 32 of them), values finite numbers. Other output
is allowed; the last line of that shape counts. The broker reads the run's output from
the journal by the unit's invocation ID (bounded) and parses only such a line, here,
strictly: at most 4096 bytes, exactly two objects deep, no array, strict UTF-8 JSON whose
values are numbers (not strings or booleans).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints, ValidationError, field_validator

from cairn.protocol.base import Frozen

METRIC_LINE_KEY = "cairn_metrics"
METRIC_LINE_KEY_B = METRIC_LINE_KEY.encode()
MAX_METRICS = 32
MAX_LINE = 4096
MetricName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


class MetricLine(Frozen):
    """The one JSON line an evaluator run prints."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    cairn_metrics: dict[MetricName, float] = Field(min_length=1, max_length=MAX_METRICS)

    @field_validator("cairn_metrics")
    @classmethod
    def _finite(cls, values: dict[str, float]) -> dict[str, float]:
        if not all(math.isfinite(v) for v in values.values()):
            raise ValueError("metric values must be finite numbers")
        return values


def parse_metric_output(output: bytes) -> dict[str, float] | None:
    """The values of the last valid metric line in ``output``; None when there is none."""
    for raw in reversed(output.splitlines()):
        line = raw.strip()
        if len(line) > MAX_LINE or not line.startswith(b"{") or METRIC_LINE_KEY_B not in line:
            continue
        if line.count(b"{") != 2 or b"[" in line:  # a metric line is two objects deep
            continue
        try:
            return MetricLine.model_validate_json(line).cairn_metrics
        except ValidationError:
            continue
    return None


class MeasurementEnvironment(Frozen):
    """Where the numbers came from: two measurements compare only when these agree."""

    evaluator: str
    config_sha256: str
    kernel: str = Field(max_length=256)
    cpu: str = Field(max_length=256)


class EvaluatorRun(Frozen):
    """One unit run of the evaluator (a warm-up or a sample) and what it reported."""

    unit: str
    invocation_id: str
    warmup: bool
    result: str
    exit_status: int
    values: dict[MetricName, float] | None = None
