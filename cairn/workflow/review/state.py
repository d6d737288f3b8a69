"""What one review pass collects: the violations and the facts later rules depend on."""

from __future__ import annotations

import ast
from typing import NamedTuple

from cairn.workflow.review.manifest import AgentEntry, CallSite, Violation, WorkflowEntry
from cairn.workflow.review.nodes import position_of
from cairn.workflow.schema import ModelSpec


class ReviewState:
    """One review over a parsed module; rules record violations here instead of stopping.

    The module-level pass fills in imports, models, agents and the workflow function; the
    statement pass reads them and adds the ``flow.*`` call sites.
    """

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.violations: list[Violation] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        self.modules: dict[str, str] = {}  # local alias -> allowed module
        self.members: dict[str, tuple[str, str]] = {}  # local name -> (module, member)
        self.api: set[str] = set()
        self.models: dict[str, ModelSpec] = {}
        self.agents: dict[str, AgentEntry] = {}
        self.agent_nodes: set[ast.AST] = set()
        self.definitions: set[ast.AST] = set()  # accepted model classes and agent assignments
        self.workflow: WorkflowEntry | None = None
        self.workflow_candidates: set[ast.AST] = set()  # every @workflow(...) async def
        self.flow: str | None = None
        self.functions: dict[str, list[ast.arguments]] = {}
        self.calls: list[CallSite] = []
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(parent.name, []).append(parent.args)

    def reject(self, node: ast.AST, rule: str, message: str) -> None:
        line, col = position_of(node)
        self.violations.append(Violation(line=line, col=col, rule=rule, message=message))


class Context(NamedTuple):
    """Where a statement sits: in an async function, in a finally block, in a loop there."""

    in_async: bool = False
    in_finally: bool = False
    in_loop: bool = False
