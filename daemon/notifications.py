"""What the caller's notifier (``cairn notify follow``, a user unit) asks cairnd: the
caller's runs that started waiting for a person, failed or succeeded after its cursor,
as :class:`~cairn.protocol.notify.NotifyEvent` (one per journal event)."""

from __future__ import annotations

from typing import Any

from cairn.journal import EventRow, Journal
from cairn.protocol.daemon import NotificationsRequest
from cairn.protocol.notify import EVENT_OF_KIND, NotifyBatch, NotifyEvent, WaitingItem

BATCH = 100


def waiting_items(journal: Journal, run_id: str) -> list[WaitingItem]:
    """The questions and approval requests the run waits for now."""
    questions = [
        WaitingItem(
            kind="question",
            op_id=q.op_id,
            question=q.question,
            command=f"cairn answer {run_id} --challenge {q.challenge} VALUE",
        )
        for q in journal.questions(run_id)
        if q.state == "waiting"
    ]
    approvals = [
        WaitingItem(
            kind="approval",
            op_id=a.op_id,
            request_id=a.request_id,
            command=f"cairn approve {run_id} {a.request_id} --fingerprint {a.fingerprint}",
        )
        for a in journal.approvals(run_id)
        if a.state == "waiting"
    ]
    return questions + approvals


def notify_event(journal: Journal, event: EventRow) -> NotifyEvent:
    run = journal.get_run(event.run_id)
    kind = EVENT_OF_KIND[event.event]
    waiting = waiting_items(journal, run.run_id) if kind == "waiting" else []
    if kind == "waiting":
        first = waiting[0] if waiting else None
        what = (first.question or f"approval {first.request_id}") if first else "a person"
        summary = f"{run.run_id} waits for you: {what}"
    elif kind == "failed":
        summary = f"{run.run_id} failed: {run.error or 'see cairn show'}"
    else:
        summary = f"{run.run_id} succeeded"
    return NotifyEvent(
        event=kind,
        cursor=event.cursor,
        at=event.at,
        run_id=run.run_id,
        definition=run.definition,
        state=run.state,
        error=run.error,
        waiting=waiting,
        summary=summary[:500],
    )


def notifications(journal: Journal, request: NotificationsRequest, uid: int) -> dict[str, Any]:
    """The caller's notifications after ``request.cursor``; a negative one starts now."""
    if request.cursor < 0:
        return NotifyBatch(events=[], cursor=journal.last_event_cursor()).model_dump(mode="json")
    events, cursor = journal.owner_events(uid, EVENT_OF_KIND, after=request.cursor, limit=BATCH)
    batch = NotifyBatch(
        events=[notify_event(journal, e) for e in events], cursor=cursor, more=len(events) == BATCH
    )
    return batch.model_dump(mode="json")


def handle(journal: Journal, request: NotificationsRequest, uid: int, _fd: int | None) -> Any:
    """cairnd's handler of ``notifications`` (no descriptor is passed with it)."""
    return notifications(journal, request, uid)
