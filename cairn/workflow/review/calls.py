"""``flow.*`` call sites: each becomes a :class:`~cairn.workflow.review.manifest.CallSite`
of the effect manifest with the capabilities it needs; the flow object reaches only
functions of the module whose parameter carries its name."""

from __future__ import annotations

import ast

from cairn.operation_kinds import OperationKind
from cairn.operations import AVAILABLE_KINDS, is_kind, spec_of
from cairn.workflow.review.manifest import CallSite
from cairn.workflow.review.nodes import param_names, position_of, positional_names
from cairn.workflow.review.state import ReviewState

FLOW_KINDS = AVAILABLE_KINDS
"""The ``flow.<kind>`` calls the review accepts: exactly the kinds the coordinator carries
out, so a reviewed workflow never stops at run time on an operation it may not make."""


def visit_flow_use(state: ReviewState, node: ast.Name, parent: ast.AST | None) -> None:
    """A use of the flow object: a ``flow.<kind>(...)`` call or a hand-off to a function."""
    if isinstance(parent, ast.Attribute) and parent.value is node:
        call, name = state.parents.get(parent), parent.attr
        if is_kind(name) and isinstance(call, ast.Call) and call.func is parent:
            record_call(state, call, name)
        elif not is_kind(name):
            state.reject(
                parent,
                "flow",
                f"'{node.id}.{parent.attr}' is not a flow "
                f"operation; use one of {', '.join(FLOW_KINDS)}",
            )
        else:
            state.reject(
                parent,
                "flow",
                f"call '{node.id}.{parent.attr}(...)' directly; flow operations are not values",
            )
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


def record_call(state: ReviewState, call: ast.Call, kind: OperationKind) -> None:
    """Add one call site with its descriptor, answer schema and capabilities, as the
    kind's review rule (:mod:`cairn.operations`) finds them; refuse a kind this release
    does not carry out (its ``carried_out`` flag)."""
    if kind not in FLOW_KINDS:
        state.reject(
            call,
            "flow",
            f"flow.{kind}(...) is not available in this release of cairn; "
            f"use one of {', '.join(FLOW_KINDS)}",
        )
        return
    line, col = position_of(call)
    facts = spec_of(kind).review(state, call)
    if facts is None:
        return
    state.calls.append(
        CallSite(
            kind=kind,
            line=line,
            col=col,
            descriptor=facts.descriptor,
            answer_schema=facts.answer_schema,
            capabilities=sorted(facts.capabilities),
        )
    )
