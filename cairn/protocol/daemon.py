"""cairnd's socket: one request line from the CLI, one reply line back."""

from __future__ import annotations

from typing import Any, Literal

from cairn.protocol.base import Frozen
from cairn.protocol.launch import ProfileSpec


class DaemonRequest(Frozen):
    op: Literal[
        "launch",
        "reconcile",
        "retry",
        "doctor",
        "upgrade",
        "ps",
        "show",
        "logs",
        "diff",
        "ping",
        "schedule-create",
        "schedule-confirm",
        "schedule-resume",
        "schedule-pause",
        "schedule-delete",
        "schedule-list",
        "schedule-inspect",
        "schedule-fire",
        "schedule-run-now",
        "schedule-inbox",
        "schedule-reconcile",
        "inbox",
        "answer",
        "approve",
        "reject",
        "pause",
        "resume",
        "stop",
        "cancel",
        "watch",
    ]
    definition: str | None = None
    args: dict[str, Any] = {}
    project: str | None = None
    run_id: str | None = None
    scripted: dict[str, ProfileSpec] = {}
    all_users: bool = False
    # launch of a workflow file: its source (read by the client) and the review hash the
    # person confirmed for it
    source: str | None = None
    confirm: str | None = None
    limits: dict[str, int] = {}
    # reconcile / retry of an uncertain operation
    op_id: str | None = None
    result: dict[str, Any] | None = None
    no_effect: bool = False
    dry_run: bool = False
    # schedule-* ops: the schedule ID, a create/replace body (validated by
    # cairn.schedules.ScheduleCreate), a review challenge, a queued occurrence key.
    schedule_id: str | None = None
    schedule: dict[str, Any] = {}
    challenge: str | None = None
    occurrence: str | None = None
    # people in the loop: an answer as the person typed it (with ``challenge``), an
    # approval request with the fingerprint the person saw, a rejection reason, and the
    # event cursor a watcher has seen
    answer: str | None = None
    request_id: str | None = None
    fingerprint: str | None = None
    reason: str = ""
    cursor: int = 0


class ErrorBody(Frozen):
    code: str
    message: str
    hint: str | None = None


class DaemonReply(Frozen):
    ok: bool
    result: Any = None
    error: ErrorBody | None = None
