"""What the owner's candidate and apply units write and root reads: bounded, normalized."""

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from cairn.pathrules import is_plain_relative
from cairn.protocol.base import Frozen
from cairn.protocol.limits import DIFF_LIMIT, MAX_PATHS, TEXT_LIMIT, TRIAL_REFUSED_SHOWN

_DIFF_MAX = 4 * DIFF_LIMIT  # ends past DIFF_LIMIT: one more path (each side bounded), a line


def _relative(path: str) -> str:
    if len(path) > TEXT_LIMIT or not is_plain_relative(path):
        raise ValueError(f"{path[:200]!r} is not a normalized path inside the project")
    return path


ProjectPath = Annotated[str, AfterValidator(_relative)]
Paths = Annotated[list[ProjectPath], Field(max_length=MAX_PATHS)]
Reason = Annotated[str, Field(max_length=TEXT_LIMIT)]


class RefusedPath(Frozen):
    path: ProjectPath
    reason: Reason


class CandidateReport(Frozen):
    """What went into C (``accepted``, the paths to apply) and what did not, and why;
    ``ignored``: changes the run's profiles declared tool leftovers (``settle_ignore``)."""

    accepted: Paths
    refused: Annotated[list[RefusedPath], Field(max_length=MAX_PATHS)]
    ignored: Paths = []
    bytes_accepted: int = Field(ge=0)


class CandidateResult(CandidateReport):
    """The candidate unit's result.json: the report, whether Q and P hold the same tree
    (asked only when nothing was accepted) and the unified diff of what was."""

    inventories_equal: bool
    diff: str = Field(max_length=_DIFF_MAX)


class TrialCheck(Frozen):
    """A trial's check's result.json (the candidate unit without C, over the measured W):
    the first of W's changes since Q that the settlement would refuse, and how many."""

    refused: Annotated[list[RefusedPath], Field(max_length=TRIAL_REFUSED_SHOWN)]
    refused_count: int = Field(ge=0)


class CandidateFailure(Frozen):
    """The candidate unit's failure.json: why it could not build C (it then exits 1);
    ``send_stream``: it could not read P by root's record of the changes (a directory the
    owner may not list) and needs the send stream instead."""

    message: Reason
    hint: Reason = ""
    send_stream: bool = False


class ApplyConflict(Frozen):
    path: ProjectPath
    reason: Reason


class ApplyResult(Frozen):
    """The apply unit's result.json."""

    status: Literal["applied", "conflict", "noop"]
    applied: Paths = []
    already_applied: Paths = []
    conflicts: Annotated[list[ApplyConflict], Field(max_length=MAX_PATHS)] = []
    # applied paths whose user.* xattrs in F the live project's filesystem refused
    xattrs_not_kept: Paths = []
    # applied paths that are a hard link of another applied path in F, written as copies
    links_not_kept: Paths = []


class AppliedCheck(Frozen):
    """check-applied's result.json: applied paths whose live state is F's, Q's, neither;
    apply receipts unlike F (cairn.settle.check_applied)."""

    as_applied: Paths = []
    reverted: Paths = []
    changed: Paths = []
    receipt_differs: Paths = []
