"""``flow.*`` call sites: each becomes a :class:`~cairn.workflow.review.manifest.CallSite`
of the effect manifest with the capabilities it needs; the flow object reaches only
functions of the module whose parameter carries its name."""

from __future__ import annotations

import ast

from cairn.workflow.review.manifest import CallSite
from cairn.workflow.review.nodes import param_names, position_of, positional_names
from cairn.workflow.review.state import ReviewState

FLOW_KINDS = (
    "agent",
    "parallel",
    "map",
    "unroll",
    "item",
    "ask",
    "measure_proposal",
    "settle_experiment",
    "repeat_until",
)


def visit_flow_use(state: ReviewState, node: ast.Name, parent: ast.AST | None) -> None:
    """A use of the flow object: a ``flow.<kind>(...)`` call or a hand-off to a function."""
    if isinstance(parent, ast.Attribute) and parent.value is node:
        call = state.parents.get(parent)
        if parent.attr not in FLOW_KINDS:
            state.reject(
                parent,
                "flow",
                f"'{node.id}.{parent.attr}' is not a flow "
                f"operation; use one of {', '.join(FLOW_KINDS)}",
            )
        elif not (isinstance(call, ast.Call) and call.func is parent):
            state.reject(
                parent,
                "flow",
                f"call '{node.id}.{parent.attr}(...)' directly; flow operations are not values",
            )
        else:
            record_call(state, call, parent.attr)
        return
    if isinstance(parent, ast.keyword):
        call, position, keyword = state.parents.get(parent), None, parent.arg
    else:
        call, keyword = parent, None
        position = (
            parent.args.index(node)
            if isinstance(parent, ast.Call) and node in parent.args
            else None
        )
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and (position is not None or keyword is not None)
    ):
        signatures = state.functions.get(call.func.id, [])
        if signatures and all(takes_flow(state, s, position, keyword) for s in signatures):
            return
    state.reject(
        node,
        "flow",
        f"use {node.id!r} only as '{node.id}.<operation>(...)' or "
        f"pass it to a function of this module whose parameter is named "
        f"{node.id!r}, so every call site is reviewed",
    )


def takes_flow(
    state: ReviewState, args: ast.arguments, position: int | None, keyword: str | None
) -> bool:
    if keyword is not None:
        return keyword == state.flow and any(a.arg == keyword for a in param_names(args))
    names = positional_names(args)
    return position is not None and position < len(names) and names[position] == state.flow


def record_call(state: ReviewState, call: ast.Call, kind: str) -> None:
    """Add one call site with its descriptor, answer schema and capabilities."""
    line, col = position_of(call)
    capabilities: set[str] = set()
    descriptor: str | None = None
    schema: str | None = None
    if kind == "agent":
        first = call.args[0] if call.args else None
        if not (isinstance(first, ast.Name) and first.id in state.agents):
            state.reject(
                call,
                "flow",
                "the first argument of flow.agent must name a "
                "module-level agent descriptor (NAME = agent(...))",
            )
            return
        descriptor = first.id
        entry = state.agents[descriptor]
        capabilities.add(f"profile:{entry.profile}")
        if entry.access == "write":
            capabilities.add("write")
        if entry.network != "none":
            capabilities.add(f"network:{entry.network}")
    elif kind == "ask":
        capabilities.add("human")
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
                    return
                schema = kw.value.id
    elif kind == "measure_proposal":
        capabilities.add("evaluator")
    state.calls.append(
        CallSite(
            kind=kind,
            line=line,
            col=col,
            descriptor=descriptor,
            answer_schema=schema,
            capabilities=sorted(capabilities),
        )
    )
