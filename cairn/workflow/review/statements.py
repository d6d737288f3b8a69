"""Every statement and expression: loops, scopes, ``try``, decorators, forbidden names,
dunder and introspection access, module members; ``flow`` uses go to
:mod:`cairn.workflow.review.calls`, ``.format`` on a literal string to
:mod:`cairn.workflow.review.formats`, the bound of a ``while`` to
:mod:`cairn.workflow.review.loops`."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from cairn.workflow.review.calls import visit_flow_use
from cairn.workflow.review.formats import literal_format_refusal
from cairn.workflow.review.loops import while_bound_refusal
from cairn.workflow.review.nodes import is_dunder, param_names
from cairn.workflow.review.state import ReviewState, StatementContext
from cairn.workflow.review.subset import (
    BUILTIN_EXCEPTIONS,
    FORBIDDEN_NAMES,
    INTROSPECTION_ATTRIBUTES,
    INTROSPECTION_PREFIXES,
    is_exception_member,
    member_refusal,
)


def review_statements(state: ReviewState) -> None:
    """Walk every statement and expression of the module."""
    visit_block(state, state.tree.body, StatementContext())


def visit_block(state: ReviewState, body: Iterable[ast.stmt], ctx: StatementContext) -> None:
    for stmt in body:
        visit_stmt(state, stmt, ctx)


def visit_stmt(state: ReviewState, stmt: ast.stmt, ctx: StatementContext) -> None:
    if isinstance(stmt, ast.While):
        refusal = while_bound_refusal(state, stmt)
        if refusal:
            state.reject(stmt, "while", refusal)
    elif isinstance(stmt, ast.Global | ast.Nonlocal):
        word = "global" if isinstance(stmt, ast.Global) else "nonlocal"
        state.reject(
            stmt,
            "scope",
            f"'{word}' is not allowed in a workflow (return "
            "values instead of rebinding outer names)",
        )
    elif isinstance(stmt, ast.AsyncFor | ast.AsyncWith):
        word = "async for" if isinstance(stmt, ast.AsyncFor) else "async with"
        state.reject(
            stmt,
            "async",
            f"'{word}' is not allowed in a workflow (await flow.* calls directly)",
        )
    elif (isinstance(stmt, ast.Return) and ctx.in_finally) or (
        isinstance(stmt, ast.Break | ast.Continue) and ctx.in_finally and not ctx.in_loop
    ):
        state.reject(
            stmt,
            "try",
            "'finally' may not return, break or continue: that "
            "would swallow the runtime's suspend and cancel signals",
        )
    elif isinstance(stmt, ast.ClassDef):
        if state.parents.get(stmt) is not state.tree:
            state.reject(
                stmt, "class", "classes are defined only at module level, as 'class X(Model)'"
            )
        visit_exprs(state, [*stmt.bases, *(k.value for k in stmt.keywords)], ctx)
        return  # the body was reviewed as a model
    elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        visit_function(state, stmt)
        return
    elif isinstance(stmt, ast.Try | ast.TryStar):
        for handler in stmt.handlers:
            review_handler(state, handler)
        visit_block(state, stmt.body, ctx)
        for handler in stmt.handlers:
            visit_block(state, handler.body, ctx)
        visit_block(state, stmt.orelse, ctx)
        visit_block(state, stmt.finalbody, ctx._replace(in_finally=True, in_loop=False))
        return
    if isinstance(stmt, ast.For | ast.While):
        visit_exprs(
            state, [stmt.target, stmt.iter] if isinstance(stmt, ast.For) else [stmt.test], ctx
        )
        visit_block(state, stmt.body, ctx._replace(in_loop=True))
        visit_block(state, stmt.orelse, ctx)
        return
    children: list[ast.expr] = []
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.stmt):
            visit_stmt(state, child, ctx)
        elif isinstance(child, ast.expr):
            children.append(child)
        elif isinstance(child, ast.match_case | ast.withitem | ast.keyword):
            for sub in ast.iter_child_nodes(child):
                if isinstance(sub, ast.stmt):
                    visit_stmt(state, sub, ctx)
                elif isinstance(sub, ast.expr):
                    children.append(sub)
                elif isinstance(sub, ast.pattern):
                    children.extend(e for e in ast.walk(sub) if isinstance(e, ast.expr))
    visit_exprs(state, children, ctx)


def visit_function(state: ReviewState, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    if fn not in state.workflow_candidates and fn.decorator_list:
        state.reject(
            fn.decorator_list[0],
            "decorator",
            "decorators are not allowed in a workflow except one @workflow(...) "
            "on the module's async workflow function",
        )
    args = fn.args
    outer = StatementContext()
    visit_exprs(
        state,
        [
            *args.defaults,
            *(d for d in args.kw_defaults if d is not None),
            *(a.annotation for a in param_names(args) if a.annotation),
            *([fn.returns] if fn.returns else []),
            *fn.decorator_list,
        ],
        outer,
    )
    visit_block(state, fn.body, StatementContext(in_async=isinstance(fn, ast.AsyncFunctionDef)))


def review_handler(state: ReviewState, handler: ast.ExceptHandler) -> None:
    if handler.type is None:
        state.reject(
            handler,
            "try",
            "bare 'except:' would swallow the runtime's suspend "
            "and cancel signals; name the Exception subclasses to handle",
        )
        return
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for node in names:
        if not is_exception_class(state, node):
            state.reject(
                node,
                "try",
                f"'except {ast.unparse(node)}' may swallow the runtime's suspend "
                "and cancel signals; handle Exception or its builtin subclasses "
                "or OperationFailed",
            )


def is_exception_class(state: ReviewState, node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        if node.id in BUILTIN_EXCEPTIONS or (node.id == "OperationFailed" and node.id in state.api):
            return True
        member = state.members.get(node.id)
        return member is not None and is_exception_member(*member)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        module = state.modules.get(node.value.id)
        return module is not None and is_exception_member(module, node.attr)
    return False


def visit_exprs(state: ReviewState, exprs: Iterable[ast.expr], ctx: StatementContext) -> None:
    for expr in exprs:
        visit_expr(state, expr, ctx.in_async)


def visit_expr(state: ReviewState, root: ast.expr, in_async: bool) -> None:
    stack: list[tuple[ast.AST, bool]] = [(root, in_async)]
    while stack:
        node, in_async = stack.pop()
        if isinstance(node, ast.Lambda):
            stack.extend((d, in_async) for d in node.args.defaults)
            stack.extend((d, in_async) for d in node.args.kw_defaults if d is not None)
            stack.append((node.body, False))
            continue
        if isinstance(node, ast.Yield | ast.YieldFrom) and in_async:
            state.reject(
                node,
                "async-generator",
                "'yield' in an async function makes an "
                "async generator, which a workflow may not define; return a list",
            )
        visit_node(state, node)
        stack.extend((child, in_async) for child in ast.iter_child_nodes(node))


def visit_node(state: ReviewState, node: ast.AST) -> None:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        visit_name(state, node)
    elif isinstance(node, ast.Attribute):
        visit_attribute(state, node)
    elif (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
        and is_dunder(node.slice.value)
    ):
        state.reject(
            node,
            "dunder",
            f"subscript {node.slice.value!r} is not allowed "
            "(double-underscore names reach interpreter internals)",
        )
    elif isinstance(node, ast.Call):
        visit_call(state, node)


def visit_name(state: ReviewState, node: ast.Name) -> None:
    name = node.id
    parent = state.parents.get(node)
    if name in FORBIDDEN_NAMES:
        state.reject(
            node,
            "forbidden-name",
            f"'{name}' is not allowed in a workflow ({FORBIDDEN_NAMES[name]})",
        )
    elif is_dunder(name):
        state.reject(
            node,
            "dunder",
            f"name {name!r} is not allowed in a workflow "
            "(double-underscore names reach interpreter internals)",
        )
    elif name in state.modules and not (isinstance(parent, ast.Attribute) and parent.value is node):
        state.reject(
            node,
            "module-member",
            f"use members of {state.modules[name]!r} "
            f"directly ({name}.member), not the module object",
        )
    elif name == state.flow:
        visit_flow_use(state, node, parent)


def visit_attribute(state: ReviewState, node: ast.Attribute) -> None:
    attr = node.attr
    if attr.startswith("__"):
        state.reject(
            node,
            "dunder",
            f"attribute {attr!r} is not allowed in a workflow "
            "(double-underscore names reach interpreter internals)",
        )
    elif attr == "format" and is_literal_string(node.value):
        assert isinstance(node.value, ast.Constant)
        reason = literal_format_refusal(str(node.value.value))
        if reason:
            state.reject(node, "format", reason)
    elif (
        attr in INTROSPECTION_ATTRIBUTES or attr.startswith(INTROSPECTION_PREFIXES)
    ) and not state.input_field(node)[0]:
        # a declared field of the validated launch arguments is a value, never a method
        if attr in ("format", "format_map"):
            state.reject(
                node,
                "format",
                f"'.{attr}()' is not allowed in a workflow (it "
                "reaches attributes by name); use an f-string",
            )
        else:
            state.reject(
                node,
                "introspection",
                f"attribute {attr!r} is not allowed in a "
                "workflow (it reaches frames and code objects)",
            )
    elif isinstance(node.value, ast.Name) and node.value.id in state.modules:
        module = state.modules[node.value.id]
        reason = member_refusal(module, attr)
        if reason:
            state.reject(node, "module-member", f"'{module}.{attr}' {reason}")


def is_literal_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def visit_call(state: ReviewState, node: ast.Call) -> None:
    func = node.func
    if isinstance(func, ast.Name):
        if func.id == "agent" and node not in state.agent_nodes:
            state.reject(
                node,
                "agent",
                "agent(...) is allowed only as a module-level "
                "'NAME = agent(...)' so review can list it",
            )
        elif func.id == "workflow" and not is_workflow_decorator(state, node):
            state.reject(
                node,
                "workflow",
                "workflow(...) is used only as the decorator "
                "of the module's async workflow function",
            )
        elif func.id == "iter" and len(node.args) > 1:
            state.reject(
                node,
                "loop",
                "'iter(callable, sentinel)' may never end (iterate over finite values)",
            )


def is_workflow_decorator(state: ReviewState, node: ast.Call) -> bool:
    parent = state.parents.get(node)
    return parent in state.workflow_candidates
