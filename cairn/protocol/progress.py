"""Owner's helper units (import, apply) → coordinator: the progress report a helper keeps
in ``/progress/progress.json`` and the ``progress`` event the coordinator records from it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

ProgressPhase = Literal["import", "apply"]
MAX_COUNT = 1 << 50


class ProgressReport(BaseModel):
    """What a helper says it has done: items (entries, paths) and bytes, of a total when
    known. Written by the owner's helper; validated before anything uses it."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    done: int = Field(ge=0, le=MAX_COUNT)
    total: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    bytes_done: int = Field(default=0, ge=0, le=MAX_COUNT)
    bytes_total: int | None = Field(default=None, ge=0, le=MAX_COUNT)

    def event_data(self, phase: ProgressPhase) -> dict[str, JsonValue]:
        """The ``progress`` event's data; the phase comes from the reader, never the file."""
        return {"phase": phase, **self.model_dump()}
