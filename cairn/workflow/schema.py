"""Typed values of a workflow, described as data.

Review turns every ``class X(Model)`` of a workflow module into a :class:`ModelSpec`.
:func:`build_models` rebuilds real pydantic models from those specs, so the daemon and the
coordinator validate arguments, answers and agent outputs without executing workflow
source. For the supported subset the rebuilt models enforce exactly what the source's own
classes enforce: same field order, annotations, defaults (a literal, or a fresh value from
``default_factory`` of ``list``, ``dict``, ``set`` or a model of the module), constraints
and configuration.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from types import GenericAlias
from typing import Any, Literal

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic.config import JsonDict

from cairn.errors import ValidationFailed

log = logging.getLogger(__name__)


def show_factory_defaults(schema: JsonDict, model: type[BaseModel]) -> None:
    """Show the value a ``default_factory`` field starts with as its JSON Schema
    ``default``: ``[]`` for ``list`` and ``set``, ``{}`` for ``dict``, the model's own
    defaults for a model class. (Pydantic leaves such a field without a default.)"""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    for name, info in model.model_fields.items():
        factory, prop = info.default_factory, properties.get(name)
        if factory is None or not isinstance(prop, dict):
            continue
        if factory in (list, set):
            prop["default"] = []
        elif factory is dict:
            prop["default"] = {}
        elif isinstance(factory, type) and issubclass(factory, BaseModel):
            try:
                prop["default"] = factory().model_dump(mode="json")
            except pydantic.ValidationError:
                continue  # review refuses such a factory; nothing sensible to show


MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, json_schema_extra=show_factory_defaults)
"""The configuration of every workflow model, in source (``Model``) and rebuilt alike. Not
deferred like Cairn's own models: a workflow's models are built where the workflow
defines them."""

FACTORY_BUILTINS: dict[str, type] = {"list": list, "dict": dict, "set": set}

LiteralValue = str | int | bool | None

SCALAR_TYPES = ("str", "int", "float", "bool")

LENGTH_CONSTRAINTS = ("min_length", "max_length")
NUMBER_CONSTRAINTS = ("ge", "gt", "le", "lt", "multiple_of")
TEXT_CONSTRAINTS = ("pattern",)
FIELD_CONSTRAINTS = LENGTH_CONSTRAINTS + NUMBER_CONSTRAINTS + TEXT_CONSTRAINTS
FIELD_DOC_KEYWORDS = ("description", "title")


class _Frozen(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)


class TypeSpec(_Frozen):
    """One annotation from the closed set review accepts.

    ``kind`` selects the shape: a scalar (``str``/``int``/``float``/``bool``), ``list`` and
    ``optional`` (``item``), ``dict`` with ``str`` keys (``item`` is the value type),
    ``literal`` (``values``) or ``model`` (``model`` names another model of the module).
    """

    kind: Literal["str", "int", "float", "bool", "list", "dict", "optional", "literal", "model"]
    item: TypeSpec | None = None
    values: tuple[LiteralValue, ...] = ()
    model: str | None = None

    def render(self) -> str:
        """The annotation as a person would write it."""
        if self.kind in SCALAR_TYPES:
            return self.kind
        if self.kind == "model":
            return str(self.model)
        if self.kind == "literal":
            return "Literal[" + ", ".join(repr(v) for v in self.values) + "]"
        inner = self.item.render() if self.item is not None else "?"
        if self.kind == "list":
            return f"list[{inner}]"
        if self.kind == "dict":
            return f"dict[str, {inner}]"
        return f"{inner} | None"


class FactorySpec(_Frozen):
    """A ``default_factory``: ``list``, ``dict``, ``set`` or ``model`` (a model of the
    module, named by ``model``, all of whose fields have defaults)."""

    kind: Literal["list", "dict", "set", "model"]
    model: str | None = None

    def render(self) -> str:
        """The call that makes the fresh default, as a person would write it."""
        return f"{self.model if self.kind == 'model' else self.kind}()"


class FieldSpec(_Frozen):
    """One field: its annotation, its default (when it has one) and its constraints.

    A field has a literal ``default`` (``has_default``), a ``default_factory`` or neither.
    """

    name: str
    type: TypeSpec
    has_default: bool = False
    default: JsonValue = None
    default_factory: FactorySpec | None = None
    constraints: dict[str, str | int | float] = {}
    description: str | None = None
    title: str | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_factory(self, handler: SerializerFunctionWrapHandler) -> object:
        # A field without a factory serializes as it did before factories existed, so the
        # manifest, and with it every review_hash a person confirmed, stays the same.
        data = handler(self)
        if self.default_factory is None and isinstance(data, dict):
            data.pop("default_factory", None)
        return data

    def render(self) -> str:
        """``name: type = default  (constraint=value, ...)``."""
        text = f"{self.name}: {self.type.render()}"
        if self.has_default:
            text += f" = {self.default!r}"
        elif self.default_factory is not None:
            text += f" = {self.default_factory.render()}"
        if self.constraints:
            text += "  (" + ", ".join(f"{k}={v!r}" for k, v in self.constraints.items()) + ")"
        return text


class ModelSpec(_Frozen):
    """A workflow model: its name, docstring and fields in declaration order."""

    name: str
    doc: str | None = None
    fields: tuple[FieldSpec, ...] = ()


def build_models(specs: dict[str, ModelSpec]) -> dict[str, type[BaseModel]]:
    """Construct one frozen, extra-forbidding pydantic model per spec.

    A spec may refer only to models declared before it (review enforces that order), so a
    single pass in the given order resolves every reference.
    """
    built: dict[str, type[BaseModel]] = {}
    for name, spec in specs.items():
        if name != spec.name:
            raise ValidationFailed(
                f"model spec key {name!r} differs from its name {spec.name!r}; "
                "rebuild the specs from a fresh review"
            )
        fields: dict[str, Any] = {}  # create_model takes field definitions as untyped keywords
        for field in spec.fields:
            annotation = _annotation(field.type, built, owner=name)
            fields[field.name] = (annotation, _field_info(field, built, owner=name))
        built[name] = pydantic.create_model(
            name,
            __config__=MODEL_CONFIG,
            __doc__=spec.doc,
            __module__=__name__,
            **fields,
        )
    return built


def json_schema(specs: dict[str, ModelSpec], name: str) -> dict[str, Any]:
    """The JSON Schema of model ``name`` (with ``$defs`` for the models it refers to)."""
    if name not in specs:
        raise ValidationFailed(
            f"no model named {name!r} in this workflow; choose one of: " + ", ".join(sorted(specs))
        )
    return build_models(specs)[name].model_json_schema()


def _annotation(spec: TypeSpec, built: dict[str, type[BaseModel]], *, owner: str) -> object:
    scalars: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
    if spec.kind in scalars:
        return scalars[spec.kind]
    if spec.kind == "literal":
        if not spec.values:
            raise ValidationFailed(f"model {owner}: a Literal needs at least one value")
        return Literal[spec.values]
    if spec.kind == "model":
        if spec.model not in built:
            raise ValidationFailed(
                f"model {owner} refers to {spec.model!r}, which is not declared before it; "
                "declare referenced models first"
            )
        return built[spec.model]
    if spec.item is None:
        raise ValidationFailed(f"model {owner}: a {spec.kind} type needs an item type")
    item = _annotation(spec.item, built, owner=owner)
    if spec.kind == "list":
        return GenericAlias(list, (item,))
    if spec.kind == "dict":
        return GenericAlias(dict, (str, item))
    # ``item | None``, the very object the source's annotation is; mypy takes no runtime
    # value on the left of ``|``.
    return operator.or_(item, None)


def _field_info(field: FieldSpec, built: dict[str, type[BaseModel]], *, owner: str) -> object:
    kwargs: dict[str, Any] = dict(field.constraints)
    if field.description is not None:
        kwargs["description"] = field.description
    if field.title is not None:
        kwargs["title"] = field.title
    factory = field.default_factory
    if factory is not None:
        if field.has_default:
            raise ValidationFailed(
                f"model {owner}: field {field.name!r} has both a default and a "
                "default_factory; rebuild the specs from a fresh review"
            )
        return pydantic.Field(default_factory=_factory(factory, built, owner=owner), **kwargs)
    if field.has_default:
        return pydantic.Field(field.default, **kwargs)
    return pydantic.Field(**kwargs)


def _factory(
    spec: FactorySpec, built: dict[str, type[BaseModel]], *, owner: str
) -> Callable[[], object]:
    if spec.kind != "model":
        return FACTORY_BUILTINS[spec.kind]
    if spec.model not in built:
        raise ValidationFailed(
            f"model {owner}: default_factory {spec.model!r} is not a model declared "
            "before it; declare referenced models first"
        )
    return built[spec.model]
