"""Static review of a workflow module (ARCHITECTURE §4.2).

:func:`review_source` parses the source with :mod:`ast`; it never imports or executes it.
It rejects everything outside the workflow subset, extracts the typed models and agent
descriptors, lists every ``flow.*`` call site with the capabilities it needs (the effect
manifest) and computes the ``review_hash`` a person confirms before installing.

Decisions that the rules below encode:

- Imports: ``from cairn.workflow import ...`` (``agent``, ``workflow``, ``Field``, ``Model``,
  ``OperationFailed``, under their own names), ``from __future__ import annotations``, and
  the pure modules in :data:`PURE_MODULES`. ``datetime``, ``time``, ``random``,
  ``statistics`` (``NormalDist.samples`` draws random numbers) and every module with I/O,
  threads or an event loop are refused. A pure module is used through its public members
  only (``math.sqrt``), never as an object, and members that are modules, private, able to
  evaluate strings or endless (``itertools.count``) are refused.
- Loops: ``for`` over finite values only. ``while`` is refused outright: no form of it has
  a bound that review can see, and ``for _ in range(N)`` or ``flow.repeat_until`` say the
  same thing with the bound in plain sight.
- ``try``: handlers may name only classes known to derive from ``Exception`` (builtin
  ones, exceptions of the allowed modules, ``OperationFailed``), so the runtime's suspend
  and cancel signals (``BaseException``) always pass through; ``finally`` may not
  ``return``/``break``/``continue``, which would swallow them too.
- Decorators: only ``@workflow(...)`` on the workflow function; classes: only
  module-level ``class X(Model)`` with fields from the closed annotation set.
- The ``flow`` object (the workflow function's first parameter) is used only as
  ``flow.<operation>(...)`` or passed to a function of the module whose parameter has the
  same name, so every call site is visible here.
- The hash covers the runtime API version, the source and the manifest, not the
  filename: the same reviewed text keeps its confirmation wherever it is installed
  (``user:``, ``project:``, a draft path); the install step records the name separately.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import json
import logging
import re
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from cairn.errors import ReviewError
from cairn.workflow import ACCESS_MODES, NETWORK_MODES, RUNTIME_API_VERSION
from cairn.workflow.schema import (
    FIELD_CONSTRAINTS,
    FIELD_DOC_KEYWORDS,
    LENGTH_CONSTRAINTS,
    NUMBER_CONSTRAINTS,
    TEXT_CONSTRAINTS,
    FieldSpec,
    ModelSpec,
    TypeSpec,
)

log = logging.getLogger(__name__)

PURE_MODULES = frozenset(
    {
        "collections",
        "decimal",
        "fractions",
        "functools",
        "itertools",
        "json",
        "math",
        "re",
        "string",
        "textwrap",
        "typing",
    }
)

TYPING_MEMBERS = frozenset(
    {
        "Any",
        "Awaitable",
        "Callable",
        "Coroutine",
        "Final",
        "Iterable",
        "Iterator",
        "Literal",
        "Mapping",
        "Optional",
        "Sequence",
        "Union",
        "cast",
    }
)

DENIED_MEMBERS: dict[tuple[str, str], str] = {
    ("itertools", "count"): "it never ends (iterate over finite values)",
    ("itertools", "cycle"): "it never ends (iterate over finite values)",
    ("itertools", "repeat"): "it may never end (iterate over finite values)",
    ("string", "Formatter"): "it reaches attributes by name (use an f-string)",
}

API_NAMES = frozenset({"agent", "workflow", "Field", "Model", "OperationFailed"})

FORBIDDEN_NAMES: dict[str, str] = {
    name: "workflows reach the outside only through flow.* calls"
    for name in ("open", "input", "print", "breakpoint", "help", "exit", "quit")
}
FORBIDDEN_NAMES.update(
    {
        name: "workflows may not run code built from strings"
        for name in ("eval", "exec", "compile", "__import__")
    }
)
FORBIDDEN_NAMES.update(
    {
        name: "attributes and namespaces are reached only by plain names"
        for name in ("getattr", "setattr", "delattr", "hasattr", "globals", "locals", "vars", "dir")
    }
)
FORBIDDEN_NAMES.update(
    {
        name: "workflows define only Model classes and plain functions"
        for name in (
            "type",
            "object",
            "super",
            "classmethod",
            "staticmethod",
            "property",
            "memoryview",
        )
    }
)
FORBIDDEN_NAMES["id"] = "its value differs between replays"

INTROSPECTION_ATTRIBUTES = frozenset(
    {
        "f_back",
        "f_builtins",
        "f_code",
        "f_globals",
        "f_locals",
        "f_trace",
        "format",
        "format_map",
        "mro",
    }
)
INTROSPECTION_PREFIXES = ("cr_", "gi_", "ag_", "tb_", "co_")

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

FIELD_NAME_RESERVED = frozenset(dir(BaseModel))
PROFILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._/-]{0,199}$")
DOMAIN_RE = re.compile(
    r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*(:[0-9]{1,5})?$"
)
MAX_REPORTED = 3

BUILTIN_EXCEPTIONS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception)
)
BUILTIN_BASE_EXCEPTIONS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Violation(_Frozen):
    """One rule broken at one place (``col`` is 1-based)."""

    line: int
    col: int
    rule: str
    message: str

    def render(self, filename: str) -> str:
        """``file:line:col: message [rule]``."""
        return f"{filename}:{self.line}:{self.col}: {self.message} [{self.rule}]"


class ReviewRejected(ReviewError):
    """Review refused a workflow; ``violations`` lists every reason, in source order."""

    def __init__(self, filename: str, violations: list[Violation]) -> None:
        shown = "; ".join(v.render(filename) for v in violations[:MAX_REPORTED])
        more = len(violations) - MAX_REPORTED
        if more > 0:
            shown += f" (and {more} more)"
        super().__init__(shown, hint="fix the workflow source and run the review again")
        self.filename = filename
        self.violations = violations


class WorkflowEntry(_Frozen):
    """The ``@workflow`` function: its name, description and input/output model names."""

    function: str
    description: str
    input: str
    output: str


class AgentEntry(_Frozen):
    """One module-level agent descriptor, as written."""

    profile: str
    access: Literal["read", "write"]
    network: Literal["none", "allowlist", "host"]
    output: str
    allowlist: tuple[str, ...] = ()


class CallSite(_Frozen):
    """One ``flow.*`` call: where it is, what it calls and what it needs.

    ``line``/``col`` (1-based) are the start of the call expression, i.e. of ``flow``.
    ``answer_schema`` names the answer model of ``flow.ask(..., schema=X)``.
    """

    kind: str
    line: int
    col: int
    descriptor: str | None = None
    answer_schema: str | None = None
    capabilities: list[str] = []


class Review(_Frozen):
    """The result of a passed review: the effect manifest and its hash."""

    api_version: str
    filename: str
    source_sha256: str
    workflow: WorkflowEntry
    agents: dict[str, AgentEntry]
    models: dict[str, ModelSpec]
    calls: list[CallSite]
    capabilities: list[str]
    review_hash: str

    def manifest(self) -> dict[str, Any]:
        """Everything the hash covers besides the source and the API version."""
        return _manifest(self.workflow, self.agents, self.models, self.calls, self.capabilities)


def review_source(source: str, *, filename: str) -> Review:
    """Review ``source`` statically; raise :class:`ReviewRejected` listing every violation."""
    try:
        tree = ast.parse(source, filename=filename, type_comments=False)
    except SyntaxError as exc:
        violation = Violation(
            line=exc.lineno or 1,
            col=exc.offset or 1,
            rule="syntax",
            message=f"not valid Python: {exc.msg}",
        )
        raise ReviewRejected(filename, [violation]) from None
    reviewer = _Reviewer(tree)
    reviewer.run()
    if reviewer.violations:
        violations = sorted(reviewer.violations, key=lambda v: (v.line, v.col, v.rule))
        raise ReviewRejected(filename, violations)
    assert reviewer.workflow is not None  # a missing workflow is a violation above
    calls = reviewer.calls
    capabilities = sorted({c for call in calls for c in call.capabilities})
    manifest = _manifest(reviewer.workflow, reviewer.agents, reviewer.models, calls, capabilities)
    review_hash = compute_review_hash(source, manifest)
    review = Review(
        api_version=RUNTIME_API_VERSION,
        filename=filename,
        source_sha256=hashlib.sha256(source.encode()).hexdigest(),
        workflow=reviewer.workflow,
        agents=reviewer.agents,
        models=reviewer.models,
        calls=calls,
        capabilities=capabilities,
        review_hash=review_hash,
    )
    log.debug("reviewed %s: %d calls, hash %s", filename, len(calls), review_hash)
    return review


def compute_review_hash(source: str, manifest: dict[str, Any]) -> str:
    """``sha256:`` over the canonical JSON of the API version, the source and the manifest."""
    document = {"api_version": RUNTIME_API_VERSION, "source": source, "manifest": manifest}
    return "sha256:" + hashlib.sha256(canonical_json(document).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 text: the form every Cairn hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def render_review(review: Review) -> str:
    """The text ``cairn workflow review FILE`` prints; the hash is the last line."""
    wf = review.workflow
    lines = [
        f"workflow      {wf.function}  ({review.filename})",
        f"description   {wf.description}",
        f"api           {review.api_version}",
        f"input         {wf.input}",
        *_render_fields(review.models, wf.input),
        f"output        {wf.output}",
        *_render_fields(review.models, wf.output),
    ]
    lines.append("agents" if review.agents else "agents        (none)")
    for name, entry in sorted(review.agents.items()):
        text = (
            f"  {name}  profile={entry.profile} access={entry.access} "
            f"network={entry.network} output={entry.output}"
        )
        if entry.allowlist:
            text += " allowlist=" + ",".join(entry.allowlist)
        lines.append(text)
    lines.append("calls" if review.calls else "calls         (none)")
    width = max((len(str(c.line)) for c in review.calls), default=1)
    kind_width = max((len(c.kind) for c in review.calls), default=1)
    for call in review.calls:
        target = call.descriptor or call.answer_schema or "-"
        lines.append(
            f"  line {call.line:<{width}}  {call.kind:<{kind_width}}  {target}  "
            f"[{', '.join(call.capabilities)}]"
        )
    lines.append("capabilities  " + (", ".join(review.capabilities) or "(none)"))
    lines.append(f"review_hash: {review.review_hash}")
    return "\n".join(lines)


def _render_fields(models: dict[str, ModelSpec], name: str) -> list[str]:
    spec = models.get(name)
    return [f"  {field.render()}" for field in spec.fields] if spec else []


def _manifest(
    workflow: WorkflowEntry,
    agents: dict[str, AgentEntry],
    models: dict[str, ModelSpec],
    calls: list[CallSite],
    capabilities: list[str],
) -> dict[str, Any]:
    return {
        "workflow": workflow.model_dump(mode="json"),
        "agents": {k: v.model_dump(mode="json") for k, v in agents.items()},
        "models": {k: v.model_dump(mode="json") for k, v in models.items()},
        "calls": [c.model_dump(mode="json") for c in calls],
        "capabilities": list(capabilities),
    }


class _Reject(Exception):
    """Internal: one violation found while extracting a literal or an annotation."""

    def __init__(self, node: ast.AST, rule: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.rule = rule
        self.message = message


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _param_names(args: ast.arguments) -> list[ast.arg]:
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if args.vararg:
        params.append(args.vararg)
    if args.kwarg:
        params.append(args.kwarg)
    return params


def _positional_names(args: ast.arguments) -> list[str]:
    return [a.arg for a in (*args.posonlyargs, *args.args)]


class _Context(NamedTuple):
    """Where a statement sits: in an async function, in a finally block, in a loop there."""

    in_async: bool = False
    in_finally: bool = False
    in_loop: bool = False


class _Reviewer:
    """One review pass over a parsed module; collects violations instead of stopping."""

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

    def reject(self, node: ast.AST, rule: str, message: str) -> None:
        line, col = _position(node)
        self.violations.append(Violation(line=line, col=col, rule=rule, message=message))

    def run(self) -> None:
        for parent in ast.walk(self.tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(parent.name, []).append(parent.args)
        self.review_module_level()
        self.review_bindings()
        self.review_statements()
        self.calls.sort(key=lambda c: (c.line, c.col))

    # -- module level: imports, models, agents, the workflow function -------------------

    def review_module_level(self) -> None:
        workflows: list[ast.AsyncFunctionDef] = []
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                self.review_import(stmt)
            elif isinstance(stmt, ast.ClassDef):
                self.review_model_class(stmt)
            elif isinstance(stmt, ast.Assign) and self.is_api_call(stmt.value, "agent"):
                self.review_agent(stmt)
            elif isinstance(stmt, ast.AsyncFunctionDef) and stmt.decorator_list:
                if self.review_workflow_function(stmt):
                    workflows.append(stmt)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and node not in self.tree.body:
                self.reject(node, "import", "imports belong at the top level of the module")
        if not workflows:
            self.reject(
                self.tree,
                "workflow",
                "the module defines no @workflow(...) async function; add exactly one",
            )
        elif len(workflows) > 1:
            self.reject(
                workflows[1],
                "workflow",
                "a module defines exactly one @workflow function; move this one to its own file",
            )

    def review_import(self, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name in PURE_MODULES:
                    self.modules[alias.asname or alias.name] = alias.name
                elif alias.name.startswith("cairn"):
                    self.reject(
                        stmt,
                        "import",
                        "import the workflow API as 'from cairn.workflow import "
                        "agent, workflow, Field, Model'",
                    )
                else:
                    self.reject_module(stmt, alias.name)
            return
        module = stmt.module or ""
        if stmt.level:
            self.reject(stmt, "import", "relative imports are not allowed in a workflow")
        elif module == "__future__":
            for alias in stmt.names:
                if alias.name != "annotations":
                    self.reject(
                        stmt,
                        "import",
                        f"'from __future__ import {alias.name}' is not allowed; "
                        "only 'annotations' is",
                    )
        elif module == "cairn.workflow":
            for alias in stmt.names:
                if alias.name not in API_NAMES:
                    self.reject(
                        stmt,
                        "import",
                        f"cairn.workflow exports no {alias.name!r} to workflows; "
                        f"use {', '.join(sorted(API_NAMES))}",
                    )
                elif alias.asname and alias.asname != alias.name:
                    self.reject(
                        stmt,
                        "import",
                        f"import {alias.name!r} under its own name, not {alias.asname!r}",
                    )
                else:
                    self.api.add(alias.name)
        elif module in PURE_MODULES:
            for alias in stmt.names:
                reason = _member_refusal(module, alias.name)
                if reason:
                    self.reject(stmt, "module-member", f"'{module}.{alias.name}' {reason}")
                else:
                    self.members[alias.asname or alias.name] = (module, alias.name)
        else:
            self.reject_module(stmt, module)

    def reject_module(self, node: ast.AST, module: str) -> None:
        self.reject(
            node,
            "import",
            f"module {module!r} may not be imported in a workflow (allowed: "
            f"cairn.workflow, {', '.join(sorted(PURE_MODULES))}); reach the "
            "outside through flow.* calls",
        )

    def is_api_call(self, node: ast.AST | None, name: str) -> bool:
        return (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
        )

    def review_model_class(self, cls: ast.ClassDef) -> None:
        if (
            len(cls.bases) != 1
            or not isinstance(cls.bases[0], ast.Name)
            or cls.bases[0].id != "Model"
            or cls.keywords
            or cls.decorator_list
        ):
            self.reject(
                cls,
                "class",
                f"class {cls.name!r} must be a plain 'class {cls.name}(Model)': "
                "workflows define only Model classes, without decorators, "
                "keywords or other bases",
            )
            return
        if "Model" not in self.api:
            self.reject(cls, "class", "import Model from cairn.workflow before using it")
        if cls.name in self.models or cls.name in self.agents:
            self.reject(cls, "rebind", f"{cls.name!r} is defined twice; use one name once")
            return
        doc = ast.get_docstring(cls, clean=True)
        body = cls.body[1:] if doc is not None else cls.body
        fields: list[FieldSpec] = []
        for stmt in body:
            try:
                fields.append(self.extract_field(cls.name, stmt))
            except _Reject as exc:
                self.reject(exc.node, exc.rule, exc.message)
        self.definitions.add(cls)
        self.models[cls.name] = ModelSpec(name=cls.name, doc=doc, fields=tuple(fields))

    def extract_field(self, model: str, stmt: ast.stmt) -> FieldSpec:
        if not (
            isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.simple
        ):
            raise _Reject(
                stmt,
                "model-body",
                f"a Model body holds only its docstring and 'name: type = "
                f"default' fields; remove this statement from {model!r}",
            )
        name = stmt.target.id
        if name.startswith("_") or name.startswith("model_") or name in FIELD_NAME_RESERVED:
            raise _Reject(
                stmt, "model-field", f"field name {name!r} is reserved by pydantic; rename it"
            )
        type_spec = self.extract_type(stmt.annotation, model)
        spec: dict[str, Any] = {"name": name, "type": type_spec}
        value = stmt.value
        if value is None:
            pass
        elif self.is_api_call(value, "Field"):
            assert isinstance(value, ast.Call)
            spec.update(self.extract_field_call(value))
        else:
            spec["has_default"] = True
            spec["default"] = _literal(value)
        field = FieldSpec(**spec)
        self.check_constraints(stmt, field)
        return field

    def extract_field_call(self, call: ast.Call) -> dict[str, Any]:
        out: dict[str, Any] = {}
        constraints: dict[str, Any] = {}
        if len(call.args) > 1 or any(isinstance(a, ast.Starred) for a in call.args):
            raise _Reject(
                call, "model-field", "Field() takes at most one positional argument, the default"
            )
        if call.args:
            out["has_default"] = True
            out["default"] = _literal(call.args[0])
        renamed = {
            "min_items": "min_length",
            "max_items": "max_length",
            "regex": "pattern",
            "const": "Literal[...]",
        }
        for kw in call.keywords:
            if kw.arg is None:
                raise _Reject(
                    kw.value, "model-field", "Field(**...) is not allowed; write each keyword"
                )
            if kw.arg in renamed:
                raise _Reject(
                    kw.value,
                    "model-field",
                    f"Field({kw.arg}=) is pydantic v1; use {renamed[kw.arg]}",
                )
            if kw.arg == "default":
                out["has_default"] = True
                out["default"] = _literal(kw.value)
            elif kw.arg in FIELD_CONSTRAINTS:
                value = _literal(kw.value)
                valid = (
                    isinstance(value, str)
                    if kw.arg in TEXT_CONSTRAINTS
                    else isinstance(value, int | float) and not isinstance(value, bool)
                )
                if not valid:
                    raise _Reject(
                        kw.value,
                        "model-field",
                        f"Field({kw.arg}=) needs a literal "
                        f"{'string' if kw.arg in TEXT_CONSTRAINTS else 'number'}",
                    )
                if kw.arg == "pattern":
                    try:
                        re.compile(str(value))
                    except re.error as exc:
                        raise _Reject(
                            kw.value, "model-field", f"Field(pattern=) is not a valid regex: {exc}"
                        ) from None
                constraints[kw.arg] = value
            elif kw.arg in FIELD_DOC_KEYWORDS:
                value = _literal(kw.value)
                if not isinstance(value, str):
                    raise _Reject(kw.value, "model-field", f"Field({kw.arg}=) needs a string")
                out[kw.arg] = value
            else:
                allowed = ", ".join(("default", *FIELD_CONSTRAINTS, *FIELD_DOC_KEYWORDS))
                raise _Reject(
                    kw.value,
                    "model-field",
                    f"Field({kw.arg}=) is not supported in a workflow; use {allowed}",
                )
        out["constraints"] = constraints
        return out

    def check_constraints(self, node: ast.AST, field: FieldSpec) -> None:
        base = field.type
        while base.kind == "optional" and base.item is not None:
            base = base.item
        for key in field.constraints:
            if key in LENGTH_CONSTRAINTS:
                fits = base.kind in ("str", "list", "dict")
            elif key in NUMBER_CONSTRAINTS:
                fits = base.kind in ("int", "float")
            else:
                fits = base.kind == "str"
            if not fits:
                raise _Reject(
                    node,
                    "model-field",
                    f"Field({key}=) does not apply to {base.render()!r}; "
                    "drop it or change the type",
                )

    def extract_type(self, node: ast.expr, model: str) -> TypeSpec:
        closed_set = (
            "str, int, float, bool, list[T], dict[str, T], T | None, Optional[T], "
            "Literal[...] or a Model declared above"
        )
        if isinstance(node, ast.Name):
            if node.id in ("str", "int", "float", "bool"):
                return TypeSpec(kind=node.id)  # type: ignore[arg-type]
            if node.id in self.models:
                return TypeSpec(kind="model", model=node.id)
            if node.id == model:
                raise _Reject(node, "model-type", f"{model!r} may not contain itself")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            for inner, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(other, ast.Constant) and other.value is None:
                    return TypeSpec(kind="optional", item=self.extract_type(inner, model))
        if isinstance(node, ast.Subscript):
            head = self.typing_name(node.value)
            if head == "list":
                return TypeSpec(kind="list", item=self.extract_type(node.slice, model))
            if head == "dict" and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2:
                key, value = node.slice.elts
                if isinstance(key, ast.Name) and key.id == "str":
                    return TypeSpec(kind="dict", item=self.extract_type(value, model))
                raise _Reject(key, "model-type", "dict keys must be str (JSON objects)")
            if head == "Optional":
                return TypeSpec(kind="optional", item=self.extract_type(node.slice, model))
            if head == "Literal":
                elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                values = []
                for elt in elts:
                    value = _literal(elt)
                    if not (value is None or isinstance(value, str | int | bool)):
                        raise _Reject(
                            elt,
                            "model-type",
                            "Literal[...] values are strings, ints, bools or None",
                        )
                    values.append(value)
                return TypeSpec(kind="literal", values=tuple(values))
        raise _Reject(
            node,
            "model-type",
            f"annotation {ast.unparse(node)!r} is outside the workflow type set ({closed_set})",
        )

    def typing_name(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            if node.id in ("list", "dict"):
                return node.id
            member = self.members.get(node.id)
            if member and member[0] == "typing":
                return member[1]
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and self.modules.get(node.value.id) == "typing"
        ):
            return node.attr
        return None

    def review_agent(self, stmt: ast.Assign) -> None:
        call = stmt.value
        assert isinstance(call, ast.Call)
        self.agent_nodes.add(call)
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            self.reject(stmt, "agent", "assign each agent(...) to exactly one plain name")
            return
        name = stmt.targets[0].id
        if name in self.agents or name in self.models:
            self.reject(stmt, "rebind", f"{name!r} is defined twice; use one name once")
            return
        if "agent" not in self.api:
            self.reject(stmt, "agent", "import agent from cairn.workflow before using it")
        if call.args:
            self.reject(call, "agent", "agent(...) takes keyword arguments only")
            return
        values: dict[str, Any] = {}
        for kw in call.keywords:
            try:
                if kw.arg == "output":
                    if not (isinstance(kw.value, ast.Name) and kw.value.id in self.models):
                        raise _Reject(
                            kw.value,
                            "agent",
                            "agent output= must name a Model class defined above in this module",
                        )
                    values["output"] = kw.value.id
                elif kw.arg in ("profile", "access", "network"):
                    values[kw.arg] = _literal(kw.value)
                elif kw.arg == "allowlist":
                    if not isinstance(kw.value, ast.Tuple | ast.List):
                        raise _Reject(
                            kw.value, "agent", "allowlist= must be a literal tuple of domains"
                        )
                    values["allowlist"] = tuple(_literal(e) for e in kw.value.elts)
                else:
                    raise _Reject(
                        kw.value if kw.arg is None else kw,
                        "agent",
                        f"agent() takes profile, access, network, output and "
                        f"allowlist, not {kw.arg or '**'}",
                    )
            except _Reject as exc:
                self.reject(exc.node, exc.rule, exc.message)
                return
        problem = _agent_problem(values)
        if problem:
            self.reject(call, "agent", problem)
            return
        self.definitions.add(stmt)
        self.agents[name] = AgentEntry(**values)

    def review_workflow_function(self, fn: ast.AsyncFunctionDef) -> bool:
        decorator = fn.decorator_list[0]
        if len(fn.decorator_list) != 1 or not self.is_api_call(decorator, "workflow"):
            return False  # reported by review_statements as a decorator
        assert isinstance(decorator, ast.Call)
        self.workflow_candidates.add(fn)
        if self.workflow_candidates != {fn}:
            return True  # a second workflow; reported by the caller
        if "workflow" not in self.api:
            self.reject(fn, "workflow", "import workflow from cairn.workflow before using it")
        args = fn.args
        if (
            len(args.posonlyargs) + len(args.args) != 2
            or args.vararg
            or args.kwarg
            or args.kwonlyargs
            or args.defaults
        ):
            self.reject(
                fn,
                "workflow",
                f"the workflow function must take exactly "
                f"(flow, args): 'async def {fn.name}(flow, args: Input)'",
            )
            return True
        values: dict[str, str] = {}
        for kw in decorator.keywords:
            if kw.arg == "description":
                if not (
                    isinstance(kw.value, ast.Constant)
                    and isinstance(kw.value.value, str)
                    and kw.value.value.strip()
                ):
                    self.reject(
                        kw.value, "workflow", "description= must be a non-empty string literal"
                    )
                    return True
                values["description"] = kw.value.value
            elif kw.arg in ("input", "output"):
                if not (isinstance(kw.value, ast.Name) and kw.value.id in self.models):
                    self.reject(
                        kw.value,
                        "workflow",
                        f"{kw.arg}= must name a Model class defined above in this module",
                    )
                    return True
                values[kw.arg] = kw.value.id
            else:
                self.reject(
                    kw.value if kw.arg is None else kw,
                    "workflow",
                    f"@workflow takes description, input and output, not {kw.arg or '**'}",
                )
                return True
        if decorator.args or set(values) != {"description", "input", "output"}:
            self.reject(
                decorator,
                "workflow",
                "@workflow needs keyword arguments description=, input= and output=",
            )
            return True
        self.workflow = WorkflowEntry(function=fn.name, **values)
        self.flow = _positional_names(args)[0]
        return True

    # -- names: nothing reserved is rebound ---------------------------------------------

    def review_bindings(self) -> None:
        reserved: dict[str, str] = {}
        for name in self.api:
            reserved[name] = "a cairn.workflow name"
        for name in (*self.modules, *self.members):
            reserved[name] = "an imported name"
        for name in self.models:
            reserved[name] = "a Model class"
        for name in self.agents:
            reserved[name] = "an agent descriptor"
        for name in BUILTIN_BASE_EXCEPTIONS:
            reserved[name] = "a builtin exception"
        for node, name in self.bound_names():
            if node in self.definitions or self.parents.get(node) in self.definitions:
                continue
            if name == self.flow and not isinstance(node, ast.arg):
                self.reject(
                    node,
                    "flow",
                    f"{name!r} is the flow object; bind it only as a function parameter",
                )
            elif name in reserved:
                self.reject(node, "rebind", f"{name!r} is {reserved[name]}; choose another name")
            if _is_dunder(name):
                self.reject(
                    node,
                    "dunder",
                    f"name {name!r} is not allowed in a workflow "
                    "(double-underscore names reach interpreter internals)",
                )

    def bound_names(self) -> Iterator[tuple[ast.AST, str]]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                yield node, node.id
            elif isinstance(node, ast.arg):
                yield node, node.arg
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield node, node.name
            elif isinstance(node, ast.ClassDef):
                yield node, node.name
            elif isinstance(node, ast.ExceptHandler) and node.name:
                yield node, node.name
            elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
                yield node, node.name
            elif isinstance(node, ast.MatchMapping) and node.rest:
                yield node, node.rest

    # -- every statement and expression --------------------------------------------------

    def review_statements(self) -> None:
        self.visit_block(self.tree.body, _Context())

    def visit_block(self, body: Iterable[ast.stmt], ctx: _Context) -> None:
        for stmt in body:
            self.visit_stmt(stmt, ctx)

    def visit_stmt(self, stmt: ast.stmt, ctx: _Context) -> None:
        if isinstance(stmt, ast.While):
            self.reject(
                stmt,
                "while",
                "'while' is not allowed in a workflow (loop over "
                "finite values: 'for _ in range(N)' or flow.repeat_until)",
            )
        elif isinstance(stmt, ast.Global | ast.Nonlocal):
            word = "global" if isinstance(stmt, ast.Global) else "nonlocal"
            self.reject(
                stmt,
                "scope",
                f"'{word}' is not allowed in a workflow (return "
                "values instead of rebinding outer names)",
            )
        elif isinstance(stmt, ast.AsyncFor | ast.AsyncWith):
            word = "async for" if isinstance(stmt, ast.AsyncFor) else "async with"
            self.reject(
                stmt,
                "async",
                f"'{word}' is not allowed in a workflow (await flow.* calls directly)",
            )
        elif (isinstance(stmt, ast.Return) and ctx.in_finally) or (
            isinstance(stmt, ast.Break | ast.Continue) and ctx.in_finally and not ctx.in_loop
        ):
            self.reject(
                stmt,
                "try",
                "'finally' may not return, break or continue: that "
                "would swallow the runtime's suspend and cancel signals",
            )
        elif isinstance(stmt, ast.ClassDef):
            if self.parents.get(stmt) is not self.tree:
                self.reject(
                    stmt, "class", "classes are defined only at module level, as 'class X(Model)'"
                )
            self.visit_exprs([*stmt.bases, *(k.value for k in stmt.keywords)], ctx)
            return  # the body was reviewed as a model
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.visit_function(stmt)
            return
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for handler in stmt.handlers:
                self.review_handler(handler)
            self.visit_block(stmt.body, ctx)
            for handler in stmt.handlers:
                self.visit_block(handler.body, ctx)
            self.visit_block(stmt.orelse, ctx)
            self.visit_block(stmt.finalbody, ctx._replace(in_finally=True, in_loop=False))
            return
        if isinstance(stmt, ast.For | ast.While):
            self.visit_exprs(
                [stmt.target, stmt.iter] if isinstance(stmt, ast.For) else [stmt.test], ctx
            )
            self.visit_block(stmt.body, ctx._replace(in_loop=True))
            self.visit_block(stmt.orelse, ctx)
            return
        children: list[ast.expr] = []
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.stmt):
                self.visit_stmt(child, ctx)
            elif isinstance(child, ast.expr):
                children.append(child)
            elif isinstance(child, ast.match_case | ast.withitem | ast.keyword):
                for sub in ast.iter_child_nodes(child):
                    if isinstance(sub, ast.stmt):
                        self.visit_stmt(sub, ctx)
                    elif isinstance(sub, ast.expr):
                        children.append(sub)
                    elif isinstance(sub, ast.pattern):
                        children.extend(e for e in ast.walk(sub) if isinstance(e, ast.expr))
        self.visit_exprs(children, ctx)

    def visit_function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if fn not in self.workflow_candidates and fn.decorator_list:
            self.reject(
                fn.decorator_list[0],
                "decorator",
                "decorators are not allowed in a workflow except one @workflow(...) "
                "on the module's async workflow function",
            )
        args = fn.args
        outer = _Context()
        self.visit_exprs(
            [
                *args.defaults,
                *(d for d in args.kw_defaults if d is not None),
                *(a.annotation for a in _param_names(args) if a.annotation),
                *([fn.returns] if fn.returns else []),
                *fn.decorator_list,
            ],
            outer,
        )
        self.visit_block(fn.body, _Context(in_async=isinstance(fn, ast.AsyncFunctionDef)))

    def review_handler(self, handler: ast.ExceptHandler) -> None:
        if handler.type is None:
            self.reject(
                handler,
                "try",
                "bare 'except:' would swallow the runtime's suspend "
                "and cancel signals; name the Exception subclasses to handle",
            )
            return
        names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for node in names:
            if not self.is_exception_class(node):
                self.reject(
                    node,
                    "try",
                    f"'except {ast.unparse(node)}' may swallow the runtime's suspend "
                    "and cancel signals; handle Exception or its builtin subclasses "
                    "or OperationFailed",
                )

    def is_exception_class(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            if node.id in BUILTIN_EXCEPTIONS or (
                node.id == "OperationFailed" and node.id in self.api
            ):
                return True
            member = self.members.get(node.id)
            return member is not None and _is_exception_member(*member)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = self.modules.get(node.value.id)
            return module is not None and _is_exception_member(module, node.attr)
        return False

    def visit_exprs(self, exprs: Iterable[ast.expr], ctx: _Context) -> None:
        for expr in exprs:
            self.visit_expr(expr, ctx.in_async)

    def visit_expr(self, root: ast.expr, in_async: bool) -> None:
        stack: list[tuple[ast.AST, bool]] = [(root, in_async)]
        while stack:
            node, in_async = stack.pop()
            if isinstance(node, ast.Lambda):
                stack.extend((d, in_async) for d in node.args.defaults)
                stack.extend((d, in_async) for d in node.args.kw_defaults if d is not None)
                stack.append((node.body, False))
                continue
            if isinstance(node, ast.Yield | ast.YieldFrom) and in_async:
                self.reject(
                    node,
                    "async-generator",
                    "'yield' in an async function makes an "
                    "async generator, which a workflow may not define; return a list",
                )
            self.visit_node(node)
            stack.extend((child, in_async) for child in ast.iter_child_nodes(node))

    def visit_node(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.visit_name(node)
        elif isinstance(node, ast.Attribute):
            self.visit_attribute(node)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
            and _is_dunder(node.slice.value)
        ):
            self.reject(
                node,
                "dunder",
                f"subscript {node.slice.value!r} is not allowed "
                "(double-underscore names reach interpreter internals)",
            )
        elif isinstance(node, ast.Call):
            self.visit_call(node)

    def visit_name(self, node: ast.Name) -> None:
        name = node.id
        parent = self.parents.get(node)
        if name in FORBIDDEN_NAMES:
            self.reject(
                node,
                "forbidden-name",
                f"'{name}' is not allowed in a workflow ({FORBIDDEN_NAMES[name]})",
            )
        elif _is_dunder(name):
            self.reject(
                node,
                "dunder",
                f"name {name!r} is not allowed in a workflow "
                "(double-underscore names reach interpreter internals)",
            )
        elif name in self.modules and not (
            isinstance(parent, ast.Attribute) and parent.value is node
        ):
            self.reject(
                node,
                "module-member",
                f"use members of {self.modules[name]!r} "
                f"directly ({name}.member), not the module object",
            )
        elif name == self.flow:
            self.visit_flow_use(node, parent)

    def visit_flow_use(self, node: ast.Name, parent: ast.AST | None) -> None:
        if isinstance(parent, ast.Attribute) and parent.value is node:
            call = self.parents.get(parent)
            if parent.attr not in FLOW_KINDS:
                self.reject(
                    parent,
                    "flow",
                    f"'{node.id}.{parent.attr}' is not a flow "
                    f"operation; use one of {', '.join(FLOW_KINDS)}",
                )
            elif not (isinstance(call, ast.Call) and call.func is parent):
                self.reject(
                    parent,
                    "flow",
                    f"call '{node.id}.{parent.attr}(...)' directly; flow operations are not values",
                )
            else:
                self.record_call(call, parent.attr)
            return
        if isinstance(parent, ast.keyword):
            call, position, keyword = self.parents.get(parent), None, parent.arg
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
            signatures = self.functions.get(call.func.id, [])
            if signatures and all(self.takes_flow(s, position, keyword) for s in signatures):
                return
        self.reject(
            node,
            "flow",
            f"use {node.id!r} only as '{node.id}.<operation>(...)' or "
            f"pass it to a function of this module whose parameter is named "
            f"{node.id!r}, so every call site is reviewed",
        )

    def takes_flow(self, args: ast.arguments, position: int | None, keyword: str | None) -> bool:
        if keyword is not None:
            return keyword == self.flow and any(a.arg == keyword for a in _param_names(args))
        names = _positional_names(args)
        return position is not None and position < len(names) and names[position] == self.flow

    def visit_attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr.startswith("__"):
            self.reject(
                node,
                "dunder",
                f"attribute {attr!r} is not allowed in a workflow "
                "(double-underscore names reach interpreter internals)",
            )
        elif attr in INTROSPECTION_ATTRIBUTES or attr.startswith(INTROSPECTION_PREFIXES):
            if attr in ("format", "format_map"):
                self.reject(
                    node,
                    "format",
                    f"'.{attr}()' is not allowed in a workflow (it "
                    "reaches attributes by name); use an f-string",
                )
            else:
                self.reject(
                    node,
                    "introspection",
                    f"attribute {attr!r} is not allowed in a "
                    "workflow (it reaches frames and code objects)",
                )
        elif isinstance(node.value, ast.Name) and node.value.id in self.modules:
            module = self.modules[node.value.id]
            reason = _member_refusal(module, attr)
            if reason:
                self.reject(node, "module-member", f"'{module}.{attr}' {reason}")

    def visit_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            if func.id == "agent" and node not in self.agent_nodes:
                self.reject(
                    node,
                    "agent",
                    "agent(...) is allowed only as a module-level "
                    "'NAME = agent(...)' so review can list it",
                )
            elif func.id == "workflow" and not self.is_workflow_decorator(node):
                self.reject(
                    node,
                    "workflow",
                    "workflow(...) is used only as the decorator "
                    "of the module's async workflow function",
                )
            elif func.id == "iter" and len(node.args) > 1:
                self.reject(
                    node,
                    "loop",
                    "'iter(callable, sentinel)' may never end (iterate over finite values)",
                )

    def is_workflow_decorator(self, node: ast.Call) -> bool:
        parent = self.parents.get(node)
        return parent in self.workflow_candidates

    def record_call(self, call: ast.Call, kind: str) -> None:
        line, col = _position(call)
        capabilities: set[str] = set()
        descriptor: str | None = None
        schema: str | None = None
        if kind == "agent":
            first = call.args[0] if call.args else None
            if not (isinstance(first, ast.Name) and first.id in self.agents):
                self.reject(
                    call,
                    "flow",
                    "the first argument of flow.agent must name a "
                    "module-level agent descriptor (NAME = agent(...))",
                )
                return
            descriptor = first.id
            entry = self.agents[descriptor]
            capabilities.add(f"profile:{entry.profile}")
            if entry.access == "write":
                capabilities.add("write")
            if entry.network != "none":
                capabilities.add(f"network:{entry.network}")
        elif kind == "ask":
            capabilities.add("human")
            for kw in call.keywords:
                if kw.arg == "schema":
                    if not (isinstance(kw.value, ast.Name) and kw.value.id in self.models):
                        self.reject(
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
        self.calls.append(
            CallSite(
                kind=kind,
                line=line,
                col=col,
                descriptor=descriptor,
                answer_schema=schema,
                capabilities=sorted(capabilities),
            )
        )


def _agent_problem(values: dict[str, Any]) -> str | None:
    profile = values.get("profile")
    access = values.setdefault("access", "read")
    network = values.setdefault("network", "none")
    allowlist = values.setdefault("allowlist", ())
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
    for domain in allowlist:
        if not isinstance(domain, str) or not DOMAIN_RE.match(domain):
            return f"allowlist entry {domain!r} is not a domain name"
    return None


def _literal(node: ast.expr) -> Any:
    """The value of a literal expression that JSON can carry; anything else is rejected."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _Reject(
            node,
            "literal",
            f"{ast.unparse(node)!r} must be a literal "
            "(string, number, bool, None, list or dict of those)",
        ) from None
    if not _is_json(value):
        raise _Reject(
            node,
            "literal",
            f"{ast.unparse(node)!r} must be a JSON literal "
            "(string, number, bool, None, list or dict with string keys)",
        )
    return value


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _module(name: str) -> ModuleType:
    # Only names from PURE_MODULES reach this: stdlib modules without import-time effects.
    return importlib.import_module(name)


def _member_refusal(module: str, member: str) -> str | None:
    """Why ``module.member`` may not be used, or None when it may."""
    if member.startswith("_"):
        return "is private"
    if (module, member) in DENIED_MEMBERS:
        return "is not allowed: " + DENIED_MEMBERS[(module, member)]
    if module == "typing":
        return (
            None
            if member in TYPING_MEMBERS
            else (
                "is not allowed; typing offers workflows only " + ", ".join(sorted(TYPING_MEMBERS))
            )
        )
    mod = _module(module)
    if not hasattr(mod, member):
        return "does not exist"
    public = getattr(mod, "__all__", None)
    if public is not None and member not in public:
        return "is not a public member"
    if isinstance(getattr(mod, member), ModuleType):
        return "is a module, which a workflow may not use"
    return None


def _is_exception_member(module: str, member: str) -> bool:
    if _member_refusal(module, member) is not None:
        return False
    value = getattr(_module(module), member)
    return isinstance(value, type) and issubclass(value, Exception)
