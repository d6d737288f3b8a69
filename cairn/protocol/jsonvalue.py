"""JSON as ``json.loads`` returns it: the type of a value read at an edge (a socket, a
file, a journal column) that no model has checked yet, or that is only passed on.

Code that reads into such a value narrows it (``isinstance``) or validates it with a
model; ``Any`` is not the type of JSON.
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"
