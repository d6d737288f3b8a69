"""``flow.settle_experiment(measurement, disposition)``: accept or reject a measured
candidate (ARCHITECTURE §4.1).

Journal: the request is the measurement's operation ID and ``accept`` or ``reject``.
Coordinator (:mod:`cairn.coordinator.experiments`): the comparison with the scope's
baseline must be honest, an accept must pass the primary metric and the guardrails
(:mod:`cairn.experiments`); a reject replaces W from the best accepted checkpoint as a new
W generation, recorded before the workflow continues.
"""

from __future__ import annotations

from typing import Any, Literal

from cairn.operations.spec import OperationSpec

Disposition = Literal["accept", "reject"]


def request(measurement: dict[str, Any], disposition: str) -> dict[str, Any]:
    """What the call sends and the journal stores: the measurement by its ID only (the
    coordinator reads the measurement itself from the journal)."""
    if disposition not in ("accept", "reject"):
        raise ValueError("disposition must be 'accept' or 'reject'")
    measured = measurement.get("measurement") if isinstance(measurement, dict) else None
    if not isinstance(measured, str):
        raise ValueError("flow.settle_experiment takes what flow.measure_proposal returned")
    return {"measurement": measured, "disposition": disposition}


SPECS = (
    OperationSpec(
        kind="settle_experiment",
        summary="accept or reject a measured candidate; a reject restores W",
    ),
)
