"""What the caller's notifier (``cairn notify follow``, a user unit) asks cairnd: the
caller's runs that started waiting for a person, failed or succeeded after its cursor,
as :class:`~cairn.protocol.notify.NotifyEvent` (one per journal event)."""

from __future__ import annotations

from typing import Any

from cairn.journal.readwrite import Journal
from cairn.journal.rows import EventRow
from cairn.protocol.daemon import NotificationsRequest
from cairn.protocol.notify import EVENT_OF_KIND, NotifyBatch, NotifyEvent, WaitingItem

BATCH = 100


def waiting_item(journal: Journal, event: EventRow) -> WaitingItem | None:
    """The question or approval request that ``event`` opened, with the command that
    answers it."""
    run_id = event.run_id
    if event.event == "question-asked" and event.op_id is not None:
        question = journal.question(run_id, event.op_id)
        if question is None:
            return None
        return WaitingItem(
            kind="question",
            op_id=question.op_id,
            question=question.question,
            command=f"cairn answer {run_id} --challenge {question.challenge} VALUE",
        )
    approval = journal.approval(run_id, str(event.data.get("request_id")))
    if approval is None:
        return None
    command = f"cairn approve {run_id} {approval.request_id} --fingerprint {approval.fingerprint}"
    return WaitingItem(
        kind="approval", op_id=approval.op_id, request_id=approval.request_id, command=command
    )


def notify_event(journal: Journal, event: EventRow) -> NotifyEvent:
    run = journal.get_run(event.run_id)
    kind = EVENT_OF_KIND[event.event]
    item = waiting_item(journal, event) if kind == "waiting" else None
    if kind == "waiting":
        what = (item.question or f"approval {item.request_id}") if item else "a person"
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
        waiting=[item] if item else [],
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
