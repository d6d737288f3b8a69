"""``cairn schedule``: recurring runs as systemd user timers.

cairnd holds the schedules and decides every occurrence; this side runs as the user and
does what only the user can: open the project directory (the proof of access cairnd
checks), and install, check and remove the timer in the user's own systemd manager.
"""


import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import click

from cairn.cli.attest import Expected
from cairn.cli.client import emit, fail, list_or_empty, request, typed
from cairn.cli.completion import schedule_candidates
from cairn.cli.launching import load_scripted
from cairn.cli.options import (
    CairnGroup,
    args_option,
    argument,
    completes,
    confirm_or_stop,
    definition_argument,
    dry_run_flag,
    echo,
    emit_or_empty,
    hidden_alias,
    json_flag,
    renamed,
    scripted_option,
    would,
    yes_flag,
)
from cairn.cli.timers import (
    apply_timers,
    install_timer,
    installed_timer_ids,
    linger_enabled,
    linger_hint,
    remove_timer,
    timer_path,
    timer_state,
)
from cairn.errors import CairnError, UsageError

if TYPE_CHECKING:
    from cairn.protocol.daemon import (
        ScheduleDeleteRequest,
        ScheduleFireRequest,
        SchedulePauseRequest,
        ScheduleRunNowRequest,
    )
    from cairn.protocol.jsonvalue import JSONValue
    from cairn.protocol.replies import OccurrenceDecision, ScheduleReview

schedule_app = CairnGroup(
    "schedule",
    help="Recurring runs as systemd user timers, with reviewed, finite permission.",
    no_args_is_help=True,
)

schedule_id_argument = argument(
    "schedule_id",
    metavar="ID",
    help="The schedule ID.",
    shell_complete=completes(schedule_candidates),
)

QUEUE_POLL_SEC = 5.0


def _open_project(path: str | Path) -> int:
    root = Path(path).expanduser().absolute()
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"project {root} not found") from None
    except NotADirectoryError:
        raise UsageError(f"project {root} is not a directory") from None
    except PermissionError:
        raise UsageError(f"project {root} is not readable by you") from None


def _check_id(schedule_id: str) -> str:
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import SCHEDULE_ID_RE

    if not SCHEDULE_ID_RE.match(schedule_id):
        fail(f"invalid schedule ID {schedule_id!r}", hint="see 'cairn schedule list'", code=2)
    return schedule_id


def _sends_source(definition: str | None) -> bool:
    return definition is not None and definition.startswith(("user:", "project:"))


def _pinned_source(definition: str, fd: int, project: str) -> tuple[str | None, str | None]:
    """(source, review hash) of a ``user:`` or ``project:`` definition as installed or
    trusted now, which cairnd pins (create) or checks against its pin (resume, fire);
    (None, None) for a builtin, which cairnd reads itself."""
    if definition.endswith(".py"):
        fail(
            f"{definition} is a file; schedules take installed definitions",
            hint=f"install it with 'cairn workflow install {definition} --confirm sha256:…' "
            "and schedule user:NAME",
            code=2,
        )
    if not _sends_source(definition):
        return None, None
    # here, not at the top: every cairn command would pay for this import
    from cairn.definitions.resolve import for_launch

    return for_launch(definition, fd, project)


def _current_source(
    definition: str, project: str, fd: int | None
) -> tuple[str | None, str | None]:
    """(source, None) of the schedule's ``definition`` as installed or trusted now, or
    (None, why it cannot be read): cairnd blocks the schedule with that reason."""
    if not _sends_source(definition):
        return None, None
    if fd is None:
        return None, f"project {project} cannot be opened"
    try:
        return _pinned_source(definition, fd, project)[0], None
    except CairnError as exc:
        echo(f"cairn: {exc.message}", err=True)
        return None, exc.message[:500]


def _print_review(result: "ScheduleReview") -> None:
    echo(
        f"schedule {result.schedule_id}  {result.name}  revision {result.revision}"
        "  (paused, awaiting confirmation)"
    )
    echo(f"  definition  {result.definition}  review {result.review_hash}")
    echo(f"  project     {result.project}")
    echo(f"  arguments   {json.dumps(result.args, sort_keys=True)}")
    echo(f"  calendar    {result.calendar}  (timezone {result.timezone})")
    echo(f"  next        {', '.join(result.next_elapses)}")
    persistent = "yes" if result.catch_up == "once" else "no"
    echo(f"  catch-up    {result.catch_up} (Persistent={persistent})")
    echo(f"  overlap     {result.overlap}; min spacing {result.min_spacing_sec}s")
    echo(f"  lease       at most {result.max_runs} runs, until {result.valid_until}")
    for name, profile in sorted(result.profiles.items()):
        echo(f"  profile     {name}: scripted, {len(profile.steps)} steps")
    echo("confirm exactly this with:")
    echo(f"  cairn schedule confirm {result.action} {result.challenge}")


@schedule_app.command("create")
@argument("name", help="A name for the schedule, e.g. nightly-review.")
@definition_argument
@click.option(
    "--project",
    type=click.Path(path_type=Path),
    help="The project directory (yours).",
    required=True,
)
@click.option("--calendar", help="systemd calendar, e.g. '*-*-* 09:00:00'.", required=True)
@click.option("--timezone", help="Timezone of the calendar, e.g. UTC.", required=True)
@click.option(
    "--catch-up",
    help="once: run one missed occurrence at the next start; none.",
    required=True,
)
@click.option("--max-runs", type=int, help="At most this many runs.", required=True)
@click.option("--valid-until", help="ISO 8601 instant, e.g. 2028-01-01T00:00Z.", required=True)
@args_option
@click.option("--min-spacing", help="Minimum time between launches.", default="0")
@click.option(
    "--overlap",
    help="skip: refuse while a run is active; queue-one: keep one.",
    default="skip",
)
@scripted_option
@click.option(
    "--replace",
    help="Review a new revision of an existing schedule.",
    is_flag=True,
)
@json_flag
def create(
    name: str,
    definition: str,
    project: Path,
    calendar: str,
    timezone: str,
    catch_up: str,
    max_runs: int,
    valid_until: str,
    args: str = "{}",
    min_spacing: str = "0",
    overlap: str = "skip",
    scripted: tuple[str, ...] = (),
    replace: bool = False,
    json_out: bool = False,
) -> None:
    """Store a schedule paused and print the review challenge to confirm.

    Example: cairn schedule create nightly builtin:implement --project ~/src/demo --args
    '{"objective": "update the changelog"}' --calendar 'Mon..Fri 02:00' --timezone UTC
    --catch-up none --max-runs 100 --valid-until 2028-01-01T00:00:00Z
    """
    from cairn.protocol.daemon import ScheduleCreateRequest
    from cairn.protocol.replies import ScheduleReview

    try:
        parsed = json.loads(args)
    except json.JSONDecodeError as exc:
        fail(f"--args is not JSON: {exc.msg} (column {exc.colno})", code=2)
    if not isinstance(parsed, dict):
        fail("--args must be a JSON object", code=2)
    root = os.path.normpath(str(project.expanduser().absolute()))
    profiles = json.loads(json.dumps(load_scripted(scripted)))
    fd = _open_project(project)
    try:
        source, review_hash = _pinned_source(definition, fd, root)
        sent = request(
            ScheduleCreateRequest(
                project=root,
                source=source,
                confirm=review_hash,
                schedule={
                    "name": name,
                    "definition": definition,
                    "args": parsed,
                    "calendar": calendar,
                    "timezone": timezone,
                    "catch_up": catch_up,
                    "max_runs": max_runs,
                    "valid_until": valid_until,
                    "min_spacing": min_spacing,
                    "overlap": overlap,
                    "scripted": profiles,
                    "replace": replace,
                },
            ),
            fd=fd,
        )
    finally:
        os.close(fd)
    result = typed(ScheduleReview, sent)
    # here, not at the top: every cairn command would pay for this import
    from cairn.cli import schedulepins

    schedulepins.record_pending(
        schedulepins.SchedulePin(
            schedule_id=result.schedule_id,
            revision=result.revision,
            project=root,
            definition=definition,
            review_hash=review_hash,
            args=parsed,
            scripted=profiles,
        )
    )
    if json_out:
        emit(sent)
    else:
        _print_review(result)


@schedule_app.command("confirm")
@argument("action", help="create or replace")
@argument("challenge", help="sha256:… as printed by create")
@json_flag
def confirm(
    action: str,
    challenge: str,
    json_out: bool = False,
) -> None:
    """Confirm a reviewed schedule revision; it stays paused until 'resume'.

    Example: cairn schedule confirm create sha256:...
    """
    # here, not at the top: every cairn command would pay for these imports
    from cairn.cli import schedulepins
    from cairn.protocol.daemon import ScheduleConfirmRequest
    from cairn.protocol.replies import ScheduleView

    sent = request(ScheduleConfirmRequest(challenge=challenge, schedule={"action": action}))
    result = typed(ScheduleView, sent)
    if not schedulepins.confirm(result.schedule_id, result.revision):
        echo(
            f"cairn: note: revision {result.revision} of schedule {result.schedule_id} "
            "was not sent by this account's cairn: its launches are checked against cairnd's "
            "record, not a pin of yours; pin it with 'cairn schedule create … --replace'",
            err=True,
        )
    if json_out:
        emit(sent)
        return
    echo(f"schedule {result.schedule_id} revision {result.revision} confirmed")
    echo(f"enable it with: cairn schedule resume {result.schedule_id}")


@schedule_app.command("resume")
@schedule_id_argument
@json_flag
def resume(schedule_id: str, json_out: bool = False) -> None:
    """Check the schedule once more and install its user timer.

    Example: cairn schedule resume 0123456789ab
    """
    from cairn.protocol.daemon import ScheduleInspectRequest, ScheduleResumeRequest
    from cairn.protocol.replies import EnabledSchedule, ScheduleDetail

    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    _check_id(schedule_id)
    current = typed(ScheduleDetail, request(ScheduleInspectRequest(schedule_id=schedule_id)))
    fd = _open_project(current.project)
    try:
        source, source_error = _current_source(current.definition, current.project, fd)
        sent = request(
            ScheduleResumeRequest(
                schedule_id=schedule_id, source=source, source_error=source_error
            ),
            fd=fd,
        )
    finally:
        os.close(fd)
    result = typed(EnabledSchedule, sent)
    install_timer(schedule_id, result.timer)
    if json_out:
        emit(sent)
        return
    echo(f"schedule {schedule_id} enabled: {timer_name(schedule_id)}")
    echo(f"next: {', '.join(result.next_elapses)}")
    if not linger_enabled():
        echo(f"note: {linger_hint()}", err=True)


def _stop(
    schedule_id: str,
    kind: "type[SchedulePauseRequest | ScheduleDeleteRequest]",
    verb: str,
    json_out: bool,
) -> None:
    from cairn.protocol.replies import ScheduleView

    _check_id(schedule_id)
    sent = request(kind(schedule_id=schedule_id))
    remove_timer(schedule_id)
    if verb == "deleted":
        # here, not at the top: every cairn command would pay for this import
        from cairn.cli import schedulepins

        schedulepins.forget(schedule_id)
    # read only now: cairnd has paused (deleted) the schedule whatever its reply says, so
    # its timer and pin go either way
    typed(ScheduleView, sent)
    if json_out:
        emit(sent)
    else:
        echo(f"schedule {schedule_id} {verb}; runs already created continue")


@schedule_app.command("pause")
@schedule_id_argument
@json_flag
def pause(schedule_id: str, json_out: bool = False) -> None:
    """Refuse future occurrences and remove the timer.

    Example: cairn schedule pause 0123456789ab
    """
    from cairn.protocol.daemon import SchedulePauseRequest

    _stop(schedule_id, SchedulePauseRequest, "paused", json_out)


@schedule_app.command("rm")
@schedule_id_argument
@dry_run_flag
@yes_flag
@json_flag
def rm(
    schedule_id: str,
    dry_run: bool = False,
    yes: bool = False,
    json_out: bool = False,
) -> None:
    """Delete the schedule (future launches only) and its timer; also 'schedule delete'.

    Example: cairn schedule rm 0123456789ab
    """
    from cairn.protocol.daemon import ScheduleDeleteRequest

    _check_id(schedule_id)  # a malformed ID is refused before anything is asked
    if dry_run:
        from cairn.protocol.daemon import ScheduleInspectRequest
        from cairn.protocol.replies import ScheduleDetail

        shown = typed(ScheduleDetail, request(ScheduleInspectRequest(schedule_id=schedule_id)))
        would(f"delete schedule {schedule_id} ({shown.name}, {shown.status}) and its "
              "timer; the runs it launched stay")
    confirm_or_stop(
        f"Delete schedule {schedule_id} and its timer? The runs it launched stay.", yes=yes
    )
    _stop(schedule_id, ScheduleDeleteRequest, "deleted", json_out)


@schedule_app.command("list")
@json_flag
def list_(json_out: bool = False) -> None:
    """Your schedules: state, calendar, lease used.

    Example: cairn schedule list
    """
    from cairn.protocol.daemon import ScheduleListRequest
    from cairn.protocol.replies import ScheduleListReply

    sent = request(ScheduleListRequest())
    views = typed(ScheduleListReply, {"schedules": sent}).schedules
    if emit_or_empty(list_or_empty(sent), json_out, empty="no schedules"):
        return
    for v in views:
        status = v.status + (" (awaiting confirmation)" if v.awaiting_confirmation else "")
        echo(
            f"{v.schedule_id} · {v.name} · {status} · {v.calendar}"
            f" · {v.runs_used}/{v.max_runs} runs until {v.valid_until}"
        )


@schedule_app.command("show")
@schedule_id_argument
@json_flag
def show(schedule_id: str, json_out: bool = False) -> None:
    """Everything about one schedule, with its recent occurrences.

    Example: cairn schedule show 0123456789ab
    """
    from cairn.protocol.daemon import ScheduleInspectRequest
    from cairn.protocol.replies import ScheduleDetail

    _check_id(schedule_id)
    sent = request(ScheduleInspectRequest(schedule_id=schedule_id))
    v = typed(ScheduleDetail, sent)
    if json_out:
        emit(sent)
        return
    echo(f"schedule {v.schedule_id}  {v.name}  {v.status}")
    echo(f"  revision    {v.revision} (confirmed: {v.confirmed_revision or '-'})")
    if v.challenge:
        echo(f"  confirm     cairn schedule confirm {v.challenge}")
    echo(f"  definition  {v.definition}  review {v.review_hash}")
    echo(f"  project     {v.project}")
    echo(f"  arguments   {json.dumps(v.args, sort_keys=True)}")
    echo(f"  calendar    {v.calendar}  catch-up {v.catch_up}")
    echo(f"  overlap     {v.overlap}; min spacing {v.min_spacing_sec}s")
    echo(f"  lease       {v.runs_used}/{v.max_runs} runs, until {v.valid_until}")
    if v.next_elapses:
        echo(f"  next        {', '.join(v.next_elapses)}")
    if v.blocked_reason:
        echo(f"  blocked     {v.blocked_reason}")
    echo(f"  timer       {v.timer_unit}")
    echo("occurrences:")
    for o in v.occurrences:
        run_part = f"  {o.run_id} {o.run_state or ''}" if o.run_id else ""
        echo(
            f"  {o.at}  {o.trigger:<8} r{o.revision}  {o.state:<13}"
            f" {o.reason}{run_part}"
        )
    if v.occurrences_omitted:
        echo("  (older occurrences omitted)")


def _admit(
    kind: "type[ScheduleFireRequest | ScheduleRunNowRequest]",
    schedule_id: str,
    *,
    occurrence: str | None = None,
    wait: bool = True,
) -> "tuple[JSONValue, OccurrenceDecision]":
    """Ask cairnd to admit one occurrence, proving access to the project with an open
    directory; with ``wait``, ask again while it is queued behind the schedule's own run.
    Returns the decision as sent and as read."""
    # here, not at the top: every cairn command would pay for these imports
    from cairn.cli import schedulepins
    from cairn.protocol.daemon import ScheduleInspectRequest
    from cairn.protocol.replies import OccurrenceDecision, ScheduleDetail

    pin = schedulepins.pinned(schedule_id)
    if pin is not None:
        project, definition, review_hash = pin.project, pin.definition, None
    else:
        shown = typed(ScheduleDetail, request(ScheduleInspectRequest(schedule_id=schedule_id)))
        project, definition, review_hash = shown.project, shown.definition, shown.review_hash
        echo(f"cairn: schedule {schedule_id} has no pin of yours; its launch is checked "
             "against cairnd's record", err=True)
    while True:
        try:
            fd: int | None = _open_project(project)
        except UsageError as exc:
            echo(f"cairn: {exc.message}", err=True)
            fd = None
        try:
            source, source_error = _current_source(definition, project, fd)
            if pin is not None:
                expected = pin.expected().replace(source=source)
            else:
                expected = Expected(
                    schedule_id=schedule_id,
                    project=project,
                    definition=definition,
                    # a user: or project: definition launches only as pinned and as sent
                    review_hash=review_hash if source is not None else None,
                    source=source,
                )
            sent = request(
                kind(
                    schedule_id=schedule_id,
                    occurrence=occurrence,
                    source=source,
                    source_error=source_error,
                ),
                fd=fd,
                expect=expected,
            )
        finally:
            if fd is not None:
                os.close(fd)
        result = typed(OccurrenceDecision, sent)
        if result.outcome != "queued" or not wait:
            return sent, result
        if occurrence is None:
            echo(f"{schedule_id} {result.key}: queued: {result.reason}")
        occurrence = str(result.key)
        time.sleep(QUEUE_POLL_SEC)


def _report(result: "OccurrenceDecision") -> str:
    key = "-" if result.key is None else result.key
    line = f"{result.schedule_id} {key}: {result.outcome}"
    line += f": {result.reason}"
    if result.run_id:
        line += f": {result.run_id}"
    return line


@schedule_app.command("fire", hidden=True)
@schedule_id_argument
def fire(schedule_id: str) -> None:
    """Run by cairn-schedule@ID.service when the timer elapses: ask for one occurrence."""
    from cairn.protocol.daemon import ScheduleFireRequest

    _check_id(schedule_id)
    _sent, result = _admit(ScheduleFireRequest, schedule_id)
    echo(_report(result))
    if result.outcome == "launch-failed" or result.blocked:
        raise click.exceptions.Exit(1)


@schedule_app.command("run-now")
@schedule_id_argument
@json_flag
def run_now(schedule_id: str, json_out: bool = False) -> None:
    """One occurrence now, under the same lease, spacing, overlap and machine limits.

    Example: cairn schedule run-now 0123456789ab
    """
    from cairn.protocol.daemon import ScheduleRunNowRequest

    _check_id(schedule_id)
    sent, result = _admit(ScheduleRunNowRequest, schedule_id)
    if json_out:
        emit(sent)
    elif result.outcome == "launched":
        echo(result.run_id)
    if result.outcome != "launched":
        fail(f"run-now {result.outcome}: {result.reason}")


@schedule_app.command("inbox")
@json_flag
def inbox(json_out: bool = False) -> None:
    """Scheduled runs that failed or wait for you, launch failures, blocked schedules.

    Example: cairn schedule inbox
    """
    from cairn.protocol.daemon import ScheduleInboxRequest
    from cairn.protocol.replies import ScheduleInboxReply

    sent = request(ScheduleInboxRequest())
    items = typed(ScheduleInboxReply, {"items": sent}).items
    if emit_or_empty(list_or_empty(sent), json_out, empty="inbox empty"):
        return
    for item in items:
        echo(f"{item.at}  {item.name} ({item.schedule_id})  {item.kind}: {item.message}")


class TimerCheck(TypedDict):
    """One schedule of ``cairn schedule doctor``: its timer as the user manager has it."""

    schedule_id: str
    name: str
    status: str
    timer_unit: str
    timer_file: str
    timer_present: bool
    timer_matches: bool | None
    active: str | None
    enabled: str | None
    last_trigger: str | None
    next_elapse: str | None
    blocked_reason: str | None
    problems: list[str]


class TimerReport(TypedDict):
    linger: bool
    schedules: list[TimerCheck]
    problems: list[str]


def doctor_report() -> TimerReport:
    """Compare cairnd's schedules with the user manager: timer file present and exactly as
    rendered, enabled and active; linger; last trigger, next elapse, blocked reason."""
    from cairn.protocol.daemon import ScheduleListRequest
    from cairn.protocol.replies import ScheduleListReply

    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    views = typed(ScheduleListReply, {"schedules": request(ScheduleListRequest())}).schedules
    problems: list[str] = []
    linger = linger_enabled()
    if not linger:
        problems.append(linger_hint())
    schedules: list[TimerCheck] = []
    known = set()
    for v in views:
        sid = v.schedule_id
        known.add(sid)
        path = timer_path(sid)
        present = path.exists()
        state = timer_state(sid)
        entry: TimerCheck = {
            "schedule_id": sid,
            "name": v.name,
            "status": v.status,
            "timer_unit": timer_name(sid),
            "timer_file": str(path),
            "timer_present": present,
            "timer_matches": None,
            "active": state.get("ActiveState"),
            "enabled": state.get("UnitFileState"),
            "last_trigger": state.get("LastTriggerUSec") or None,
            "next_elapse": state.get("NextElapseUSecRealtime") or None,
            "blocked_reason": v.blocked_reason,
            "problems": [],
        }
        if v.timer:
            if not present:
                entry["problems"].append(f"timer file {path} is missing")
            else:
                entry["timer_matches"] = path.read_text() == v.timer
                if not entry["timer_matches"]:
                    entry["problems"].append(f"timer file {path} differs from the schedule")
                if state.get("UnitFileState") != "enabled":
                    entry["problems"].append(f"{timer_name(sid)} is not enabled")
                if state.get("ActiveState") != "active":
                    entry["problems"].append(f"{timer_name(sid)} is not active")
        elif present:
            entry["problems"].append(f"stale timer file {path} for a {v.status} schedule")
        if v.blocked_reason:
            entry["problems"].append(f"blocked: {v.blocked_reason}")
        problems += [f"{sid}: {p}" for p in entry["problems"]]
        schedules.append(entry)
    for sid in installed_timer_ids():
        if sid not in known:
            problems.append(f"{sid}: stale timer file {timer_path(sid)} for no schedule of yours")
    return {"linger": linger, "schedules": schedules, "problems": problems}


@schedule_app.command("doctor")
@json_flag
def doctor(json_out: bool = False) -> None:
    """Check timers against schedules; exit 1 if anything needs repair.

    Example: cairn schedule doctor
    """
    report = doctor_report()
    if json_out:
        emit(report)
    else:
        echo(f"linger: {'enabled' if report['linger'] else 'NOT enabled'}")
        for s in report["schedules"]:
            echo(
                f"{s['schedule_id']} · {s['name']} · {s['status']} · timer "
                f"{'present' if s['timer_present'] else 'absent'}, {s['enabled']}, {s['active']}"
                f" · last {s['last_trigger'] or '-'} · next {s['next_elapse'] or '-'}"
            )
        for problem in report["problems"]:
            echo(f"problem: {problem}")
        if report["problems"]:
            echo("repair with: cairn schedule repair")
    if report["problems"]:
        raise click.exceptions.Exit(1)


@schedule_app.command("repair")
def repair() -> None:
    """Repair timers and half-prepared occurrences (run at user-manager start by
    cairn-schedule-reconcile.service); retry queued occurrences once.

    Example: cairn schedule repair
    """
    from cairn.protocol.daemon import ScheduleFireRequest, ScheduleReconcileRequest
    from cairn.protocol.replies import ScheduleReconcileReply

    result = typed(ScheduleReconcileReply, request(ScheduleReconcileRequest()))
    for line in apply_timers(v.model_dump(mode="json") for v in result.schedules):
        echo(line)
    if result.repaired:
        echo(f"repaired {result.repaired} half-prepared occurrence(s)")
    for queued in result.queued:
        try:
            _sent, retried = _admit(ScheduleFireRequest, queued.schedule_id,
                                    occurrence=queued.key, wait=False)
        except CairnError as exc:
            echo(f"{queued.schedule_id} {queued.key}: {exc.message}", err=True)
            continue
        echo(_report(retried))


# One removal verb everywhere (rm); the word people also type stays, hidden.
hidden_alias(schedule_app, rm, "delete")
# The names of an earlier release, hidden; each says what it is called now.
renamed(schedule_app, show, "schedule inspect", "schedule show")
renamed(schedule_app, repair, "schedule reconcile", "schedule repair")
