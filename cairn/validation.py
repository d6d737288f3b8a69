"""pydantic's complaint as a Cairn error: its first error only, as one line a person can
act on (``<what>: <where>: <message>``)."""

from __future__ import annotations

from pydantic import ValidationError

from cairn.errors import ValidationFailed


def first_error(exc: ValidationError, *, top: str = "") -> tuple[str, str]:
    """Where the first error of ``exc`` points (a dotted path, or ``top`` when it is about
    the whole value) and what it says."""
    first = exc.errors()[0]
    return ".".join(str(part) for part in first["loc"]) or top, first["msg"]


def invalid(
    exc: ValidationError, what: str, *, top: str = "", hint: str | None = None
) -> ValidationFailed:
    """The :class:`ValidationFailed` to raise (``from exc``) for the first error of ``exc``."""
    where, message = first_error(exc, top=top)
    return ValidationFailed(f"{what}: {where}: {message}", hint=hint)
