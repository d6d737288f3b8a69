"""``flow.agent(descriptor, prompt=, title=)``: one agent session in the scope's W.

Review: the first argument names a module-level agent descriptor; the site needs the
descriptor's profile, ``write`` for write access and its network mode. Journal: the
request is the descriptor's name, the prompt and the title. Coordinator: budgets, the
capability policy (an approval may be needed), the unit, FINISH and the boundary
(:mod:`cairn.coordinator.agentop`).
"""

from __future__ import annotations

import ast
from typing import Any, Final

from cairn.operation_kinds import OperationKind
from cairn.operations.spec import OperationSpec, ReviewContext, SiteFacts

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
    capabilities = {f"profile:{entry.profile}"}
    if entry.access == "write":
        capabilities.add("write")
    if entry.network != "none":
        capabilities.add(f"network:{entry.network}")
    return SiteFacts(descriptor=first.id, capabilities=frozenset(capabilities))


def request(descriptor: str, prompt: str, title: str | None) -> dict[str, Any]:
    """What the call sends and the journal stores."""
    return {"descriptor": descriptor, "prompt": prompt, "title": title or descriptor}


SPECS = (
    OperationSpec(
        kind=AGENT,
        summary="one agent session in the scope's W; commits a boundary",
        review=review,
        leaves_boundary=True,
    ),
)
