"""pydantic's complaint as a Cairn error: its first error only, as one line a person can
act on (``<what>: <where>: <message>``)."""

from __future__ import annotations

from pydantic import ValidationError

from cairn.errors import ValidationFailed

KEY_LIMIT = 80


def first_error(exc: ValidationError, *, top: str = "") -> tuple[str, str]:
    """Where the first error of ``exc`` points (a dotted path, or ``top`` when it is about
    the whole value) and what it says. A key of the input is shown escaped and cut when it
    is not short printable text: it is the writer's, and the message stays one line."""
    first = exc.errors()[0]
    return ".".join(_shown(part) for part in first["loc"]) or top, first["msg"]


def _shown(part: int | str) -> str:
    text = str(part)
    if text.isprintable() and len(text) <= KEY_LIMIT:
        return text
    return repr(text[:KEY_LIMIT]) + ("…" if len(text) > KEY_LIMIT else "")


def invalid(
    exc: ValidationError, what: str, *, top: str = "", hint: str | None = None
) -> ValidationFailed:
    """The :class:`ValidationFailed` to raise (``from exc``) for the first error of ``exc``."""
    where, message = first_error(exc, top=top)
    return ValidationFailed(f"{what}: {where}: {message}", hint=hint)
