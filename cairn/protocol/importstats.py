"""Owner's import unit → cairnd and the coordinator: what the import of a project into Q
counted and what it left out. Root records the unit's statistics as bytes it never parses
(``RawBytes`` in a ``prepare-q`` receipt); the readers parse them with these models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SkippedEntry(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    path: str
    reason: str


class ImportStats(BaseModel):
    """Counts of what was copied and what was not. ``skipped`` lists at most the first
    entries (``cairn.importer.MAX_LISTED``, ``MAX_LISTED_BYTES`` together);
    ``skipped_count`` counts them all."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    files: int = 0
    directories: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    bytes: int = 0
    skipped_special: int = 0
    unreadable: int = 0
    xattrs_not_copied: int = 0
    skipped_count: int = 0
    skipped: list[SkippedEntry] = []
