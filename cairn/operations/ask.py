"""``flow.ask(question, schema=)``: a durable question to a person; the run waits.

Review: ``schema=`` names a Model class of the module; the site needs ``human``.
Journal: the request is the question and the answer model's name. Coordinator: the
question is committed with a challenge and the run waits until an answer bound to it
arrives (:mod:`cairn.coordinator.interactions`).
"""

from __future__ import annotations

import ast

from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts
from cairn.protocol.jsonvalue import JSONObject

_NEEDS = frozenset({"human"})


def review(state: ReviewContext, call: ast.Call) -> SiteFacts | None:
    schema: str | None = None
    for kw in call.keywords:
        if kw.arg == "schema":
            if not (isinstance(kw.value, ast.Name) and kw.value.id in state.models):
                state.reject(
                    kw.value,
                    "flow",
                    "flow.ask schema= must name a Model "
                    "class of this module, so answers are validated without "
                    "running the workflow",
                )
                return None
            schema = kw.value.id
    return SiteFacts(answer_schema=schema, capabilities=_NEEDS)


def request(question: str, schema: str | None) -> JSONObject:
    """What the call sends and the journal stores (``schema``: the answer model's name)."""
    sent: JSONObject = {"question": question}
    if schema is not None:
        sent["schema"] = schema
    return sent


SPECS = (
    OperationSpec(
        kind="ask",
        summary="a durable question to a person; the run waits for the answer",
        review=review,
    ),
)
