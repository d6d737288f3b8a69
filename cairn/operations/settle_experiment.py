"""``flow.settle_experiment(measurement, disposition)``: accept or reject a measured
candidate (ARCHITECTURE §4.1).

Journal: the request is the measurement's operation ID and ``accept`` or ``reject``.
Coordinator (:mod:`cairn.coordinator.experiments`): the comparison with the scope's
baseline must be honest, an accept must pass the primary metric and the guardrails
(:mod:`cairn.experiments`); a reject replaces W from the best accepted checkpoint as a new
W generation, recorded before the workflow continues.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from cairn.operations.spec import OperationRecord, OperationSpec

Disposition = Literal["accept", "reject"]


class ExperimentRecord(OperationRecord, Protocol):
    """A journalled operation as the experiment facet reads it."""

    @property
    def state(self) -> str: ...

    @property
    def result(self) -> dict[str, Any] | None: ...

    @property
    def error(self) -> str | None: ...


def request(measurement: dict[str, Any], disposition: str) -> dict[str, Any]:
    """What the call sends and the journal stores: the measurement by its ID only (the
    coordinator reads the measurement itself from the journal)."""
    if disposition not in ("accept", "reject"):
        raise ValueError("disposition must be 'accept' or 'reject'")
    measured = measurement.get("measurement") if isinstance(measurement, dict) else None
    if not isinstance(measured, str):
        raise ValueError(  # noqa: TRY004  (a workflow's bad argument: ValueError, as the rest)
            "flow.settle_experiment takes what flow.measure_proposal returned"
        )
    return {"measurement": measured, "disposition": disposition}


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
    (``refused``: the runtime refused the workflow's disposition)."""
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
        if op.kind != "settle_experiment" or op.scope not in facets:
            continue
        facet, result = facets[op.scope], op.result or {}
        target = str(op.request.get("measurement"))
        entry = {"measurement": target, "value": _value(measured.get(target)),
                 "disposition": result.get("disposition") or
                 ("refused" if op.state == "not-started" else "pending")}
        if entry["disposition"] == "refused":
            entry["reason"] = op.error
        facet["candidates"].append(entry)
        if entry["disposition"] == "accepted":
            facet["best"] = {"measurement": target, "value": entry["value"]}
            facet["baseline"] = facet["baseline"] or facet["best"]
            facet["gain"] = result.get("gain")
    return list(facets.values())
