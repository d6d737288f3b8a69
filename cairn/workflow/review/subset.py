"""The allowed subset: which modules, module members and names a workflow may use.

Only :data:`PURE_MODULES` may be imported besides ``cairn.workflow``; their members are
vetted by :func:`member_refusal`. :data:`FORBIDDEN_NAMES` and the introspection attributes
are refused wherever they appear.
"""

from __future__ import annotations

import builtins
import importlib
from types import ModuleType

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


FORBIDDEN_NAMES: dict[str, str] = dict.fromkeys(
    ("open", "input", "print", "breakpoint", "help", "exit", "quit"),
    "workflows reach the outside only through flow.* calls",
)
FORBIDDEN_NAMES.update(
    dict.fromkeys(
        ("eval", "exec", "compile", "__import__"),
        "workflows may not run code built from strings",
    )
)
FORBIDDEN_NAMES.update(
    dict.fromkeys(
        ("getattr", "setattr", "delattr", "hasattr", "globals", "locals", "vars", "dir"),
        "attributes and namespaces are reached only by plain names",
    )
)
FORBIDDEN_NAMES.update(
    dict.fromkeys(
        ("type", "object", "super", "classmethod", "staticmethod", "property", "memoryview"),
        "workflows define only Model classes and plain functions",
    )
)
FORBIDDEN_NAMES["id"] = "its value differs between replays"

# ``format`` is refused except on a string literal whose fields review checks one by one
# (cairn/workflow/review/formats.py); ``format_map`` always.
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


def _module(name: str) -> ModuleType:
    # Only names from PURE_MODULES reach this: stdlib modules without import-time effects.
    return importlib.import_module(name)


def member_refusal(module: str, member: str) -> str | None:
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


def is_exception_member(module: str, member: str) -> bool:
    if member_refusal(module, member) is not None:
        return False
    value = getattr(_module(module), member)
    return isinstance(value, type) and issubclass(value, Exception)
