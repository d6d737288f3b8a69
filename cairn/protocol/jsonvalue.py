"""JSON as ``json.loads`` returns it: the type of a value read at an edge (a socket, a
file, a journal column) that no model has checked yet, or that is only passed on.

Code that reads into such a value narrows it (``isinstance``) or validates it with a
model; an unchecked, untyped value is not the type of JSON.
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"


def json_object(value: object) -> JSONObject:
    """``value``, read where the writer put an object; TypeError when it is not one."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, not {type(value).__name__}")
    return value


def json_list(value: object) -> list[JSONValue]:
    """``value``, read where the writer put a list; TypeError when it is not one."""
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON list, not {type(value).__name__}")
    return value


def json_str(value: object) -> str:
    """``value``, read where the writer put a string; TypeError when it is not one."""
    if not isinstance(value, str):
        raise TypeError(f"expected a JSON string, not {type(value).__name__}")
    return value


def json_str_or_none(value: object) -> str | None:
    """``value``, read where the writer put a string or null; TypeError otherwise."""
    return None if value is None else json_str(value)


def json_int(value: object) -> int:
    """``value``, read where the writer put an integer; TypeError when it is not one."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected a JSON integer, not {type(value).__name__}")
    return value
