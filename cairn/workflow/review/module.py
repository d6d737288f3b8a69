"""The module-level pass: imports, and which top-level statement is a model, an agent
descriptor or the ``@workflow`` function."""

from __future__ import annotations

import ast
import re

from cairn.pathrules import is_plain_relative
from cairn.settle.paths import glob_regex
from cairn.workflow.review.agents import review_agent
from cairn.workflow.review.manifest import WorkflowEntry
from cairn.workflow.review.model_classes import review_model_class
from cairn.workflow.review.nodes import is_api_call, positional_names
from cairn.workflow.review.state import ReviewState
from cairn.workflow.review.subset import API_NAMES, PURE_MODULES, member_refusal


def review_module_level(state: ReviewState) -> None:
    """Imports, model classes, agent descriptors and the one ``@workflow`` function."""
    workflows: list[ast.AsyncFunctionDef] = []
    for stmt in state.tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            review_import(state, stmt)
        elif isinstance(stmt, ast.ClassDef):
            review_model_class(state, stmt)
        elif isinstance(stmt, ast.Assign) and is_api_call(stmt.value, "agent"):
            review_agent(state, stmt)
        elif (
            isinstance(stmt, ast.AsyncFunctionDef)
            and stmt.decorator_list
            and review_workflow_function(state, stmt)
        ):
            workflows.append(stmt)
    for node in ast.walk(state.tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and node not in state.tree.body:
            state.reject(node, "import", "imports belong at the top level of the module")
    if not workflows:
        state.reject(
            state.tree,
            "workflow",
            "the module defines no @workflow(...) async function; add exactly one",
        )
    elif len(workflows) > 1:
        state.reject(
            workflows[1],
            "workflow",
            "a module defines exactly one @workflow function; move this one to its own file",
        )


def review_import(state: ReviewState, stmt: ast.Import | ast.ImportFrom) -> None:
    """Admit ``cairn.workflow`` names, ``__future__.annotations`` and pure modules."""
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.name in PURE_MODULES:
                state.modules[alias.asname or alias.name] = alias.name
            elif alias.name.startswith("cairn"):
                state.reject(
                    stmt,
                    "import",
                    "import the workflow API as 'from cairn.workflow import "
                    "agent, workflow, Field, Model'",
                )
            else:
                reject_module(state, stmt, alias.name)
        return
    module = stmt.module or ""
    if stmt.level:
        state.reject(stmt, "import", "relative imports are not allowed in a workflow")
    elif module == "__future__":
        for alias in stmt.names:
            if alias.name != "annotations":
                state.reject(
                    stmt,
                    "import",
                    f"'from __future__ import {alias.name}' is not allowed; only 'annotations' is",
                )
    elif module == "cairn.workflow":
        for alias in stmt.names:
            if alias.name not in API_NAMES:
                state.reject(
                    stmt,
                    "import",
                    f"cairn.workflow exports no {alias.name!r} to workflows; "
                    f"use {', '.join(sorted(API_NAMES))}",
                )
            elif alias.asname and alias.asname != alias.name:
                state.reject(
                    stmt,
                    "import",
                    f"import {alias.name!r} under its own name, not {alias.asname!r}",
                )
            else:
                state.api.add(alias.name)
    elif module in PURE_MODULES:
        for alias in stmt.names:
            reason = member_refusal(module, alias.name)
            if reason:
                state.reject(stmt, "module-member", f"'{module}.{alias.name}' {reason}")
            else:
                state.members[alias.asname or alias.name] = (module, alias.name)
    else:
        reject_module(state, stmt, module)


def reject_module(state: ReviewState, node: ast.AST, module: str) -> None:
    state.reject(
        node,
        "import",
        f"module {module!r} may not be imported in a workflow (allowed: "
        f"cairn.workflow, {', '.join(sorted(PURE_MODULES))}); reach the "
        "outside through flow.* calls",
    )


def review_workflow_function(state: ReviewState, fn: ast.AsyncFunctionDef) -> bool:
    """Record the ``@workflow(...)`` function; False when ``fn`` is not one."""
    decorator = fn.decorator_list[0]
    if len(fn.decorator_list) != 1 or not is_api_call(decorator, "workflow"):
        return False  # reported by review_statements as a decorator
    assert isinstance(decorator, ast.Call)
    state.workflow_candidates.add(fn)
    if state.workflow_candidates != {fn}:
        return True  # a second workflow; reported by the caller
    if "workflow" not in state.api:
        state.reject(fn, "workflow", "import workflow from cairn.workflow before using it")
    args = fn.args
    if (
        len(args.posonlyargs) + len(args.args) != 2
        or args.vararg
        or args.kwarg
        or args.kwonlyargs
        or args.defaults
    ):
        state.reject(
            fn,
            "workflow",
            f"the workflow function must take exactly "
            f"(flow, args): 'async def {fn.name}(flow, args: Input)'",
        )
        return True
    values: dict[str, str] = {}
    write_paths: list[str] | None = None
    for kw in decorator.keywords:
        if kw.arg == "write_paths":
            write_paths, problem = write_paths_of(kw.value)
            if problem:
                state.reject(kw.value, "workflow", problem)
                return True
        elif kw.arg == "description":
            if not (
                isinstance(kw.value, ast.Constant)
                and isinstance(kw.value.value, str)
                and kw.value.value.strip()
            ):
                state.reject(
                    kw.value, "workflow", "description= must be a non-empty string literal"
                )
                return True
            values["description"] = kw.value.value
        elif kw.arg in ("input", "output"):
            if not (isinstance(kw.value, ast.Name) and kw.value.id in state.models):
                state.reject(
                    kw.value,
                    "workflow",
                    f"{kw.arg}= must name a Model class defined above in this module",
                )
                return True
            values[kw.arg] = kw.value.id
        else:
            state.reject(
                kw.value if kw.arg is None else kw,
                "workflow",
                f"@workflow takes description, input, output and write_paths, "
                f"not {kw.arg or '**'}",
            )
            return True
    if decorator.args or set(values) != {"description", "input", "output"}:
        state.reject(
            decorator,
            "workflow",
            "@workflow needs keyword arguments description=, input= and output=",
        )
        return True
    state.workflow = WorkflowEntry(function=fn.name, write_paths=write_paths, **values)
    state.flow = positional_names(args)[0]
    state.workflow_node = fn
    return True


MAX_WRITE_PATHS = 64


def write_paths_of(node: ast.expr) -> tuple[list[str] | None, str]:
    """``write_paths=`` of ``@workflow``: a literal list or tuple of project-relative globs
    (``*``, ``?``, ``[…]`` within a segment, ``**`` for any depth). Returns the globs, or
    the reason they are refused."""
    usage = "write_paths= must be a literal list of project-relative globs, e.g. ['src/**']"
    if not isinstance(node, ast.List | ast.Tuple) or not node.elts:
        return None, usage
    if len(node.elts) > MAX_WRITE_PATHS:
        return None, f"write_paths= takes at most {MAX_WRITE_PATHS} globs"
    globs: list[str] = []
    for element in node.elts:
        if not (isinstance(element, ast.Constant) and isinstance(element.value, str)):
            return None, usage
        glob = element.value
        if len(glob) > 256 or "\\" in glob or not is_plain_relative(glob):
            return None, f"write_paths= glob {glob!r} is not a normalized path inside the project"
        try:
            glob_regex(glob)
        except re.error as exc:
            return None, f"write_paths= glob {glob!r} is not a valid glob: {exc.msg}"
        globs.append(glob)
    return globs, ""
