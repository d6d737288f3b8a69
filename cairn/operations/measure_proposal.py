"""``flow.measure_proposal(evaluator, metrics=, primary=)``: measure W with an evaluator
(ARCHITECTURE §4.1).

Review: the first argument is a literal evaluator name (the site needs
``evaluator:NAME``) or a ``str`` field of the launch arguments, ``args.FIELD`` (the site
needs ``evaluator:$args.FIELD``); a launch freezes exactly the evaluators these name under
its arguments (:mod:`cairn.evaluators`), and the coordinator accepts a call only with its
site's evaluator (:func:`site_evaluator`). Journal: the request is the evaluator, the
primary metric and the metric definitions (:func:`cairn.experiments.measurement_request`).
Coordinator: the broker's ``measure-checkpoint`` intent, then the measurement as the
result (:mod:`cairn.coordinator.experiments`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any

from cairn.experiments import measurement_request
from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts
from cairn.protocol.jsonvalue import JSONObject, JSONValue
from cairn.protocol.names import is_verifier_name

ARGUMENT = "evaluator:$args."
"""The capability prefix of a site whose evaluator a launch argument names
(``evaluator:$args.<field>``); ``evaluator:<name>`` is a site's literal name."""


def review(state: ReviewContext, call: ast.Call) -> SiteFacts | None:
    first = call.args[0] if call.args else None
    if (
        isinstance(first, ast.Constant)
        and isinstance(first.value, str)
        and is_verifier_name(first.value)
    ):
        return SiteFacts(capabilities=frozenset({f"evaluator:{first.value}"}))
    why = "it is computed, neither a literal nor a launch argument"
    if first is None:
        why = "no evaluator is given"
    elif isinstance(first, ast.Constant):
        why = "not an evaluator name ([a-z0-9][a-z0-9_-]*)"
    elif isinstance(first, ast.Attribute):
        field, why = state.str_argument(first)
        if field is not None:
            return SiteFacts(capabilities=frozenset({ARGUMENT + field}))
    state.reject(
        call,
        "flow",
        "the first argument of flow.measure_proposal must name an evaluator (one of "
        "/etc/cairn/evaluators.d) as a string literal or as a str field of the launch "
        f"arguments (args.evaluator), so the review records it; "
        f"{ast.unparse(first) if first else 'nothing'!r}: {why}",
    )
    return None


def site_evaluator(capabilities: Iterable[str], args: Mapping[str, object]) -> str | None:
    """The one evaluator a reviewed site may measure with, under the run's launch
    ``args`` (validated, defaults filled in): its literal name or the argument's value."""
    for capability in capabilities:
        if capability.startswith(ARGUMENT):
            value = args.get(capability.removeprefix(ARGUMENT))
            return value if isinstance(value, str) else None
        if capability.startswith("evaluator:"):
            return capability.removeprefix("evaluator:")
    return None


def evaluators_of(
    review_manifest: dict[str, Any], args: Mapping[str, object]
) -> dict[str, str | None]:
    """The evaluators a reviewed manifest's calls use under launch ``args`` (a launch
    freezes these), sorted by name, each with the argument field that names it (``None``:
    the workflow names it literally)."""
    found: dict[str, str | None] = {}
    for call in review_manifest.get("calls", []):
        if call.get("kind") != "measure_proposal":
            continue
        capabilities = call.get("capabilities", [])
        name = site_evaluator(capabilities, args)
        if name is None:
            continue
        field = next(
            (c.removeprefix(ARGUMENT) for c in capabilities if c.startswith(ARGUMENT)), None
        )
        if found.get(name) is None:
            found[name] = field
    return dict(sorted(found.items()))


def request(
    evaluator: str, metrics: Mapping[str, JSONValue], primary: str | None
) -> JSONObject:
    """What the call sends and the journal stores."""
    return measurement_request(evaluator, metrics, primary)


SPECS = (
    OperationSpec(
        kind="measure_proposal",
        summary="run a host-configured evaluator over a disposable snapshot of W",
        review=review,
    ),
)
