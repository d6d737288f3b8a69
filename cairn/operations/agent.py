"""``flow.agent(descriptor, prompt=, title=, require_changes=)``: one agent session in the
scope's W.

Review: the first argument names a module-level agent descriptor; the site needs the
descriptor's profile, ``write`` for write access and its network mode; ``require_changes=``
is a literal, and ``True`` only for a write agent. Journal: the request is the
descriptor's name, the prompt, the title and ``require_changes`` when set (the operation
then fails with kind ``no-changes`` if the broker saw no change at its boundary).
Coordinator: budgets, the capability policy (an approval may be needed), the unit, FINISH
and the boundary (:mod:`cairn.coordinator.agentop`).
"""

from __future__ import annotations

import ast
from typing import Final

from cairn.operation_kinds import OperationKind
from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts
from cairn.protocol.jsonvalue import JSONObject

AGENT: Final[OperationKind] = "agent"


def review(state: ReviewContext, call: ast.Call) -> SiteFacts | None:
    first = call.args[0] if call.args else None
    if not (isinstance(first, ast.Name) and first.id in state.agents):
        state.reject(
            call,
            "flow",
            "the first argument of flow.agent must name a "
            "module-level agent descriptor (NAME = agent(...))",
        )
        return None
    entry = state.agents[first.id]
    for kw in call.keywords:
        if kw.arg != "require_changes":
            continue
        if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool)):
            state.reject(kw.value, "flow", "flow.agent require_changes= must be True or "
                         f"False as a literal; got {ast.unparse(kw.value)!r}")
            return None
        if kw.value.value and entry.access != "write":
            state.reject(kw.value, "flow", f"flow.agent require_changes=True needs a write "
                         f"agent; {first.id} has access={entry.access!r}")
            return None
    capabilities = {f"profile:{entry.profile}"}
    if entry.access == "write":
        capabilities.add("write")
    if entry.network != "none":
        capabilities.add(f"network:{entry.network}")
    return SiteFacts(descriptor=first.id, capabilities=frozenset(capabilities))


def request(
    descriptor: str, prompt: str, title: str | None, require_changes: bool = False
) -> JSONObject:
    """What the call sends and the journal stores (``require_changes`` only when asked:
    the requests of runs journalled before it existed stay the same)."""
    sent: JSONObject = {"descriptor": descriptor, "prompt": prompt,
                            "title": title or descriptor}
    if require_changes:
        sent["require_changes"] = True
    return sent


SPECS = (
    OperationSpec(
        kind=AGENT,
        summary="one agent session in the scope's W; commits a boundary",
        review=review,
        leaves_boundary=True,
    ),
)
