"""Helpers over :mod:`ast` nodes that every rule group shares: positions, parameters and
the literal values review reads without running anything."""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from typing import TypeGuard

from cairn.protocol.jsonvalue import JSONValue


class Reject(Exception):
    """Internal: one violation found while extracting a literal or an annotation."""

    def __init__(self, node: ast.AST, rule: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.rule = rule
        self.message = message


def position_of(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def param_names(args: ast.arguments) -> list[ast.arg]:
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if args.vararg:
        params.append(args.vararg)
    if args.kwarg:
        params.append(args.kwarg)
    return params


def positional_names(args: ast.arguments) -> list[str]:
    return [a.arg for a in (*args.posonlyargs, *args.args)]


def is_api_call(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def literal(node: ast.expr) -> JSONValue:
    """The value of a literal expression that JSON can carry; anything else is rejected."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Reject(
            node,
            "literal",
            f"{ast.unparse(node)!r} must be a literal "
            "(string, number, bool, None, list or dict of those)",
        ) from None
    if not _is_json(value):
        raise Reject(
            node,
            "literal",
            f"{ast.unparse(node)!r} must be a JSON literal "
            "(string, number, bool, None, list or dict with string keys)",
        )
    return value


def _is_json(value: object) -> TypeGuard[JSONValue]:
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return not math.isnan(value) and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def bound_names(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every node under ``tree`` that binds a name, with the name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            yield node, node.id
        elif isinstance(node, ast.arg):
            yield node, node.arg
        elif isinstance(
            node,
            ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.ExceptHandler
            | ast.MatchAs | ast.MatchStar,
        ) and node.name:
            yield node, node.name
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield node, node.rest
