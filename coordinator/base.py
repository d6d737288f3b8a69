"""The coordinator's errors (how an operation or the run ends early), its limits on
attempts, and the reviewed manifest's entries as the launch description holds them. The
state the collaborators share is in :mod:`~cairn.coordinator.context`."""

from __future__ import annotations

from typing import Literal, TypedDict

from cairn.errors import CairnError

MAX_ATTEMPTS = 3  # of a settlement step; an agent's are its profile's agent_attempts
EXIT_RESTART = 75  # systemd restarts the unit (Restart=on-failure) and recovery resumes


class RunBlocked(CairnError):
    """The run cannot go on without a person's decision (an uncertain effect)."""

    code = "blocked"


class Nondeterminism(CairnError):
    """A replayed operation differs from the one in the journal."""

    code = "nondeterminism"


class OperationError(CairnError):
    """An operation failed for good (refused, or no result within its attempts): the
    workflow sees it as ``OperationFailed`` and may handle it, e.g. as a failed lane."""

    code = "operation-failed"


class CommandFailed(OperationError):
    """A command profile's CLI exited with a status another attempt would only repeat
    (:data:`cairn.protocol.agent.DETERMINISTIC_EXIT_STATUSES`)."""

    code = "command-failed"


class ReviewedAgent(TypedDict, total=False):
    """One agent of the reviewed manifest, as the launch description's JSON holds it
    (:class:`cairn.workflow.review.AgentEntry` dumped)."""

    profile: str
    access: Literal["read", "write"]
    network: str
    output: str
    allowlist: list[str]


class ReviewedSite(TypedDict, total=False):
    """One call site of the reviewed manifest, as the launch description's JSON holds it
    (:class:`cairn.workflow.review.CallSite` dumped)."""

    kind: str
    line: int
    col: int
    descriptor: str | None
    answer_schema: str | None
    capabilities: list[str]
