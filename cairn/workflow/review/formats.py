"""``"...".format(...)`` on a literal string, checked field by field.

A replacement field reaches attributes only through ``.name`` or ``[key]`` after its first
part (``"{0.__class__}"``, ``"{a[0]}"``), and only there: a plain position (``{}``,
``{0}``) or a plain name (``{name}``) looks up an argument and formats it. A literal format
string can be read with :meth:`string.Formatter.parse` before anything runs, so review
accepts it when every field, including the fields nested in a format spec
(``"{:{width}}"``), is plain. Every other receiver stays refused: its fields are not known
until it runs.
"""

from __future__ import annotations

import re
import string

from cairn.workflow.review.nodes import is_dunder

CONVERSIONS = ("r", "s", "a")
_POSITION = re.compile(r"[0-9]+")


def literal_format_refusal(template: str) -> str | None:
    """Why ``template.format(...)`` may not run in a workflow, or None when it may."""
    try:
        return _fields_refusal(template)
    except ValueError as exc:
        return f"{template!r} is not a valid format string ({exc}); fix the braces"


def _fields_refusal(template: str) -> str | None:
    for _text, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue  # literal text only
        field = _render(name, spec, conversion)
        if "." in name or "[" in name:
            return (
                f"format field {field!r} is not allowed in a workflow (a '.' or '[...]' in "
                "a field reaches attributes); use plain fields like '{}', '{0}' or '{name}' "
                "and pass the value itself"
            )
        if not (name == "" or _POSITION.fullmatch(name) or name.isidentifier()):
            return (
                f"format field {field!r} is neither a position nor a name; use plain "
                "fields like '{}', '{0}' or '{name}'"
            )
        if is_dunder(name):
            return (
                f"format field {field!r} is not allowed in a workflow (double-underscore "
                "names reach interpreter internals); choose another name"
            )
        if conversion is not None and conversion not in CONVERSIONS:
            return f"format field {field!r} has an unknown conversion; use !r, !s or !a"
        if spec:
            nested = _fields_refusal(spec)
            if nested is not None:
                return nested
    return None


def _render(name: str, spec: str | None, conversion: str | None) -> str:
    """The field as written (near enough to find it in the source)."""
    return (
        "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
    )
