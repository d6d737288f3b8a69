"""Agent descriptors: each is a module-level ``NAME = agent(...)`` with literal arguments;
network modes and allowlist entries follow :mod:`cairn.netpolicy`, as the broker does."""

from __future__ import annotations

import ast
import re

from cairn.netpolicy import NETWORK_MODES, is_allowlist_entry
from cairn.protocol.jsonvalue import JSONValue
from cairn.workflow import ACCESS_MODES
from cairn.workflow.review.manifest import AgentEntry
from cairn.workflow.review.nodes import Reject, literal
from cairn.workflow.review.state import ReviewState

PROFILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._/-]{0,199}$")


def review_agent(state: ReviewState, stmt: ast.Assign) -> None:
    """Record ``NAME = agent(...)`` as an :class:`AgentEntry`, or reject it."""
    call = stmt.value
    assert isinstance(call, ast.Call)
    state.agent_nodes.add(call)
    if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
        state.reject(stmt, "agent", "assign each agent(...) to exactly one plain name")
        return
    name = stmt.targets[0].id
    if name in state.agents or name in state.models:
        state.reject(stmt, "rebind", f"{name!r} is defined twice; use one name once")
        return
    if "agent" not in state.api:
        state.reject(stmt, "agent", "import agent from cairn.workflow before using it")
    if call.args:
        state.reject(call, "agent", "agent(...) takes keyword arguments only")
        return
    values: dict[str, JSONValue] = {}
    for kw in call.keywords:
        try:
            if kw.arg == "output":
                if not (isinstance(kw.value, ast.Name) and kw.value.id in state.models):
                    raise Reject(
                        kw.value,
                        "agent",
                        "agent output= must name a Model class defined above in this module",
                    )
                values["output"] = kw.value.id
            elif kw.arg in ("profile", "access", "network"):
                values[kw.arg] = literal(kw.value)
            elif kw.arg == "allowlist":
                if not isinstance(kw.value, ast.Tuple | ast.List):
                    raise Reject(kw.value, "agent", "allowlist= must be a literal tuple of domains")
                values["allowlist"] = [literal(e) for e in kw.value.elts]
            else:
                raise Reject(
                    kw.value if kw.arg is None else kw,
                    "agent",
                    f"agent() takes profile, access, network, output and "
                    f"allowlist, not {kw.arg or '**'}",
                )
        except Reject as exc:
            state.reject(exc.node, exc.rule, exc.message)
            return
    problem = _agent_problem(values)
    if problem:
        state.reject(call, "agent", problem)
        return
    state.definitions.add(stmt)
    state.agents[name] = AgentEntry.model_validate(values)


def _agent_problem(values: dict[str, JSONValue]) -> str | None:
    profile = values.get("profile")
    access = values.setdefault("access", "read")
    network = values.setdefault("network", "none")
    allowlist = values.setdefault("allowlist", [])
    if "output" not in values:
        return "agent(...) needs output=<Model class>"
    if not isinstance(profile, str) or not PROFILE_RE.match(profile):
        return "agent profile= must be a literal profile name such as 'builtin:implementer'"
    if access not in ACCESS_MODES:
        return f"agent access= must be one of {', '.join(ACCESS_MODES)}"
    if network not in NETWORK_MODES:
        return f"agent network= must be one of {', '.join(NETWORK_MODES)}"
    if network == "allowlist" and not allowlist:
        return "network='allowlist' needs allowlist=('domain', ...)"
    if network != "allowlist" and allowlist:
        return "allowlist= applies only with network='allowlist'"
    assert isinstance(allowlist, list)
    for domain in allowlist:
        if not is_allowlist_entry(domain):
            return f"allowlist entry {domain!r} is not a domain name"
    return None
