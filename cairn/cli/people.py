"""``cairn`` commands for people in the loop: inbox, answer, approve, reject, apply,
pause, resume, stop, cancel and watch. Added to the main app by :func:`register`."""


import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cairn.cli.client import fail, list_or_empty, request, typed
from cairn.cli.options import (
    add_commands,
    argument,
    confirm_or_stop,
    dry_run_flag,
    emit_or_empty,
    json_flag,
    run_argument,
    would,
    yes_flag,
)
from cairn.cli.watchview import follow
from cairn.terminal import printable

if TYPE_CHECKING:
    from cairn.protocol.daemon import ControlRequest
    from cairn.protocol.replies import InboxItem


def register(app: click.Group) -> None:
    """Add the commands to ``app`` (the main ``cairn`` app), in the order help lists them."""
    add_commands(
        app, inbox, answer, approve, reject, apply, pause, resume, stop, cancel, watch
    )


@click.option("--all", "all_users", help="Every user's (cairn-admin).", is_flag=True)
@json_flag
def inbox(all_users: bool = False, json_out: bool = False) -> None:
    """What waits for you, with the command to run next: questions, approval requests,
    proposals held for 'cairn apply', blocked runs, blocked schedules.

    Example: cairn inbox
    """
    from cairn.protocol.daemon import InboxRequest
    from cairn.protocol.replies import InboxReply

    sent = request(InboxRequest(all_users=all_users))
    items = typed(InboxReply, {"items": sent}).items
    if emit_or_empty(list_or_empty(sent), json_out, empty="nothing waits for you"):
        return
    for item in items:
        click.echo(render_item(item))


@run_argument
@click.option("--challenge", help="The question's challenge (sha256:…).", required=True)
@argument("value", metavar="[VALUE]", required=False)
@click.option("--file", type=click.Path(path_type=Path), help="Read the answer from FILE.")
def answer(
    run_id: str,
    challenge: str,
    value: str | None = None,
    file: Path | None = None,
) -> None:
    """Answer a run's question: JSON for a typed question, else text.

    Example: cairn answer 3fa9 'yes, use the staging database' --challenge sha256:...
    """
    from cairn.protocol.daemon import AnswerRequest
    from cairn.protocol.replies import AnswerReply

    if (value is None) == (file is None):
        fail("give exactly one of VALUE or --file FILE", code=2)
    text = value
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror}", code=2)
    out = typed(AnswerReply, request(
        AnswerRequest(run_id=run_id, challenge=challenge, answer=text)
    ))
    if out.outcome == "duplicate":
        click.echo(f"{printable(out.op_id)} already has this answer; nothing changed")
    else:
        resumes = "resumes" if out.woken else "continues when it is resumed"
        click.echo(f"{printable(out.op_id)} answered; {out.run_id} {resumes}")


@run_argument
@argument("request_id", metavar="REQ")
@click.option("--fingerprint", help="The fingerprint of the request you looked at.", required=True)
def approve(
    run_id: str,
    request_id: str,
    fingerprint: str,
) -> None:
    """Approve one prepared operation (checked again against the current policy).

    Example: cairn approve 3fa9 REQ --fingerprint sha256:...
    """
    from cairn.protocol.daemon import ApproveRequest
    from cairn.protocol.replies import ApprovalReply

    out = typed(ApprovalReply, request(
        ApproveRequest(run_id=run_id, request_id=request_id, fingerprint=fingerprint)
    ))
    click.echo(f"{printable(out.request_id)} approved; {out.run_id} resumes")


@run_argument
@argument("request_id", metavar="REQ")
@click.option("--reason", help="Why (recorded with the decision).", default="")
def reject(
    run_id: str,
    request_id: str,
    reason: str = "",
) -> None:
    """Reject one prepared operation: it does not run.

    Example: cairn reject 3fa9 REQ --reason 'not before the release'
    """
    from cairn.protocol.daemon import RejectRequest
    from cairn.protocol.replies import ApprovalReply

    out = typed(ApprovalReply, request(
        RejectRequest(run_id=run_id, request_id=request_id, reason=reason)
    ))
    click.echo(f"{printable(out.request_id)} rejected; the operation does not run")


@run_argument
def apply(run_id: str) -> None:
    """Settle a run launched with --apply ask: its proposal (see 'cairn diff RUN') goes
    to the live project with the three-way check.

    Example: cairn apply @last
    """
    from cairn.protocol.daemon import ApplyRequest
    from cairn.protocol.replies import ApprovalReply

    out = typed(ApprovalReply, request(ApplyRequest(run_id=run_id)))
    click.echo(f"{out.run_id}: proposal approved; it is applied now")


def _control(action: "type[ControlRequest]", run_id: str) -> None:
    from cairn.protocol.replies import ControlReply

    out = typed(ControlReply, request(action(run_id=run_id)))
    later = (
        f" (its coordinator acts on it at the next safe point; follow with 'cairn watch "
        f"{out.run_id}')"
        if out.outcome.endswith("requested")
        else ""
    )
    click.echo(f"{out.run_id}: {printable(out.outcome)}{later}")


@run_argument
def pause(run_id: str) -> None:
    """Pause at the next safe point; nothing of the run keeps running meanwhile.

    Example: cairn pause @last
    """
    from cairn.protocol.daemon import PauseRequest

    _control(PauseRequest, run_id)


@run_argument
def resume(run_id: str) -> None:
    """Resume a paused run (or withdraw a pause not yet honoured).

    Example: cairn resume @last
    """
    from cairn.protocol.daemon import ResumeRequest

    _control(ResumeRequest, run_id)


@run_argument
def stop(run_id: str) -> None:
    """Start no new operations; running agents finish; then the run ends stopped.

    Example: cairn stop @last
    """
    from cairn.protocol.daemon import StopRequest

    _control(StopRequest, run_id)


@run_argument
@dry_run_flag
@yes_flag
def cancel(run_id: str, dry_run: bool = False, yes: bool = False) -> None:
    """Cancel the run: it ends cancelled, running agents are stopped, waiting requests are
    withdrawn (at once when no coordinator holds the run, else at its next safe point).

    Example: cairn cancel 3fa9
    """
    from cairn.protocol.daemon import CancelRequest, ShowRequest
    from cairn.protocol.view_replies import ShowReply

    if dry_run:
        run = typed(ShowReply, request(ShowRequest(run_id=run_id))).run
        if run["state"] in ("succeeded", "failed", "cancelled", "stopped"):
            would(f"leave {run['run_id']} as it is: it already ended {run['state']}")
        would(f"cancel {run['run_id']} ({run['state']}): its running agents are stopped "
              "and it cannot be resumed")
    confirm_or_stop(
        f"Cancel run {run_id}? Its running agents are stopped and it cannot be resumed.",
        yes=yes,
    )
    _control(CancelRequest, run_id)


@run_argument
@click.option("--interval", type=float, help="Seconds between polls.", default=1.0)
@click.option("--json", "json_out", help="One JSON event per line.", is_flag=True)
def watch(
    run_id: str,
    interval: float = 1.0,
    json_out: bool = False,
) -> None:
    """Follow a run live (rebuilt from the journal); one line when it ends.

    Example: cairn watch @last
    """
    follow(run_id, interval=interval, json_out=json_out)


def render_item(item: "InboxItem") -> str:
    """An inbox item as lines: what waits and the commands that decide it. Every field a
    workflow or an agent could have shaped (the question, the prompt, names) is shown
    through :func:`~cairn.terminal.printable`; an item of a kind this CLI does not know
    is shown by its kind and commands."""
    from cairn.protocol.replies import (
        ApprovalItem,
        BlockedRunItem,
        BlockedScheduleItem,
        PreparedApply,
        PreparedApproval,
        QuestionItem,
    )

    commands = "".join(f"\n  {printable(c)}" for c in item.commands)
    if isinstance(item, BlockedScheduleItem):
        return (
            f"schedule {printable(item.name)} ({item.schedule_id}) blocked: "
            f"{printable(item.reason or 'launch failures')}{commands}"
        )
    if isinstance(item, BlockedRunItem):
        where = f" {printable(item.op_id)}" if item.op_id else ""
        reason = printable(item.reason or "see cairn show")
        return f"{item.run_id}{where} blocked: {reason}{commands}"
    if isinstance(item, QuestionItem):
        run = item.run_id
        schema = printable(item.schema_name or "text")
        return (
            f"{run} {printable(item.op_id)} question ({schema}): "
            f"{printable(item.question)}\n"
            f"  cairn answer {run} --challenge {printable(item.challenge)} VALUE"
        )
    if not isinstance(item, ApprovalItem):
        return f"{printable(item.kind)}{commands}"
    run = item.run_id
    prepared = item.prepared
    request_id = printable(item.request_id)
    deadline = datetime.datetime.fromtimestamp(item.deadline).strftime("%Y-%m-%d %H:%M")
    if isinstance(prepared, PreparedApply):
        return (
            f"{run} proposal waits to be applied: {len(prepared.accepted)} path(s) into "
            f"{printable(prepared.project)}; until {deadline}\n"
            f"  cairn diff {run}\n"
            f"  cairn apply {run}\n"
            f"  cairn reject {run} {request_id} --reason …"
        )
    if isinstance(prepared, PreparedApproval):
        then = "approved" if prepared.on_expiry == "approve" else "rejected"
        return (
            f"{run} {request_id} approval: {printable(prepared.subject[:500])}; until "
            f"{deadline} (then {then})\n"
            f"  cairn approve {run} {request_id} --fingerprint {printable(item.fingerprint)}\n"
            f"  cairn reject {run} {request_id} --reason …"
        )
    needs = printable(", ".join(
        c for c, d in item.evaluation.capabilities.items() if d == "require_approval"
    ))
    agent = prepared.agent
    return (
        f"{run} {request_id} approval: agent {printable(prepared.descriptor)} "
        f"(profile {printable(agent.profile)}, access {printable(agent.access)}, "
        f"network {printable(agent.network)}) needs {needs}; until {deadline}\n"
        f"  prompt: {printable(prepared.prompt[:200])}\n"
        f"  cairn approve {run} {request_id} --fingerprint {printable(item.fingerprint)}\n"
        f"  cairn reject {run} {request_id} --reason …"
    )
