"""What the caller's notifier (``cairn notify follow``, a user unit) asks cairnd: the
caller's runs that started waiting for a person, were blocked, failed or succeeded after
its cursor,
as :class:`~cairn.protocol.notify.NotifyEvent` (one per journal event)."""

from __future__ import annotations

from typing import Any

from cairn.daemon.attention import approval_item, blocked_items, question_item
from cairn.journal.readwrite import Journal
from cairn.journal.rows import EventRow
from cairn.protocol.daemon import NotificationsRequest
from cairn.protocol.notify import EVENT_OF_KIND, NotifyBatch, NotifyEvent, WaitingItem

BATCH = 100


def waiting_items(journal: Journal, event: EventRow) -> list[WaitingItem]:
    """What ``event`` asks a person for: the question or approval request it opened, or
    what a blocked run needs, each with the commands that decide it."""
    run_id = event.run_id
    if event.event == "run-blocked":
        return blocked_items(journal, journal.get_run(run_id))
    if event.event == "question-asked" and event.op_id is not None:
        question = journal.question(run_id, event.op_id)
        return [] if question is None else [question_item(run_id, question)]
    approval = journal.approval(run_id, str(event.data.get("request_id")))
    return [] if approval is None else [approval_item(run_id, approval)]


def notify_event(journal: Journal, event: EventRow) -> NotifyEvent:
    run = journal.get_run(event.run_id)
    kind = EVENT_OF_KIND[event.event]
    items = waiting_items(journal, event) if kind in ("waiting", "blocked") else []
    if kind == "waiting":
        item = items[0] if items else None
        what = (item.question or f"approval {item.request_id}") if item else "a person"
        summary = f"{run.run_id} waits for you: {what}"
        if item:
            summary += f"; next: {item.command}"
    elif kind == "blocked":
        next_step = f"; next: {items[0].command}" if items else ""
        summary = f"{run.run_id} is blocked: {run.error or 'see cairn show'}{next_step}"
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
        waiting=items,
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


def handle(journal: Journal, request: NotificationsRequest, uid: int, _fd: int | None) -> object:
    """cairnd's handler of ``notifications`` (no descriptor is passed with it)."""
    return notifications(journal, request, uid)
