"""Path rules: the one definition of a plain relative path (what every reader of a
project path, an untrusted file name or a protocol path accepts), the walk up a path
(parent, depth, ancestors), and the name Cairn's own temporaries take in a tree it writes.

A plain relative path names an entry below a directory in exactly one way: not empty, not
absolute, no NUL, and no empty, ``.`` or ``..`` component (so no ``a//b``, ``./a``, ``a/``
or ``a/../b``). Callers raise their own error on a refusal (a usage error, a refused
file, a model's ``ValueError``) and add their own bounds (a protocol's length limit).
"""

from __future__ import annotations

from cairn.errors import UsageError

_NOT_NAMES = ("", ".", "..")
# The name prefix of a temporary a settlement step writes before its rename into place,
# in C (the candidate) or in the live project (the apply); the apply removes leftovers.
TMP_PREFIX = ".cairn-apply."


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


def check_relative(path: str) -> list[str]:
    """The components of a plain relative path inside the project; ``UsageError``
    otherwise."""
    if "\0" in path:
        raise UsageError("path contains a NUL byte")
    parts = plain_parts(path)
    if parts is None:
        raise UsageError(f"path {path!r} is not a normalized path inside the project")
    return parts


def parent(path: str) -> str:
    """``a/b/c`` → ``a/b``; a top-level path's parent is the root, ``""``."""
    return path.rpartition("/")[0]


def depth(path: str) -> int:
    return path.count("/")


def under(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or below it."""
    return path == top or path.startswith(top + "/")


def ancestors(path: str) -> list[str]:
    """The proper ancestors of a relative path, nearest first (the root "" excluded)."""
    out = []
    while "/" in path:
        path = path.rpartition("/")[0]
        out.append(path)
    return out


def printable_name(path: str) -> str:
    """``path`` as text that is valid UTF-8, for a report: a name byte that is not UTF-8
    (kept by Python as a surrogate escape) is written ``\\xNN``. A reader can show it; no
    path names it any more, so it is only for paths that are reported, never acted on."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
