"""What one review pass collects: the violations and the facts later rules depend on."""

from __future__ import annotations

import ast
from typing import NamedTuple

from cairn.workflow.review.manifest import AgentEntry, CallSite, Violation, WorkflowEntry
from cairn.workflow.review.nodes import bound_names, position_of
from cairn.workflow.schema import FieldSpec, ModelSpec


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
        self.workflow_node: ast.AsyncFunctionDef | None = None
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

    def str_argument(self, node: ast.expr) -> tuple[str | None, str]:
        """See :class:`cairn.operations.spec.ReviewContext`."""
        field, why = self.input_field(node)
        if field is None:
            return None, why
        if field.type.kind != "str":
            model = self.workflow.input if self.workflow else ""
            return None, f"{model}.{field.name} is {field.type.render()}, not str"
        return field.name, ""

    def input_field(self, node: ast.expr) -> tuple[FieldSpec | None, str]:
        """The declared field of the launch arguments that ``node`` reads: ``args.<field>``
        inside the @workflow function, where the runtime binds ``args`` to the validated
        input model and nothing binds it again; else None and why not."""
        fn, workflow = self.workflow_node, self.workflow
        if fn is None or workflow is None:
            return None, "only the @workflow function reads launch arguments"
        param = [*fn.args.posonlyargs, *fn.args.args][1]
        name = param.arg
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == name
        ):
            return None, f"it is not a field of the launch arguments ({name}.<field>)"
        if not any(ancestor is fn for ancestor in self.ancestors(node)):
            return None, f"it is outside the @workflow function that takes {name!r}"
        if any(bound == name and n is not param for n, bound in bound_names(fn)):
            return None, f"{name!r} is bound again in the @workflow function"
        model = self.models.get(workflow.input)
        field = next((f for f in model.fields if f.name == node.attr), None) if model else None
        if field is None:
            return None, f"{workflow.input} has no field {node.attr!r}"
        return field, ""

    def ancestors(self, node: ast.AST) -> list[ast.AST]:
        found: list[ast.AST] = []
        parent = self.parents.get(node)
        while parent is not None:
            found.append(parent)
            parent = self.parents.get(parent)
        return found


class StatementContext(NamedTuple):
    """Where a statement sits: in an async function, in a finally block, in a loop there."""

    in_async: bool = False
    in_finally: bool = False
    in_loop: bool = False
