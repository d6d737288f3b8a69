"""``flow.measure_proposal(evaluator, metrics=, primary=)``: measure W with an evaluator
(ARCHITECTURE §4.1).

Review: the first argument must be a literal evaluator name; the site needs
``evaluator:NAME``, and a launch freezes exactly the evaluators its review names
(:mod:`cairn.evaluators`). Journal: the request is the evaluator, the primary metric and
the metric definitions (:func:`cairn.experiments.measurement_request`). Coordinator: the
broker's ``measure-checkpoint`` intent, then the measurement as the result
(:mod:`cairn.coordinator.experiments`).
"""

from __future__ import annotations

import ast
from typing import Any

from cairn.experiments import measurement_request
from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts
from cairn.protocol.launch import VERIFIER_NAME_RE


def review(state: ReviewContext, call: ast.Call) -> SiteFacts | None:
    first = call.args[0] if call.args else None
    if not (
        isinstance(first, ast.Constant)
        and isinstance(first.value, str)
        and VERIFIER_NAME_RE.fullmatch(first.value)
    ):
        state.reject(
            call,
            "flow",
            "the first argument of flow.measure_proposal must be an evaluator's name as a "
            "string literal (one of /etc/cairn/evaluators.d), so the review records it",
        )
        return None
    return SiteFacts(capabilities=frozenset({f"evaluator:{first.value}"}))


def evaluators_of(review_manifest: dict[str, Any]) -> list[str]:
    """The evaluator names a reviewed manifest's calls use (a launch freezes these)."""
    return sorted({
        capability.removeprefix("evaluator:")
        for call in review_manifest.get("calls", [])
        if call.get("kind") == "measure_proposal"
        for capability in call.get("capabilities", [])
        if capability.startswith("evaluator:")
    })


def request(evaluator: str, metrics: dict[str, Any], primary: str | None) -> dict[str, Any]:
    """What the call sends and the journal stores."""
    return measurement_request(evaluator, metrics, primary)


SPECS = (
    OperationSpec(
        kind="measure_proposal",
        summary="run a host-configured evaluator over a disposable snapshot of W",
        review=review,
    ),
)
