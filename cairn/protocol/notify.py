"""cairnd → the user's notifier → the user's hooks: what a hook reads on its stdin when a
run starts waiting for a person, fails, or succeeds
(``/usr/share/doc/cairn/docs/notifications.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NotifyKind = Literal["waiting", "blocked", "failed", "succeeded"]
NOTIFY_VERSION: Literal[1] = 1

# The journal events notifications come from: each question and each approval request
# the moment it opens (also while other lanes of the run go on), a run that stops
# blocked for a person's decision, and the run's end.
EVENT_OF_KIND: dict[str, NotifyKind] = {
    "question-asked": "waiting",
    "approval-requested": "waiting",
    "run-blocked": "blocked",
    "run-failed": "failed",
    "run-succeeded": "succeeded",
}


class WaitingItem(BaseModel):
    """One thing the run waits for — a question, an approval request, or (``blocked``)
    a decision on an operation or on the run's storage — with the command to run next
    (``command``) and every command that decides it (``commands``, that one first)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    kind: Literal["question", "approval", "blocked"]
    op_id: str | None = None
    question: str | None = None
    request_id: str | None = None
    deadline: float | None = None
    reason: str | None = None
    command: str
    commands: list[str] = []


class NotifyEvent(BaseModel):
    """One notification. ``cursor`` orders them and is unique per host; a hook may see the
    same one twice only if the notifier was stopped while the hook ran."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    version: Literal[1] = NOTIFY_VERSION
    event: NotifyKind
    cursor: int = Field(ge=1)
    at: float
    run_id: str
    definition: str
    state: str
    error: str | None = None
    waiting: list[WaitingItem] = []
    summary: str = Field(max_length=500)


class NotifyBatch(BaseModel):
    """cairnd's answer to the notifier: events after its cursor and the cursor to ask
    from next time."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    events: list[NotifyEvent]
    cursor: int = Field(ge=0)
    more: bool = False
