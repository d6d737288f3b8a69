"""The one definition of a plain relative path: what every reader of a project path, an
untrusted file name or a protocol path accepts.

A plain relative path names an entry below a directory in exactly one way: not empty, not
absolute, no NUL, and no empty, ``.`` or ``..`` component (so no ``a//b``, ``./a``, ``a/``
or ``a/../b``). Callers raise their own error on a refusal (a usage error, a refused
file, a model's ``ValueError``) and add their own bounds (a protocol's length limit).
"""

from __future__ import annotations

__all__ = ["is_plain_relative", "plain_parts"]

_NOT_NAMES = ("", ".", "..")


def plain_parts(path: str) -> list[str] | None:
    """The components of ``path`` if it is a plain relative path, else None."""
    if not path or path.startswith("/") or "\0" in path:
        return None
    parts = path.split("/")
    if any(part in _NOT_NAMES for part in parts):
        return None
    return parts


def is_plain_relative(path: str) -> bool:
    """Whether ``path`` is a plain relative path (see the module doc)."""
    return plain_parts(path) is not None
