"""What the owner's settlement units tell root: the candidate unit's report on C and the
apply unit's result. Both are written by a process of the run's owner, so root reads them
through :mod:`cairn.untrusted` and trusts only what these models admit: normalized
project-relative paths, bounded lists and a bounded diff.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_PATHS = 1_000_000
MAX_REASON = 4096
DIFF_LIMIT = 256 << 10
# A diff stops once past DIFF_LIMIT: at most one more path's text (both sides of it
# bounded by DIFF_LIMIT) and a closing line.
_DIFF_MAX = 4 * DIFF_LIMIT


def _relative(path: str) -> str:
    parts = path.split("/")
    if (
        not path
        or len(path) > 4096
        or path.startswith("/")
        or "\0" in path
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ValueError(f"{path[:200]!r} is not a normalized path inside the project")
    return path


ProjectPath = Annotated[str, AfterValidator(_relative)]
Paths = Annotated[list[ProjectPath], Field(max_length=MAX_PATHS)]


class RefusedPath(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: ProjectPath
    reason: str = Field(max_length=MAX_REASON)


class CandidateReport(BaseModel):
    """What went into C (``accepted``, the paths to apply) and what did not, and why."""

    model_config = ConfigDict(extra="forbid")

    accepted: Paths
    refused: Annotated[list[RefusedPath], Field(max_length=MAX_PATHS)]
    bytes_accepted: int = Field(ge=0)


class CandidateResult(CandidateReport):
    """The candidate unit's whole answer: the report, whether Q and P hold the same tree
    (asked only when nothing was accepted) and the unified diff of what was."""

    inventories_equal: bool
    diff: str = Field(max_length=_DIFF_MAX)


class CandidateFailure(BaseModel):
    """Why the candidate unit could not build C (it exits non-zero after writing this)."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(max_length=MAX_REASON)
    hint: str = Field(default="", max_length=MAX_REASON)


class ApplyConflict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: ProjectPath
    reason: str = Field(max_length=MAX_REASON)


class ApplyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["applied", "conflict", "noop"]
    applied: Paths = []
    already_applied: Paths = []
    conflicts: Annotated[list[ApplyConflict], Field(max_length=MAX_PATHS)] = []
