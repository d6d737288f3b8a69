"""Names: nothing the module imports or defines, and no builtin exception, is rebound;
the flow object is bound only as a parameter."""

from __future__ import annotations

import ast

from cairn.workflow.review.nodes import bound_names, is_dunder
from cairn.workflow.review.state import ReviewState
from cairn.workflow.review.subset import BUILTIN_BASE_EXCEPTIONS


def review_bindings(state: ReviewState) -> None:
    """Reject rebinding a reserved name, binding the flow object and dunder names."""
    reserved: dict[str, str] = {}
    for name in state.api:
        reserved[name] = "a cairn.workflow name"
    for name in (*state.modules, *state.members):
        reserved[name] = "an imported name"
    for name in state.models:
        reserved[name] = "a Model class"
    for name in state.agents:
        reserved[name] = "an agent descriptor"
    for name in BUILTIN_BASE_EXCEPTIONS:
        reserved[name] = "a builtin exception"
    for node, name in bound_names(state.tree):
        if node in state.definitions or state.parents.get(node) in state.definitions:
            continue
        if name == state.flow and not isinstance(node, ast.arg):
            state.reject(
                node,
                "flow",
                f"{name!r} is the flow object; bind it only as a function parameter",
            )
        elif name in reserved:
            state.reject(node, "rebind", f"{name!r} is {reserved[name]}; choose another name")
        if is_dunder(name):
            state.reject(
                node,
                "dunder",
                f"name {name!r} is not allowed in a workflow "
                "(double-underscore names reach interpreter internals)",
            )
