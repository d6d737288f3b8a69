"""``while`` with a literal bound (ARCHITECTURE §4.2): a counter set to an int literal
right before the loop, compared with an int literal in its test, raised by a positive int
literal as the first statement of its body and bound nowhere else in the loop, so the loop
ends after at most ``(limit - start) // step + 1`` passes whatever else its body does."""

from __future__ import annotations

import ast

from cairn.workflow.review.nodes import bound_names
from cairn.workflow.review.state import ReviewState

SHAPE = (
    "set a counter to an int right before it ('n = 0'), compare it with an int in the "
    "test ('while n < 5:', alone or in an 'and') and raise it first in the body "
    "('n += 1'); or loop over finite values ('for _ in range(N)', flow.repeat_until)"
)


def while_bound_refusal(state: ReviewState, loop: ast.While) -> str | None:
    """Why ``loop`` has no literal bound, or None when it has one."""
    counters = _compared_counters(loop.test)
    if not counters:
        return f"'while' needs a literal bound: {SHAPE}"
    first = loop.body[0]
    counter = _raised_counter(first)
    if counter is None or counter not in counters:
        return (
            f"'while' with a bound on {', '.join(sorted(counters))} must raise it first in "
            f"its body by a positive int literal ('{min(counters)} += 1'); {SHAPE}"
        )
    if not _set_to_int_before(state, loop, counter):
        return (
            f"'while' with a bound on {counter!r} needs '{counter} = <int>' right before "
            f"it; {SHAPE}"
        )
    assert isinstance(first, ast.AugAssign)
    if any(name == counter and node is not first.target for node, name in bound_names(loop)):
        return f"'while' with a bound on {counter!r} binds {counter!r} again inside the loop"
    return None


def _is_int(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _compared_counters(test: ast.expr) -> set[str]:
    """Names the test compares ``NAME < INT`` or ``NAME <= INT``, alone or as an operand
    of ``and`` (which can only end the loop sooner)."""
    operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) \
        else [test]
    return {
        operand.left.id
        for operand in operands
        if isinstance(operand, ast.Compare)
        and isinstance(operand.left, ast.Name)
        and len(operand.ops) == 1
        and isinstance(operand.ops[0], ast.Lt | ast.LtE)
        and _is_int(operand.comparators[0])
    }


def _raised_counter(stmt: ast.stmt) -> str | None:
    """The name ``stmt`` raises by a positive int literal (``NAME += 1``), if it does."""
    if (
        isinstance(stmt, ast.AugAssign)
        and isinstance(stmt.target, ast.Name)
        and isinstance(stmt.op, ast.Add)
        and isinstance(stmt.value, ast.Constant)
        and type(stmt.value.value) is int
        and stmt.value.value > 0
    ):
        return stmt.target.id
    return None


def _set_to_int_before(state: ReviewState, loop: ast.While, counter: str) -> bool:
    """Whether the statement right before ``loop`` sets ``counter`` to an int literal."""
    parent = state.parents.get(loop)
    blocks = (getattr(parent, field, None) for field in ("body", "orelse", "finalbody"))
    before = next(
        (block[i - 1] for block in blocks if isinstance(block, list)
         for i, stmt in enumerate(block) if stmt is loop and i),
        None,
    )
    if isinstance(before, ast.Assign) and len(before.targets) == 1:
        target, value = before.targets[0], before.value
    elif isinstance(before, ast.AnnAssign) and before.value is not None:
        target, value = before.target, before.value
    else:
        return False
    return isinstance(target, ast.Name) and target.id == counter and _is_int(value)
