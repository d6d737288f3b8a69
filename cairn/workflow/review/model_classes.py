"""Model classes: ``class X(Model)`` bodies become :class:`~cairn.workflow.schema.ModelSpec`
with fields from the closed annotation set and literal ``Field(...)`` constraints; a
``default_factory`` is ``list``, ``dict``, ``set`` or a model of the module, and fits the
field's type."""

from __future__ import annotations

import ast
import re
from typing import TypedDict

from pydantic import BaseModel

from cairn.protocol.jsonvalue import JSONValue
from cairn.workflow.review.nodes import Reject, bound_names, is_api_call, literal
from cairn.workflow.review.state import ReviewState
from cairn.workflow.schema import (
    FACTORY_BUILTINS,
    FIELD_CONSTRAINTS,
    FIELD_DOC_KEYWORDS,
    LENGTH_CONSTRAINTS,
    NUMBER_CONSTRAINTS,
    TEXT_CONSTRAINTS,
    FactorySpec,
    FieldSpec,
    ModelSpec,
    TypeSpec,
)

FIELD_NAME_RESERVED = frozenset(dir(BaseModel))


class FieldCall(TypedDict, total=False):
    """What a ``Field(...)`` call gives a :class:`FieldSpec`."""

    has_default: bool
    default: JSONValue
    default_factory: FactorySpec
    constraints: dict[str, str | int | float]
    description: str
    title: str


def review_model_class(state: ReviewState, cls: ast.ClassDef) -> None:
    """Record ``class X(Model)`` as a :class:`ModelSpec`, or reject what it holds."""
    if (
        len(cls.bases) != 1
        or not isinstance(cls.bases[0], ast.Name)
        or cls.bases[0].id != "Model"
        or cls.keywords
        or cls.decorator_list
    ):
        state.reject(
            cls,
            "class",
            f"class {cls.name!r} must be a plain 'class {cls.name}(Model)': "
            "workflows define only Model classes, without decorators, "
            "keywords or other bases",
        )
        return
    if "Model" not in state.api:
        state.reject(cls, "class", "import Model from cairn.workflow before using it")
    if cls.name in state.models or cls.name in state.agents:
        state.reject(cls, "rebind", f"{cls.name!r} is defined twice; use one name once")
        return
    doc = ast.get_docstring(cls, clean=True)
    body = cls.body[1:] if doc is not None else cls.body
    fields: list[FieldSpec] = []
    for stmt in body:
        try:
            fields.append(extract_field(state, cls.name, stmt))
        except Reject as exc:
            state.reject(exc.node, exc.rule, exc.message)
    state.definitions.add(cls)
    state.models[cls.name] = ModelSpec(name=cls.name, doc=doc, fields=tuple(fields))


def extract_field(state: ReviewState, model: str, stmt: ast.stmt) -> FieldSpec:
    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.simple):
        raise Reject(
            stmt,
            "model-body",
            f"a Model body holds only its docstring and 'name: type = "
            f"default' fields; remove this statement from {model!r}",
        )
    name = stmt.target.id
    if name.startswith("_") or name.startswith("model_") or name in FIELD_NAME_RESERVED:
        raise Reject(stmt, "model-field", f"field name {name!r} is reserved by pydantic; rename it")
    type_spec = extract_type(state, stmt.annotation, model)
    spec: FieldCall = {}
    value = stmt.value
    if value is None:
        pass
    elif is_api_call(value, "Field"):
        assert isinstance(value, ast.Call)
        spec.update(extract_field_call(state, value))
    else:
        spec["has_default"] = True
        spec["default"] = literal(value)
    field = FieldSpec(name=name, type=type_spec, **spec)
    check_constraints(stmt, field)
    if field.default_factory is not None:
        assert isinstance(value, ast.Call)
        check_factory(state, value, field)
    return field


def extract_field_call(state: ReviewState, call: ast.Call) -> FieldCall:
    out: FieldCall = {}
    constraints: dict[str, str | int | float] = {}
    if len(call.args) > 1 or any(isinstance(a, ast.Starred) for a in call.args):
        raise Reject(
            call, "model-field", "Field() takes at most one positional argument, the default"
        )
    if call.args:
        out["has_default"] = True
        out["default"] = literal(call.args[0])
    renamed = {
        "min_items": "min_length",
        "max_items": "max_length",
        "regex": "pattern",
        "const": "Literal[...]",
    }
    for kw in call.keywords:
        if kw.arg is None:
            raise Reject(kw.value, "model-field", "Field(**...) is not allowed; write each keyword")
        if kw.arg in renamed:
            raise Reject(
                kw.value,
                "model-field",
                f"Field({kw.arg}=) is pydantic v1; use {renamed[kw.arg]}",
            )
        if kw.arg == "default":
            out["has_default"] = True
            out["default"] = literal(kw.value)
        elif kw.arg == "default_factory":
            out["default_factory"] = extract_factory(state, kw.value)
        elif kw.arg in FIELD_CONSTRAINTS:
            value = _constraint_value(kw.arg, literal(kw.value))
            if value is None:
                raise Reject(
                    kw.value,
                    "model-field",
                    f"Field({kw.arg}=) needs a literal "
                    f"{'string' if kw.arg in TEXT_CONSTRAINTS else 'number'}",
                )
            if kw.arg == "pattern":
                try:
                    re.compile(str(value))
                except re.error as exc:
                    raise Reject(
                        kw.value, "model-field", f"Field(pattern=) is not a valid regex: {exc}"
                    ) from None
            constraints[kw.arg] = value
        elif kw.arg in FIELD_DOC_KEYWORDS:
            text = literal(kw.value)
            if not isinstance(text, str):
                raise Reject(kw.value, "model-field", f"Field({kw.arg}=) needs a string")
            if kw.arg == "description":
                out["description"] = text
            else:
                out["title"] = text
        else:
            allowed = ", ".join(
                ("default", "default_factory", *FIELD_CONSTRAINTS, *FIELD_DOC_KEYWORDS)
            )
            raise Reject(
                kw.value,
                "model-field",
                f"Field({kw.arg}=) is not supported in a workflow; use {allowed}",
            )
    out["constraints"] = constraints
    return out


def _constraint_value(keyword: str, value: JSONValue) -> str | int | float | None:
    """``value`` when it fits the constraint ``keyword`` (a string for a pattern, a number
    otherwise), else None."""
    if keyword in TEXT_CONSTRAINTS:
        return value if isinstance(value, str) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def extract_factory(state: ReviewState, node: ast.expr) -> FactorySpec:
    """``default_factory=``: the bare name ``list``, ``dict``, ``set`` or of a model declared
    above; nothing else is called, so nothing else may be named."""
    if isinstance(node, ast.Name) and node.id in state.models:
        return FactorySpec(kind="model", model=node.id)
    if isinstance(node, ast.Name) and node.id in FACTORY_BUILTINS:
        rebound = (
            node.id in state.modules
            or node.id in state.members
            or node.id in state.api
            or any(name == node.id for _, name in bound_names(state.tree))
        )
        if rebound:
            raise Reject(
                node,
                "model-field",
                f"Field(default_factory={node.id}) needs the builtin {node.id!r}, which this "
                "module rebinds; rename that binding",
            )
        return FactorySpec(kind=node.id)  # type: ignore[arg-type]
    raise Reject(
        node,
        "model-field",
        f"Field(default_factory={ast.unparse(node)}) is not allowed; default_factory takes "
        "only list, dict or a Model class declared above in this module, by bare name",
    )


def check_factory(state: ReviewState, call: ast.Call, field: FieldSpec) -> None:
    """The factory's value fits the field's type, and is the field's only default."""
    factory = field.default_factory
    assert factory is not None
    node = next(kw.value for kw in call.keywords if kw.arg == "default_factory")
    if field.has_default:
        raise Reject(node, "model-field", "Field() takes a default or a default_factory, not both")
    base = field.type
    while base.kind == "optional" and base.item is not None:
        base = base.item
    name = factory.model if factory.kind == "model" else factory.kind
    fits = base.kind == factory.kind and (factory.kind != "model" or base.model == factory.model)
    if not fits:
        suggestion = {"list": "list", "dict": "dict", "model": base.model}.get(base.kind)
        fix = f"use default_factory={suggestion}" if suggestion else "use a literal default"
        if factory.kind == "set":
            fix = "workflow models have no set type; use a list[...] field and default_factory=list"
        raise Reject(
            node,
            "model-field",
            f"Field(default_factory={name}) makes a {name}, which does not fit "
            f"{field.type.render()!r}; {fix}",
        )
    if factory.kind == "model":
        required = [f.name for f in state.models[str(name)].fields if not has_default(f)]
        if required:
            raise Reject(
                node,
                "model-field",
                f"Field(default_factory={name}) needs every field of {name!r} to have a "
                f"default (without one: {', '.join(required)})",
            )


def has_default(field: FieldSpec) -> bool:
    return field.has_default or field.default_factory is not None


def check_constraints(node: ast.AST, field: FieldSpec) -> None:
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
            raise Reject(
                node,
                "model-field",
                f"Field({key}=) does not apply to {base.render()!r}; drop it or change the type",
            )


def extract_type(state: ReviewState, node: ast.expr, model: str) -> TypeSpec:
    closed_set = (
        "str, int, float, bool, list[T], dict[str, T], T | None, Optional[T], "
        "Literal[...] or a Model declared above"
    )
    if isinstance(node, ast.Name):
        if node.id in ("str", "int", "float", "bool"):
            return TypeSpec(kind=node.id)  # type: ignore[arg-type]
        if node.id in state.models:
            return TypeSpec(kind="model", model=node.id)
        if node.id == model:
            raise Reject(node, "model-type", f"{model!r} may not contain itself")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for inner, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(other, ast.Constant) and other.value is None:
                return TypeSpec(kind="optional", item=extract_type(state, inner, model))
    if isinstance(node, ast.Subscript):
        head = typing_name(state, node.value)
        if head == "list":
            return TypeSpec(kind="list", item=extract_type(state, node.slice, model))
        if head == "dict" and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2:
            key, value = node.slice.elts
            if isinstance(key, ast.Name) and key.id == "str":
                return TypeSpec(kind="dict", item=extract_type(state, value, model))
            raise Reject(key, "model-type", "dict keys must be str (JSON objects)")
        if head == "Optional":
            return TypeSpec(kind="optional", item=extract_type(state, node.slice, model))
        if head == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = []
            for elt in elts:
                choice = literal(elt)
                if not (choice is None or isinstance(choice, str | int | bool)):
                    raise Reject(
                        elt,
                        "model-type",
                        "Literal[...] values are strings, ints, bools or None",
                    )
                values.append(choice)
            return TypeSpec(kind="literal", values=tuple(values))
    raise Reject(
        node,
        "model-type",
        f"annotation {ast.unparse(node)!r} is outside the workflow type set ({closed_set})",
    )


def typing_name(state: ReviewState, node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        if node.id in ("list", "dict"):
            return node.id
        member = state.members.get(node.id)
        if member and member[0] == "typing":
            return member[1]
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and state.modules.get(node.value.id) == "typing"
    ):
        return node.attr
    return None
