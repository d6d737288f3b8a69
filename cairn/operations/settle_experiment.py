"""``flow.settle_experiment(measurement, disposition, report=, target=)``: accept or reject
a measured candidate (ARCHITECTURE §4.1), with what the trial tried and found.

Journal: the request is the measurement's operation ID, ``accept`` or ``reject``, and when
the workflow gave them its report (hypothesis, intervention and conclusion, as text) and
the primary metric's target.
Coordinator (:mod:`cairn.coordinator.experiments`): the comparison with the scope's
baseline must be honest, an accept must pass the primary metric and the guardrails
(:mod:`cairn.experiments`); a reject replaces W from the best accepted checkpoint as a new
W generation, recorded before the workflow continues.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from cairn.operations.spec import OperationRecord, OperationSpec
from cairn.protocol.jsonvalue import JSONObject

Disposition = Literal["accept", "reject"]
REPORT_FIELDS = ("hypothesis", "intervention", "conclusion")
REPORT_CHARS = 4_000  # per field


class ExperimentRecord(OperationRecord, Protocol):
    """A journalled operation as the experiment facet reads it."""

    @property
    def state(self) -> str: ...

    @property
    def result(self) -> dict[str, Any] | None: ...

    @property
    def error(self) -> str | None: ...


def request(measurement: object, disposition: str,
            report: object = None, target: object = None) -> JSONObject:
    """What the call sends and the journal stores: the measurement by its ID only (the
    coordinator reads the measurement itself from the journal), the disposition, and the
    report and the primary metric's target when given."""
    if disposition not in ("accept", "reject"):
        raise ValueError("disposition must be 'accept' or 'reject'")
    measured = measurement.get("measurement") if isinstance(measurement, dict) else None
    if not isinstance(measured, str):
        raise ValueError(  # noqa: TRY004  (a workflow's bad argument: ValueError, as the rest)
            "flow.settle_experiment takes what flow.measure_proposal returned"
        )
    sent: JSONObject = {"measurement": measured, "disposition": disposition}
    if report is not None:  # left out otherwise: a request without one reads as before
        sent["report"] = trial_report(report)
    if target is not None:
        if isinstance(target, bool) or not isinstance(target, int | float) or \
                not math.isfinite(target):
            raise ValueError("target= takes a number: the primary metric's value to reach")
        sent["target"] = float(target)
    return sent


def checked(sent: JSONObject) -> JSONObject:
    """``sent`` if it is a request :func:`request` makes (the coordinator's check of what
    the workflow's sandbox sent); ValueError saying what is wrong otherwise."""
    measured = sent.get("measurement")
    again = request({"measurement": measured}, str(sent.get("disposition")),
                    sent.get("report"), sent.get("target"))
    if again != sent:
        raise ValueError("it holds keys or values flow.settle_experiment never sends")
    return again


def trial_report(report: object) -> JSONObject:
    """``report=`` as the journal keeps it: a mapping (or a workflow model) of exactly
    hypothesis, intervention and conclusion, each text of 1 to :data:`REPORT_CHARS`
    characters; ValueError saying what is wrong otherwise."""
    dump = getattr(report, "model_dump", None)
    fields = dump(mode="json") if callable(dump) else report
    if not isinstance(fields, dict) or sorted(fields) != sorted(REPORT_FIELDS):
        raise ValueError("report= takes exactly hypothesis, intervention and conclusion")
    for name in REPORT_FIELDS:
        text = fields[name]
        if not isinstance(text, str) or not text.strip() or len(text) > REPORT_CHARS:
            raise ValueError(f"report {name} must be text of 1 to {REPORT_CHARS} characters")
    return {name: fields[name] for name in REPORT_FIELDS}


SPECS = (
    OperationSpec(
        kind="settle_experiment",
        summary="accept or reject a measured candidate; a reject restores W",
    ),
)


def _value(measured: dict[str, Any] | None) -> float | None:
    if not measured:
        return None
    value = measured.get("values", {}).get(measured.get("primary"))
    return float(value) if isinstance(value, int | float) else None


def experiments(ops: Sequence[ExperimentRecord]) -> list[dict[str, Any]]:
    """The experiment facet of ``cairn show``: per scope that measured, the primary
    metric, the baseline, the latest and the best measurement with the best's gain over
    the baseline, the guardrails, and each settled candidate with its disposition
    (``refused``: the runtime refused the workflow's disposition) and the report the
    workflow gave with it; and, once a settlement named one, the target and whether the
    best reached it, and the domains its evaluator could reach (``network``)."""
    measured = {o.op_id: o.result for o in ops
                if o.kind == "measure_proposal" and o.state == "committed" and o.result}
    facets: dict[str, dict[str, Any]] = {}
    for op in ops:
        if op.kind == "measure_proposal" and op.op_id in measured:
            result = measured[op.op_id] or {}
            facet = facets.setdefault(op.scope, {
                "scope": op.scope, "metric": result.get("primary"),
                "metrics": result.get("metrics", {}), "baseline": None, "best": None,
                "gain": None, "candidates": [],
                "guardrails": {name: d.get("max_regression")
                               for name, d in result.get("metrics", {}).items()
                               if d.get("max_regression") is not None},
            })
            facet["latest"] = {"measurement": op.op_id, "value": _value(result)}
            if result.get("allowlist"):
                facet["network"] = result["allowlist"]
        if op.kind != "settle_experiment" or op.scope not in facets:
            continue
        facet, result = facets[op.scope], op.result or {}
        target = str(op.request.get("measurement"))
        entry = {"measurement": target, "value": _value(measured.get(target)),
                 "disposition": result.get("disposition") or
                 ("refused" if op.state == "not-started" else "pending")}
        if entry["disposition"] == "refused":
            entry["reason"] = op.error
        if "report" in op.request:  # a refused request may hold anything: shown if a report
            with contextlib.suppress(ValueError):
                entry["report"] = trial_report(op.request["report"])
        facet["candidates"].append(entry)
        if entry["disposition"] == "accepted":
            facet["best"] = {"measurement": target, "value": entry["value"]}
            facet["baseline"] = facet["baseline"] or facet["best"]
            facet["gain"] = result.get("gain")
        if "target_reached" in result:
            facet["target"] = {"value": op.request.get("target"),
                               "reached": result["target_reached"]}
    return list(facets.values())
