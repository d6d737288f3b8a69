"""The launch form a person fills in: a workflow's input schema as the flat form MCP's
elicitation (``elicitation/create``, revision 2025-06-18 and later) can show.

A form holds the input fields a client can render (text, a number, a whole number, yes/no,
one of a list); a field of any other shape is left out, and when such a field is required
and missing there is no form at all (the launch goes to cairnd as it is, which says what is
missing). Nothing here validates: cairnd checks the merged arguments against the input
model, whoever filled them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard, TypeVar

from cairn.protocol.jsonvalue import JSONValue
from cairn.protocol.mcp import ElicitForm, FormField

COMMON_KEYS: tuple[str, ...] = ("title", "description", "default")
STRING_KEYS: tuple[str, ...] = (*COMMON_KEYS, "minLength", "maxLength")
NUMBER_KEYS: tuple[str, ...] = (*COMMON_KEYS, "minimum", "maximum")
FORMATS = ("email", "uri", "date", "date-time")
FormValue = str | int | float | bool
Value = TypeVar("Value")


def _without_null(prop: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
    """``X | None`` (pydantic's ``anyOf`` with a ``null`` branch) as ``X``, keeping the
    property's own title, description and default."""
    branches = prop.get("anyOf")
    if not isinstance(branches, list):
        return prop
    real = [b for b in branches if b != {"type": "null"}]
    if len(real) != 1 or not isinstance(real[0], dict):
        return prop
    return {**real[0], **{k: v for k, v in prop.items() if k != "anyOf"}}


def form_field(prop: Mapping[str, JSONValue]) -> FormField | None:
    """The elicitation schema of one input property, or None when a form cannot hold it."""
    prop = _without_null(prop)
    kind = prop.get("type")
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        field = {k: prop[k] for k in COMMON_KEYS if k in prop}
        return {"type": "string", "enum": list(enum), **field}
    if kind == "string":
        field = {k: prop[k] for k in STRING_KEYS if k in prop}
        if prop.get("format") in FORMATS:
            field["format"] = prop["format"]
        return {"type": "string", **field}
    if kind in ("integer", "number"):
        return {"type": kind, **{k: prop[k] for k in NUMBER_KEYS if k in prop}}
    if kind == "boolean":
        return {"type": "boolean", **{k: prop[k] for k in COMMON_KEYS if k in prop}}
    return None


def _is_value(value: object) -> TypeGuard[FormValue]:
    return isinstance(value, str | int | float | bool)


def launch_form(schema: Mapping[str, object], given: Mapping[str, object]) -> ElicitForm | None:
    """The form for the input ``schema`` when ``given`` lacks a required field it can
    hold, else None. Each field starts at the value ``given`` has for it (the caller's
    proposal, which the person may change), or at the model's default."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    listed = schema.get("required", [])
    required: list[str] = (
        [name for name in listed if name in properties] if isinstance(listed, list) else []
    )
    missing = [name for name in required if name not in given]
    fields: dict[str, FormField] = {}
    for name, prop in properties.items():
        field = form_field(prop) if isinstance(prop, dict) else None
        if field is None:
            if name in missing:
                return None  # a required field no form can hold: cairnd says what it needs
            continue
        proposed = given.get(name)
        if _is_value(proposed):
            field["default"] = proposed
        elif not _is_value(field.get("default")):
            field.pop("default", None)
        fields[name] = field
    if not missing:
        return None
    return {"type": "object", "properties": fields, "required": missing}


def filled(
    given: Mapping[str, Value], content: Mapping[str, Value] | None
) -> dict[str, Value]:
    """``given`` with what the person entered (an empty entry leaves the field out)."""
    entered = {k: v for k, v in (content or {}).items() if v is not None and v != ""}
    return {**given, **entered}
