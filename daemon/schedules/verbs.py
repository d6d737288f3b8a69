"""The schedule verbs: create (review challenge), confirm, resume, pause and delete;
list, inspect and the inbox; and the reconciler a user manager runs at start."""

from __future__ import annotations

import logging
import secrets
from typing import Literal

from pydantic import ValidationError

from cairn.daemon import launch
from cairn.daemon.schedules.admission import (
    current_review_hash,
    repair_half_prepared,
    scheduled_review,
    sync_outcomes,
)
from cairn.daemon.schedules.store import Store, schedule_lock
from cairn.daemon.schedules.views import (
    OCCURRENCE_LIMIT,
    next_elapses,
    occurrence,
    schedule_view,
    used,
    view,
)
from cairn.errors import NotFound, PermissionDenied, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import (
    ScheduleConfirmRequest,
    ScheduleCreateRequest,
    ScheduleRequest,
    ScheduleResumeRequest,
)
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.replies import (
    EnabledSchedule,
    QueuedOccurrence,
    ScheduleDetail,
    ScheduleInboxItem,
    ScheduleReconcileReply,
)
from cairn.schedules import (
    CHALLENGE_RE,
    Action,
    ScheduleConfirm,
    ScheduleCreate,
    ScheduleSpec,
    elapses_after,
    format_instant,
    normalize_calendar,
    parse_instant,
    parse_timespan,
    project_identity,
    review_challenge,
)
from cairn.validation import invalid

log = logging.getLogger(__name__)


def create(
    store: Store, request: ScheduleCreateRequest, uid: int, fd: int | None
) -> JSONObject:
    """Store a new schedule (or a new revision of one) paused, with its review challenge."""
    try:
        body = ScheduleCreate.model_validate(request.schedule)
    except ValidationError as exc:
        raise invalid(exc, "schedule") from exc
    if uid == 0:
        raise PermissionDenied("schedules do not run as root", hint="create it as a normal user")
    review = scheduled_review(body.definition, request.source, request.confirm)
    args = launch.validate_args(review, body.args)
    project = launch.check_project(request.project, fd, uid)
    assert fd is not None
    dev, ino = project_identity(fd)
    resolved = launch.resolve_profiles(review, body.scripted)
    now = store.clock()
    valid_until = parse_instant(body.valid_until)
    if valid_until <= now:
        raise UsageError(
            f"valid-until {format_instant(valid_until)} is in the past",
            hint="give a future instant, e.g. --valid-until 2030-01-01T00:00:00Z",
        )
    spec = ScheduleSpec(
        name=body.name,
        owner_uid=uid,
        definition=body.definition,
        review_hash=review.review_hash,
        args=args,
        project=project.root,
        project_dev=dev,
        project_ino=ino,
        calendar=normalize_calendar(body.calendar, body.timezone),
        timezone=body.timezone,
        catch_up=body.catch_up,
        max_runs=body.max_runs,
        valid_until=valid_until,
        min_spacing_sec=parse_timespan(body.min_spacing),
        overlap=body.overlap,
        profiles={name: resolved[name] for name in sorted(body.scripted)},
    )
    if not elapses_after(spec.calendar, now, 1):
        raise UsageError(
            f"calendar {spec.calendar!r} never elapses again",
            hint="give a calendar with a future elapse",
        )
    existing = store.by_name(uid, body.name)
    action: Action
    with store.transaction() as db:
        if existing is None:
            if body.replace:
                raise NotFound(f"no schedule named {body.name} to replace")
            schedule_id, revision, action = secrets.token_hex(6), 1, "create"
            db.execute(
                "INSERT INTO schedules (schedule_id, owner_uid, name, status, revision,"
                " created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                (schedule_id, uid, body.name, "paused", revision, now, now),
            )
        else:
            if not body.replace:
                raise UsageError(
                    f"a schedule named {body.name} exists ({existing.schedule_id})",
                    hint="pass --replace to review a new revision of it",
                )
            schedule_id, revision, action = existing.schedule_id, existing.revision + 1, "replace"
            db.execute(
                "UPDATE schedules SET status='paused', revision=?, updated_at=?"
                " WHERE schedule_id=?",
                (revision, now, schedule_id),
            )
        challenge = review_challenge(schedule_id, revision, action, spec)
        db.execute(
            "INSERT INTO revisions (schedule_id, revision, action, spec, challenge, created_at)"
            " VALUES (?,?,?,?,?,?)",
            (schedule_id, revision, action, spec.model_dump_json(), challenge, now),
        )
    log.info("schedule %s revision %d created by uid %d, paused", schedule_id, revision, uid)
    return {
        **view(store, store.owned(schedule_id, uid)),
        "action": action,
        "challenge": challenge,
        "review_hash": spec.review_hash,
        "args": spec.args,
        "profiles": {name: p.model_dump(mode="json") for name, p in spec.profiles.items()},
        "next_elapses": list(next_elapses(spec, store.clock())),
    }


def confirm(store: Store, request: ScheduleConfirmRequest, uid: int) -> JSONObject:
    """Accept the revision whose challenge the person typed; it stays paused."""
    action = ScheduleConfirm.model_validate(request.schedule).action
    challenge = request.challenge or ""
    if not CHALLENGE_RE.match(challenge):
        raise UsageError(f"invalid challenge {challenge!r}", hint="copy it from 'schedule create'")
    found = store.db.execute(
        "SELECT r.schedule_id, r.revision, r.action FROM revisions r"
        " JOIN schedules s USING (schedule_id) WHERE r.challenge=? AND s.owner_uid=?",
        (challenge, uid),
    ).fetchone()
    if found is None:
        raise NotFound("no schedule revision has this challenge", hint="see 'cairn schedule list'")
    if found["action"] != action:
        raise UsageError(
            f"this challenge confirms a {found['action']}, not a {action}",
            hint=f"cairn schedule confirm {found['action']} {challenge}",
        )
    with schedule_lock(found["schedule_id"]):
        row = store.owned(found["schedule_id"], uid)
        if row.status == "deleted":
            raise NotFound(f"schedule {row.schedule_id} was deleted")
        if found["revision"] != row.revision:
            raise UsageError(
                f"stale challenge: schedule {row.schedule_id} is at revision {row.revision}",
                hint="confirm the challenge of the latest revision",
            )
        now = store.clock()
        with store.transaction() as db:
            db.execute(
                "UPDATE revisions SET confirmed_at=? WHERE schedule_id=? AND revision=?",
                (now, row.schedule_id, row.revision),
            )
            db.execute(
                "UPDATE schedules SET confirmed_revision=?, updated_at=? WHERE schedule_id=?",
                (row.revision, now, row.schedule_id),
            )
        log.info("schedule %s revision %d confirmed", row.schedule_id, row.revision)
        return view(store, store.owned(row.schedule_id, uid))


def resume(
    store: Store, journal: Journal, request: ScheduleResumeRequest, uid: int, fd: int | None
) -> JSONObject:
    """Check the confirmed revision once more and enable future occurrences."""
    with schedule_lock(request.schedule_id or ""):
        row = store.owned(request.schedule_id, uid)
        if row.status == "deleted":
            raise NotFound(f"schedule {row.schedule_id} was deleted")
        if row.confirmed_revision != row.revision:
            raise UsageError(
                f"revision {row.revision} of schedule {row.schedule_id} is not confirmed",
                hint=f"cairn schedule confirm {store.challenge(row.schedule_id, row.revision)}",
            )
        spec = store.spec(row.schedule_id, row.revision)
        now = store.clock()
        problems = []
        if now >= spec.valid_until:
            problems.append(f"valid-until {format_instant(spec.valid_until)} has passed")
        if used(store, row.schedule_id, row.revision) >= spec.max_runs:
            problems.append(f"max-runs {spec.max_runs} reached")
        changed = current_review_hash(spec, request.source, request.source_error)[1]
        if changed is not None:
            problems.append(changed)
        if fd is None or project_identity(fd) != (spec.project_dev, spec.project_ino):
            problems.append(f"project {spec.project} is not the reviewed directory")
        if problems:
            raise UsageError(
                f"schedule {row.schedule_id} cannot resume: {'; '.join(problems)}",
                hint="renew it: cairn schedule create NAME … --replace, then confirm",
            )
        with store.transaction() as db:
            db.execute(
                "UPDATE schedules SET status='enabled', enabled_at=coalesce(?, enabled_at),"
                " launch_failures=0, blocked_reason=NULL, updated_at=? WHERE schedule_id=?",
                (None if row.status == "enabled" else now, now, row.schedule_id),
            )
        log.info("schedule %s revision %d enabled", row.schedule_id, row.revision)
        enabled = EnabledSchedule(
            **dict(schedule_view(store, store.owned(row.schedule_id, uid))),
            next_elapses=next_elapses(spec, store.clock()),
        )
        return enabled.model_dump(mode="json")


def set_status(
    store: Store, request: ScheduleRequest, uid: int, status: Literal["paused", "deleted"]
) -> JSONObject:
    """Pause or delete: future occurrences are refused; runs already created continue."""
    with schedule_lock(request.schedule_id or ""):
        row = store.owned(request.schedule_id, uid)
        if row.status == "deleted":
            raise NotFound(f"schedule {row.schedule_id} was deleted")
        with store.transaction() as db:
            db.execute(
                "UPDATE schedules SET status=?, updated_at=? WHERE schedule_id=?",
                (status, store.clock(), row.schedule_id),
            )
        log.info("schedule %s %s", row.schedule_id, status)
        return view(store, store.owned(row.schedule_id, uid))


def list_schedules(store: Store, journal: Journal, uid: int) -> list[JSONObject]:
    sync_outcomes(store, journal)
    return [view(store, row) for row in store.owned_by(uid)]


def inspect(store: Store, journal: Journal, request: ScheduleRequest, uid: int) -> JSONObject:
    sync_outcomes(store, journal)
    row = store.owned(request.schedule_id, uid)
    spec = store.spec(row.schedule_id, row.revision)
    occurrences = store.occurrences(row.schedule_id, limit=OCCURRENCE_LIMIT + 1)
    detail = ScheduleDetail(
        **dict(schedule_view(store, row)),
        review_hash=spec.review_hash,
        args=spec.args,
        profiles=sorted(spec.profiles),
        challenge=(
            store.challenge(row.schedule_id, row.revision)
            if row.confirmed_revision != row.revision
            else None
        ),
        next_elapses=(next_elapses(spec, store.clock()) if row.status == "enabled" else []),
        occurrences=[occurrence(o) for o in occurrences[:OCCURRENCE_LIMIT]],
        occurrences_omitted=len(occurrences) > OCCURRENCE_LIMIT,
    )
    return detail.model_dump(mode="json")


def inbox(store: Store, journal: Journal, uid: int) -> list[JSONObject]:
    sync_outcomes(store, journal)
    rows = store.db.execute(
        "SELECT i.*, s.name FROM inbox i JOIN schedules s USING (schedule_id)"
        " WHERE i.owner_uid=? ORDER BY i.item_id DESC LIMIT 200",
        (uid,),
    ).fetchall()
    return [
        ScheduleInboxItem(
            item_id=r["item_id"],
            schedule_id=r["schedule_id"],
            name=r["name"],
            kind=r["kind"],
            ref=r["ref"],
            message=r["message"],
            at=format_instant(r["created_at"]),
        ).model_dump(mode="json")
        for r in rows
    ]


def reconcile(store: Store, journal: Journal, uid: int) -> JSONObject:
    """Repair the caller's half-prepared occurrences; return what their user manager
    must hold (timers) and the queued occurrences to try again
    (:class:`ScheduleReconcileReply`)."""
    repaired = 0
    queued: list[QueuedOccurrence] = []
    for row in store.owned_by(uid):
        with schedule_lock(row.schedule_id):
            repaired += repair_half_prepared(store, journal, row)
        queued += [
            QueuedOccurrence(schedule_id=row.schedule_id, key=o.key)
            for o in store.occurrences(row.schedule_id, states=("queued",))
        ]
    sync_outcomes(store, journal)
    reply = ScheduleReconcileReply(
        schedules=[schedule_view(store, row) for row in store.owned_by(uid)],
        repaired=repaired,
        queued=queued,
    )
    return reply.model_dump(mode="json")
