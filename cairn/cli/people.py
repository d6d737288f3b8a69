"""``cairn`` commands for people in the loop: inbox, answer, approve, reject, apply,
pause, resume, stop, cancel and watch. Added to the main app by :func:`register`."""


import datetime
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cairn.cli.client import fail, request
from cairn.cli.options import JsonFlag, RunArg, add_commands, emit_or_empty, render_waiting
from cairn.cli.watchview import EventPrinter
from cairn.terminal import printable

if TYPE_CHECKING:
    from cairn.protocol.daemon import ControlRequest


def register(app: typer.Typer) -> None:
    """Add the commands to ``app`` (the main ``cairn`` app), in the order help lists them."""
    add_commands(
        app, inbox, answer, approve, reject, apply, pause, resume, stop, cancel, watch
    )


def inbox(
    all_users: Annotated[bool, typer.Option("--all", help="Every user's (cairn-admin).")] = False,
    json_out: JsonFlag = False,
) -> None:
    """What waits for you, with the command to run next: questions, approval requests,
    proposals held for 'cairn apply', blocked runs, blocked schedules."""
    from cairn.protocol.daemon import InboxRequest

    items = request(InboxRequest(all_users=all_users))
    if emit_or_empty(items, json_out, empty="nothing waits for you"):
        return
    for item in items:
        typer.echo(render_item(item))


def answer(
    run_id: RunArg,
    challenge: Annotated[str, typer.Option(help="The question's challenge (sha256:…).")],
    value: Annotated[str | None, typer.Argument(metavar="[VALUE]")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Read the answer from FILE.")] = None,
) -> None:
    """Answer a run's question: JSON for a typed question, else text."""
    from cairn.protocol.daemon import AnswerRequest

    if (value is None) == (file is None):
        fail("give exactly one of VALUE or --file FILE", code=2)
    text = value
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror}", code=2)
    out = request(AnswerRequest(run_id=run_id, challenge=challenge, answer=text))
    if out["outcome"] == "duplicate":
        typer.echo(f"{printable(out['op_id'])} already has this answer; nothing changed")
    else:
        resumes = "resumes" if out["woken"] else "continues when it is resumed"
        typer.echo(f"{printable(out['op_id'])} answered; {out['run_id']} {resumes}")


def approve(
    run_id: RunArg,
    request_id: Annotated[str, typer.Argument(metavar="REQ")],
    fingerprint: Annotated[str, typer.Option(help="The fingerprint of the request you looked at.")],
) -> None:
    """Approve one prepared operation (checked again against the current policy)."""
    from cairn.protocol.daemon import ApproveRequest

    out = request(ApproveRequest(run_id=run_id, request_id=request_id, fingerprint=fingerprint))
    typer.echo(f"{printable(out['request_id'])} approved; {out['run_id']} resumes")


def reject(
    run_id: RunArg,
    request_id: Annotated[str, typer.Argument(metavar="REQ")],
    reason: Annotated[str, typer.Option(help="Why (recorded with the decision).")] = "",
) -> None:
    """Reject one prepared operation: it does not run."""
    from cairn.protocol.daemon import RejectRequest

    out = request(RejectRequest(run_id=run_id, request_id=request_id, reason=reason))
    typer.echo(f"{printable(out['request_id'])} rejected; the operation does not run")


def apply(run_id: RunArg) -> None:
    """Settle a run launched with --apply ask: its proposal (see 'cairn diff RUN') goes
    to the live project with the three-way check."""
    from cairn.protocol.daemon import ApplyRequest

    out = request(ApplyRequest(run_id=run_id))
    typer.echo(f"{out['run_id']}: proposal approved; it is applied now")


def _control(action: "type[ControlRequest]", run_id: str) -> None:
    out = request(action(run_id=run_id))
    later = (
        f" (its coordinator acts on it at the next safe point; follow with 'cairn watch "
        f"{out['run_id']}')"
        if out["outcome"].endswith("requested")
        else ""
    )
    typer.echo(f"{out['run_id']}: {printable(out['outcome'])}{later}")


def pause(run_id: RunArg) -> None:
    """Pause at the next safe point; nothing of the run keeps running meanwhile."""
    from cairn.protocol.daemon import PauseRequest

    _control(PauseRequest, run_id)


def resume(run_id: RunArg) -> None:
    """Resume a paused run (or withdraw a pause not yet honoured)."""
    from cairn.protocol.daemon import ResumeRequest

    _control(ResumeRequest, run_id)


def stop(run_id: RunArg) -> None:
    """Start no new operations; running agents finish; then the run ends stopped."""
    from cairn.protocol.daemon import StopRequest

    _control(StopRequest, run_id)


def cancel(run_id: RunArg) -> None:
    """Cancel the run: it ends cancelled, running agents are stopped, waiting requests are
    withdrawn (at once when no coordinator holds the run, else at its next safe point)."""
    from cairn.protocol.daemon import CancelRequest

    _control(CancelRequest, run_id)


def watch(
    run_id: RunArg,
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON event per line.")] = False,
) -> None:
    """Follow a run live (rebuilt from the journal); one line when it ends."""
    from cairn.protocol.daemon import WatchRequest

    cursor = 0
    shown_waiting: list[dict[str, Any]] = []
    out = EventPrinter(sys.stdout, tty=sys.stdout.isatty() and not json_out, render=render_event)
    try:
        while True:
            polled = time.monotonic()
            data = request(WatchRequest(run_id=run_id, cursor=cursor))
            run_id = data["run_id"]  # a prefix or @last names this run from now on
            for event in data["events"]:
                if json_out:
                    out.line(json.dumps(event))
                else:
                    out.event(event)
            cursor = data["cursor"]
            if data["more"]:
                continue
            if data["waiting"] != shown_waiting:
                shown_waiting = data["waiting"]
                for item in shown_waiting:
                    out.line(f"waiting: {render_waiting(data['run_id'], item)}")
            if data["finished"]:
                out.line(completion_line(data))
                raise typer.Exit(0 if data["state"] == "succeeded" else 1)
            time.sleep(max(0.0, interval - (time.monotonic() - polled)))  # keep the cadence
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def render_item(item: dict[str, Any]) -> str:
    """An inbox item as lines: what waits and the commands that decide it. Every field a
    workflow or an agent could have shaped (the question, the prompt, names) is shown
    through :func:`~cairn.terminal.printable`."""
    commands = "".join(f"\n  {printable(c)}" for c in item.get("commands", []))
    if item["kind"] == "schedule-blocked":
        return (
            f"schedule {printable(item['name'])} ({item['schedule_id']}) blocked: "
            f"{printable(item['reason'] or 'launch failures')}{commands}"
        )
    run = item["run_id"]
    if item["kind"] == "blocked":
        where = f" {printable(item['op_id'])}" if item.get("op_id") else ""
        return f"{run}{where} blocked: {printable(item['reason'] or 'see cairn show')}{commands}"
    if item["kind"] == "question":
        schema = printable(item["schema_name"] or "text")
        return (
            f"{run} {printable(item['op_id'])} question ({schema}): "
            f"{printable(item['question'])}\n"
            f"  cairn answer {run} --challenge {printable(item['challenge'])} VALUE"
        )
    prepared = item["prepared"]
    request_id = printable(item["request_id"])
    deadline = datetime.datetime.fromtimestamp(item["deadline"]).strftime("%Y-%m-%d %H:%M")
    if prepared.get("kind") == "apply":
        return (
            f"{run} proposal waits to be applied: {len(prepared['accepted'])} path(s) into "
            f"{printable(prepared['project'])}; until {deadline}\n"
            f"  cairn diff {run}\n"
            f"  cairn apply {run}\n"
            f"  cairn reject {run} {request_id} --reason …"
        )
    if prepared.get("kind") == "approve":
        then = "approved" if prepared.get("on_expiry") == "approve" else "rejected"
        return (
            f"{run} {request_id} approval: {printable(prepared['subject'][:500])}; until "
            f"{deadline} (then {then})\n"
            f"  cairn approve {run} {request_id} --fingerprint {printable(item['fingerprint'])}\n"
            f"  cairn reject {run} {request_id} --reason …"
        )
    needs = printable(", ".join(
        c for c, d in item["evaluation"]["capabilities"].items() if d == "require_approval"
    ))
    agent = prepared["agent"]
    return (
        f"{run} {request_id} approval: agent {printable(prepared['descriptor'])} "
        f"(profile {printable(agent['profile'])}, access {printable(agent['access'])}, "
        f"network {printable(agent['network'])}) needs {needs}; until {deadline}\n"
        f"  prompt: {printable(prepared['prompt'][:200])}\n"
        f"  cairn approve {run} {request_id} --fingerprint {printable(item['fingerprint'])}\n"
        f"  cairn reject {run} {request_id} --reason …"
    )


def render_event(event: dict[str, Any]) -> str:
    at = datetime.datetime.fromtimestamp(event["at"]).strftime("%H:%M:%S")
    where = f" {printable(event['op_id'])}" if event.get("op_id") else ""
    data = " ".join(f"{printable(k)}={printable(v)}" for k, v in sorted(event["data"].items()))
    return f"{at} {printable(event['event'])}{where}" + (f" {data}" if data else "")


def completion_line(data: dict[str, Any]) -> str:
    line = f"{data['run_id']} {data['state']}"
    if data.get("error"):
        line += f": {printable(data['error'])}"
    elif data.get("output") is not None:
        line += f": {json.dumps(data['output'], sort_keys=True)}"
    return line
