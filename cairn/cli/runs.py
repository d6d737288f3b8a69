"""``cairn`` commands about runs: launch, list (ps), show, reconcile, retry, upgrade, diff,
revert and replay, and (from their own modules) doctor and logs. Added to the main app by
:func:`register`."""


import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cairn.cli import launching
from cairn.cli.artifacts import summary as artifacts_summary
from cairn.cli.attest import Expected
from cairn.cli.client import emit, fail, list_or_empty, object_or_empty, request, typed
from cairn.cli.completion import short_ids
from cairn.cli.doctor import doctor
from cairn.cli.launching import queued_note
from cairn.cli.logs import logs
from cairn.cli.options import (
    add_commands,
    args_option,
    argument,
    columns,
    confirm_or_stop,
    definition_argument,
    dry_run_flag,
    echo,
    emit_or_empty,
    hidden_alias,
    json_flag,
    no_pager_flag,
    paged,
    render_waiting,
    run_argument,
    scripted_option,
    would,
    yes_flag,
)
from cairn.cli.watchview import follow, progress_lines
from cairn.protocol.names import is_run_id
from cairn.terminal import printable, printable_lines

if TYPE_CHECKING:
    from cairn.protocol.view_replies import DiffReply, ShowReply


def register(app: click.Group) -> None:
    """Add the commands to ``app`` (the main ``cairn`` app), in the order help lists them.
    ``ps`` is ``list`` by its familiar short name."""
    add_commands(app, launch)
    listing = app.command("list")(list_runs)
    hidden_alias(app, listing, "ps", help="The same as 'cairn list'.")
    add_commands(app, show, reconcile, retry, upgrade, doctor, logs, diff, revert, replay)


def _age(ts: float) -> str:
    seconds = int(time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


@definition_argument
@args_option
@click.option(
    "--arg",
    metavar="KEY=VALUE",
    help="One workflow argument (repeatable; over --args): VALUE is read as JSON "
        "where it is JSON (3, true, [1, 2]), else as text.",
    multiple=True,
)
@click.option(
    "--project",
    type=click.Path(path_type=Path),
    help="The project directory (yours).",
    show_default="the current directory",
    default=Path("."),
)
@scripted_option
@click.option("--confirm", help="For a workflow FILE.py: the review hash you confirmed.")
@click.option(
    "--limit",
    help="NAME=NUMBER: a unit limit or run budget, e.g. max_agent_ops=20 "
        "(memory_max takes a size: 2G, 512M).",
    multiple=True,
)
@click.option(
    "--apply",
    "apply_mode",
    type=click.Choice(launching.APPLY_MODES),
    help="auto: settle into the project at once; ask: wait for 'cairn apply RUN'; "
        "never: keep the proposal for 'cairn diff RUN --patch'.",
    default="auto",
)
@click.option(
    "--run-key",
    help="KEY: your name for this run (a date, a ticket, a commit). A launch you "
        "made before with the same key prints that run's ID instead of starting another.",
)
@click.option(
    "--watch",
    help="Then follow the run as 'cairn watch' does; exit 0 only if it succeeds.",
    is_flag=True,
)
@click.option(
    "--wait",
    help="Then wait until the run ends, saying only what it waits for and how it "
        "ended; exit 0 only if it succeeds.",
    is_flag=True,
)
@json_flag
def launch(
    definition: str,
    args: str = "{}",
    arg: tuple[str, ...] = (),
    project: Path = Path("."),
    scripted: tuple[str, ...] = (),
    confirm: str | None = None,
    limit: tuple[str, ...] = (),
    apply_mode: str = "auto",
    run_key: str | None = None,
    watch: bool = False,
    wait: bool = False,
    json_out: bool = False,
) -> None:
    """Launch a workflow run on a project: builtin:NAME, an installed user:NAME, a
    project:NAME of a project you trusted, or a reviewed FILE.py with --confirm.

    Example: cairn launch builtin:implement --arg objective='add a CHANGELOG entry' --wait
    """
    stays = "--watch" if watch else "--wait" if wait else None
    if stays and json_out:
        raise click.BadParameter(
            f"{stays} prints the run's lines as it goes; for JSON, follow it with "
            "'cairn watch RUN --json'",
            param_hint=f"'{stays}'",
        )
    if watch and wait:
        raise click.BadParameter("--watch already waits for the run; give one",
                                 param_hint="'--wait'")
    # What it sends, and how 'cairn' reads this command line without click: launching.
    run_id = launching.launch(
        definition,
        args=args,
        arg=arg,
        project=os.fspath(project),
        scripted=scripted,
        confirm=confirm,
        limit=limit,
        apply_mode=apply_mode,
        run_key=run_key,
        json_out=json_out,
    )
    if watch or wait:
        follow(run_id, events=watch)


def full_run_id(ref: str) -> str | None:
    """``ref`` if it is a whole run ID (a prefix or ``@last`` is resolved by cairnd)."""
    return ref if is_run_id(ref) else None


@click.option("--all", "all_users", help="All users' runs (cairn-admin).", is_flag=True)
@click.option(
    "--state",
    "-s",
    metavar="STATE",
    help="Only runs in STATE (repeatable): queued, running, waiting, paused, "
        "blocked, succeeded, failed, stopped, cancelled.",
    multiple=True,
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, None),
    help="At most N runs, the newest.",
)
@click.option("--quiet", "-q", help="Only the full run IDs, one a line.", is_flag=True)
@click.option(
    "--format",
    "template",
    metavar="TEMPLATE",
    help="Each run as TEMPLATE, with {FIELD} for a field of --json, e.g. "
        "'{run_id} {state} {project}'.",
)
@click.option(
    "--json",
    "json_fields",
    is_flag=False,
    flag_value="",
    metavar="[FIELDS]",
    help="Print JSON; with FIELDS (e.g. run_id,state) only those fields of each run.",
)
def list_runs(
    all_users: bool = False,
    state: tuple[str, ...] = (),
    limit: int | None = None,
    quiet: bool = False,
    template: str | None = None,
    json_fields: str | None = None,
) -> None:
    """List your runs, newest first: a short ID (a unique prefix; any command takes it),
    state, definition, project, current operation, settlement (also: cairn ps).

    Example: cairn list --state failed --limit 5
    """
    from cairn.protocol.daemon import PsRequest
    from cairn.protocol.replies import PsReply

    json_out = json_fields is not None
    if sum((quiet, template is not None, json_out)) > 1:
        fail("--quiet, --format and --json each choose the output; give one", code=2)
    wanted = _run_states(state)
    sent = request(PsRequest(all_users=all_users))
    # each run as cairnd sent it (--json, --format) beside its typed reading
    both = [(object_or_empty(raw), r)
            for raw, r in zip(list_or_empty(sent), typed(PsReply, {"runs": sent}).runs, strict=True)
            if not wanted or r.state in wanted][:limit]
    if quiet:
        for _raw, r in both:
            click.echo(r.run_id)
        return
    if template is not None:
        for raw, _r in both:
            echo(_formatted(template, raw))
        return
    if json_fields:
        emit([_selected(json_fields, raw) for raw, _r in both])
        return
    if emit_or_empty([raw for raw, _r in both], json_out, empty="no runs"):
        return
    runs = [r for _raw, r in both]
    short = short_ids(r.run_id for r in runs)
    home = str(Path.home())
    header = ["ID", "STATE", "DEFINITION", "PROJECT", "CURRENT", "SETTLEMENT", "STARTED"]
    rows = []
    for r in runs:
        op = r.current_op
        project = r.project
        if project == home or project.startswith(home + "/"):
            project = "~" + project[len(home):]
        rows.append([
            short[r.run_id],
            f"queued#{r.position}" if r.position else r.state,
            r.definition,
            project,
            f"{op.op_id} {op.state}" if op else "-",
            r.settlement_summary.label if r.settlement_summary else "-",
            _age(r.created_at),
        ])
        if all_users:
            rows[-1].insert(1, _user_name(r.owner_uid))
    if all_users:
        header.insert(1, "OWNER")
    for line in columns([header, *rows]):
        click.echo(line)


def _run_states(given: tuple[str, ...]) -> set[str]:
    """The ``--state`` values, each a run state (refused in one line otherwise)."""
    from typing import get_args

    from cairn.journal.rows import RunState

    known = get_args(RunState)
    for name in given:
        if name not in known:
            raise click.BadParameter(f"{name!r} is not a run state; one of {', '.join(known)}",
                                     param_hint="--state")
    return set(given)


def _formatted(template: str, run: Mapping[str, object]) -> str:
    """``template`` with each ``{FIELD}`` replaced by that field of the run's --json."""
    fields = {k: "-" if v is None else v for k, v in run.items()}
    try:
        return template.format_map(fields)
    except KeyError as exc:
        fail(f"--format names {exc.args[0]!r}, which no run has",
             hint=f"fields: {', '.join(sorted(run))}", code=2)
    except (ValueError, IndexError, AttributeError) as exc:
        fail(f"--format {template!r} is not a template: {exc}",
             hint="write each field as {FIELD}, e.g. '{run_id} {state}'", code=2)


def _selected(fields: str, run: Mapping[str, object]) -> dict[str, object]:
    """The run's ``--json`` view cut to ``fields`` (comma-separated names)."""
    names = [name.strip() for name in fields.split(",") if name.strip()]
    unknown = [name for name in names if name not in run]
    if unknown:
        fail(f"--json names {unknown[0]!r}, which no run has",
             hint=f"fields: {', '.join(sorted(run))}", code=2)
    return {name: run[name] for name in names}


def _user_name(uid: int | None) -> str:
    import pwd

    if uid is None:
        return "-"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@run_argument
@no_pager_flag
@json_flag
def show(
    run_id: str,
    no_pager: bool = False,
    json_out: bool = False,
) -> None:
    """Operations, boundaries, checkpoints, proposal and apply result of a run (through
    $PAGER or less on a terminal, when longer than the screen).

    Example: cairn show @last
    """
    from cairn.protocol.daemon import ShowRequest
    from cairn.protocol.view_replies import ShowReply

    sent = request(ShowRequest(run_id=run_id))
    data = typed(ShowReply, sent)
    if json_out:
        emit(sent)
        return
    with paged(no_pager):
        _print_show(data)


def model_line(model: Mapping[str, object]) -> str:
    """``model: 3 calls · 1,234 of 2,000,000 tokens · cost 0.12 of 2.50 · today 0.40 of
    5.00``: the run's model spend against its budgets."""
    parts = [f"model: {model['calls']} call{'s' if model['calls'] != 1 else ''}",
             f"{model['tokens']:,} of {model['token_limit']:,} tokens"]
    if model.get("cost") is not None:
        limit = model.get("cost_limit")
        parts.append(f"cost {model['cost']}" + (f" of {limit}" if limit else ""))
    if model.get("daily_cost_limit"):
        parts.append(f"owner today {model['owner_today']} of {model['daily_cost_limit']}")
    return " · ".join(parts)


def _print_show(data: "ShowReply") -> None:
    run = data.run
    click.echo(f"run {run['run_id']}  {run['state']}  {printable(run['definition'])}")
    click.echo(f"project {printable(run['project'])}")
    if run.get("run_key"):
        click.echo(f"run key {printable(run['run_key'])}")
    if run["state"] == "queued":
        click.echo(queued_note(str(run["run_id"]), run.get("position")))
    if run.get("error"):
        click.echo(f"error: {printable(run['error'])}")
    if run["state"] in ("failed", "stopped", "cancelled") and data.replay_through:
        click.echo(f"retry from its last checkpoint: cairn replay {run['run_id']} "
                   f"--through {printable(data.replay_through)}")
    origin = data.replayed_from
    if origin:
        click.echo(
            f"replayed from {origin['run_id']} through {printable(origin['through'])} "
            f"({origin['imported']} operations imported, the rest run fresh)"
        )
    gone = data.storage.deleted
    if gone:
        click.echo(
            f"storage: deleted {_age(data.storage.deleted_at or 0)} ({data.storage.subvolumes} "
            "subvolumes); what follows is the journal's record"
        )
    _echo_integrity(data.integrity)
    click.echo("operations:")
    for op in data.operations:
        checkpoint = object_or_empty(op.get("checkpoint"))
        cp = object_or_empty(checkpoint.get("s"))
        click.echo(
            f"  {printable(op['op_id']):<10} {printable(op['kind']):<7} {op['state']:<10} "
            f"attempt {op['attempt']}  {printable(op['location'])}"
        )
        if op.get("imported_from"):
            source = object_or_empty(op["imported_from"])
            click.echo(f"             imported from {source['run_id']} "
                       f"{printable(source['op_id'])}")
        elif cp:
            # the broker found nothing but file times changed in the agent's W
            changed = checkpoint.get("changed")
            click.echo(
                f"             checkpoint {printable(cp.get('path'))} "
                + ("(deleted)" if gone else f"(read-only, uuid {cp.get('uuid')})")
                + (", no changes" if changed is False else "")
            )
        for retry in map(object_or_empty, list_or_empty(op.get("retries"))):
            uuid = f" (uuid {retry['source_uuid']})" if retry.get("source_uuid") else ""
            click.echo(
                f"             attempt {retry['attempt']} on a W restored from "
                f"{_restore_point(retry.get('from_checkpoint'))}{uuid}"
            )
        if op.get("output") is not None:
            click.echo(f"             output {json.dumps(op['output'])}")
        if op.get("artifacts"):
            line = artifacts_summary(str(run["run_id"]), str(op["op_id"]),
                                     object_or_empty(op["artifacts"]))
            click.echo(f"             {line}")
    if data.model:
        click.echo(model_line(data.model))
    for worklist in data.worklists:
        items = list_or_empty(worklist["items"])
        mark = "✓" if worklist["complete"] else "●"
        state = "done" if worklist["complete"] else "active"
        click.echo(
            f"{mark} {printable(worklist['title'])} r{worklist['revision']} · "
            f"{worklist['done']}/{len(items)} · {state}"
        )
        symbols = {"done": "✓", "active": "●", "waiting": "○"}
        for item, item_state in zip(items, list_or_empty(worklist["states"]), strict=True):
            click.echo(f"  {symbols[str(item_state)]} {printable(item)}")
    for facet in data.experiments:
        for line in experiment_lines(facet):
            click.echo(line)
    question = data.question
    if question:
        more = f" (and {question['also_waiting']} more)" if question["also_waiting"] else ""
        click.echo(f"waiting: {render_waiting(str(run['run_id']), question)}{more}")
    divergence = data.divergence
    if divergence:
        fields = printable(", ".join(str(f) for f in list_or_empty(divergence["fields"])))
        click.echo(f"replay diverged at {printable(divergence['op_id'])} ({fields}):")
        journal = object_or_empty(divergence["journal"])
        replayed = object_or_empty(divergence["replay"])
        for label in ("kind", "location", "predecessor", "request"):
            click.echo(f"  {label:<12} journal: {json.dumps(journal[label])}")
            click.echo(f"  {'':<12} replay:  {json.dumps(replayed[label])}")
    settlement = data.settlement
    if settlement:
        summary = data.settlement_summary
        status = summary.label if summary else settlement["status"]
        click.echo(f"settlement: {printable(status)}")
        apply = object_or_empty(settlement.get("apply"))
        for label in ("applied", "already_applied", "xattrs_not_kept", "links_not_kept"):
            if apply.get(label):
                paths = ", ".join(printable(p) for p in list_or_empty(apply[label]))
                click.echo(f"  {label}: {paths}")
        for conflict in list_or_empty(apply.get("conflicts")):
            click.echo(f"  conflict: {_path_reason(conflict)}")
        candidate = object_or_empty(settlement.get("candidate"))
        for refused in list_or_empty(candidate.get("refused")):
            click.echo(f"  refused: {_path_reason(refused)}")
        ignored = list_or_empty(candidate.get("ignored"))
        if ignored:
            click.echo(f"  ignored (settle_ignore): {', '.join(printable(p) for p in ignored)}")
    if run.get("output"):
        click.echo(f"output: {json.dumps(run['output'])}")
    for line in progress_lines(data.progress):
        click.echo(line)
    if data.units:
        click.echo("units: " + printable(" ".join(data.units)))
    latest = data.latest_event
    if latest:
        click.echo(f"events: {data.events_shown} (--json lists them); latest "
                   f"#{latest['cursor']} {printable(latest['event'])}"
                   + (f" {printable(latest['op_id'])}" if latest.get("op_id") else ""))


def _path_reason(entry: object) -> str:
    """``PATH (REASON)`` of a conflict or a refused path: both may quote an agent's name."""
    fields = object_or_empty(entry)
    return f"{printable(fields['path'])} ({printable(fields['reason'])})"


def _echo_integrity(integrity: Mapping[str, object]) -> None:
    """Contradictions first: what follows is built only from the records that agree."""
    issues = [object_or_empty(issue) for issue in list_or_empty(integrity.get("issues"))]
    if not issues:
        return
    click.echo(f"integrity: {len(issues)} contradiction(s) in the journal; nothing below is "
               "built on them ('cairn doctor' cross-checks the run)")
    for issue in issues:
        click.echo(f"  ! {issue['code']}: {printable(issue['message'])}")


@run_argument
@argument("op_id", metavar="OP")
@click.option(
    "--result",
    type=click.Path(path_type=Path),
    help="JSON file: the operation's output (as it happened).",
)
@click.option(
    "--no-effect",
    help="It reached nothing outside: retry it.",
    is_flag=True,
)
def reconcile(
    run_id: str,
    op_id: str,
    result: Path | None = None,
    no_effect: bool = False,
) -> None:
    """Decide an uncertain operation of a blocked run: its real result, or no effect.

    Example: cairn reconcile 3fa9 root-1 --no-effect
    """
    from cairn.protocol.daemon import ReconcileRequest
    from cairn.protocol.replies import DecisionReply

    if (result is None) == (not no_effect):
        fail("give exactly one of --result FILE or --no-effect", code=2)
    data = None
    if result is not None:
        try:
            data = json.loads(result.read_text())
        except OSError as exc:
            fail(f"cannot read {result}: {exc.strerror}", code=2)
        except json.JSONDecodeError as exc:
            fail(f"{result} is not JSON: {exc.msg} at line {exc.lineno}", code=2)
        if not isinstance(data, dict):
            fail(f"{result} must hold a JSON object", code=2)
    out = typed(DecisionReply, request(
        ReconcileRequest(run_id=run_id, op_id=op_id, result=data, no_effect=no_effect)))
    click.echo(f"{printable(out.op_id)} decided; {out.run_id} resumes")


@run_argument
@argument("op_id", metavar="OP")
def retry(run_id: str, op_id: str) -> None:
    """Run an uncertain operation again (its effects may then happen twice).

    Example: cairn retry 3fa9 root-1
    """
    from cairn.protocol.daemon import RetryRequest
    from cairn.protocol.replies import RetryReply

    out = typed(RetryReply, request(RetryRequest(run_id=run_id, op_id=op_id)))
    click.echo(
        f"{printable(out.op_id)} will be retried on a W restored from "
        f"{_restore_point(out.from_checkpoint)}; {out.run_id} resumes"
    )


def _restore_point(checkpoint: object) -> str:
    return f"checkpoint {printable(checkpoint)}" if checkpoint else "Q (the project as launched)"


@run_argument
@click.option(
    "--to",
    type=click.Path(path_type=Path),
    help="The new workflow source FILE.py.",
    required=True,
)
@click.option("--dry-run", help="Only check; change nothing.", is_flag=True)
@click.option("--confirm", help="The new source's review hash.")
@json_flag
def upgrade(
    run_id: str,
    to: Path,
    dry_run: bool = False,
    confirm: str | None = None,
    json_out: bool = False,
) -> None:
    """Move a waiting or blocked run to new source, after a clean replay of its journal.

    Example: cairn upgrade 3fa9 --to ~/wf/release.py --dry-run
    """
    from cairn.protocol.daemon import UpgradeRequest
    from cairn.protocol.run_replies import UpgradeReply

    try:
        source = to.read_text()
    except OSError as exc:
        fail(f"cannot read {to}: {exc.strerror}", code=2)
    sent = request(
        UpgradeRequest(run_id=run_id, source=source, dry_run=dry_run, confirm=confirm),
        expect=Expected(run_id=full_run_id(run_id), source=source, review_hash=confirm),
    )
    data = typed(UpgradeReply, sent)
    if json_out:
        emit(sent)
        return
    div = data.divergence
    if div is None:
        click.echo(
            f"{data.run_id}: the new source reproduces all {data.checked} "
            f"committed operation(s)"
        )
    else:
        click.echo(
            f"{data.run_id}: diverges at {printable(div.op_id)} ({printable(div.field)})"
        )
        click.echo(f"  expected: {json.dumps(div.expected)}")
        click.echo(f"  actual:   {json.dumps(div.actual)}")
    if data.upgraded:
        click.echo(f"moved to {data.to_hash} (was {data.from_hash})")
    if div is not None:
        raise click.exceptions.Exit(1)


@run_argument
@click.option(
    "--patch",
    help="Only the unified diff of the accepted paths, for 'git apply' or 'patch -p1'.",
    is_flag=True,
)
@no_pager_flag
@json_flag
def diff(
    run_id: str,
    patch: bool = False,
    no_pager: bool = False,
    json_out: bool = False,
) -> None:
    """What the run applied (or refused) in the live project (through $PAGER or less on a
    terminal, when longer than the screen).

    Example: cairn diff @last --patch
    """
    from cairn.protocol.daemon import DiffRequest
    from cairn.protocol.view_replies import DiffReply

    sent = request(DiffRequest(run_id=run_id))
    data = typed(DiffReply, sent)
    if json_out:
        emit(sent)
        return
    if patch and not sys.stdout.isatty():
        # exact, for 'git apply' or 'patch' (a lone surrogate, never in a real diff, as ?)
        click.echo(data.diff.encode("utf-8", "replace"), nl=False)
        return
    with paged(no_pager):
        _print_diff(data, patch)


def _print_diff(data: "DiffReply", patch: bool) -> None:
    if not patch:
        label = data.summary.label if data.summary else data.status
        click.echo(f"# {data.run_id}: {printable(label)}")
        for conflict in data.apply.conflicts if data.apply else []:
            click.echo(f"# conflict, left untouched: {_path_reason(conflict.model_dump())}")
        for refused in data.refused:
            click.echo(f"# refused by policy: {_path_reason(refused.model_dump())}")
        for ignored in data.ignored:
            click.echo(f"# ignored (a profile's settle_ignore): {printable(ignored)}")
    click.echo(printable_lines(data.diff), nl=False)


@run_argument
@dry_run_flag
@yes_flag
@json_flag
def revert(
    run_id: str,
    dry_run: bool = False,
    yes: bool = False,
    json_out: bool = False,
) -> None:
    """Undo what a finished run applied: every path still as the run left it gets its
    content from before the run back. Nothing is written if any path changed since.

    Example: cairn revert @last
    """
    from cairn.protocol.daemon import RevertRequest
    from cairn.protocol.replies import RevertReply

    if dry_run:
        would(_revert_preview(run_id))
    confirm_or_stop(
        f"Revert what run {run_id} applied to its project? Every path still as the run "
        "left it gets its content from before the run back.",
        yes=yes,
    )
    sent = request(RevertRequest(run_id=run_id))
    data = typed(RevertReply, sent)
    if json_out:
        emit(sent)
    elif data.status == "conflict":
        click.echo(f"{data.run_id}: not reverted, nothing written")
        for conflict in data.conflicts:
            click.echo(f"  conflict: {_path_reason(conflict.model_dump())}")
    elif data.applied:
        click.echo(f"{data.run_id}: reverted {len(data.applied)} path(s)")
    else:
        click.echo(f"{data.run_id}: already reverted; nothing to do")
    if data.status == "conflict":
        raise click.exceptions.Exit(1)


def _revert_preview(run_id: str) -> str:
    """What ``cairn revert`` would put back, from the run's settlement record."""
    from cairn.protocol.daemon import ShowRequest
    from cairn.protocol.view_replies import ShowReply

    view = typed(ShowReply, request(ShowRequest(run_id=run_id)))
    settlement = view.settlement or {}
    reverted = object_or_empty(settlement.get("revert")).get("status") == "applied"
    applied = list_or_empty(object_or_empty(settlement.get("apply")).get("applied"))
    full = view.run["run_id"]
    if reverted or not applied:
        return f"leave {full}'s project as it is: " + (
            "already reverted" if reverted else "the run applied nothing")
    paths = ", ".join(printable(p) for p in applied[:10]) + (", …" if len(applied) > 10 else "")
    return (f"put back the content from before {full} of the {len(applied)} path(s) it "
            f"applied ({paths}), unless one changed since (then nothing is written)")


@run_argument
@click.option(
    "--through",
    metavar="OP",
    help="The root-level boundary to replay "
        "through, e.g. root-3 ('cairn show RUN' lists them).",
    required=True,
)
@json_flag
def replay(
    run_id: str,
    through: str,
    json_out: bool = False,
) -> None:
    """A new run from a finished run's checkpoint: the operations up to OP are imported
    with their checkpoints, the rest of the workflow runs fresh. The source is unchanged.

    Example: cairn replay 3fa9 --through root-2
    """
    from cairn.protocol.daemon import ReplayRequest
    from cairn.protocol.replies import ReplayReply

    sent = request(
        ReplayRequest(run_id=run_id, op_id=through),
        expect=Expected(replay_of=full_run_id(run_id)),
    )
    if json_out:
        emit(sent)
        return
    data = typed(ReplayReply, sent)
    click.echo(
        f"{data.run_id}: replayed from {data.source_run} through "
        f"{printable(data.through)} "
        f"({len(data.imported)} operations imported)"
    )
    click.echo(f"follow it with 'cairn watch {data.run_id}'")


def _target_text(facet: object) -> str:
    target = object_or_empty(facet)
    if not target:
        return ""
    return f" · target {target['value']:g} {'reached' if target['reached'] else 'not reached'}"


def experiment_lines(facet: Mapping[str, object]) -> list[str]:
    """``cairn show``'s experiment facet: metric, baseline, best, gain (and the target),
    then each candidate with its disposition and, indented below it, its report."""

    def value(facet_entry: object) -> str:
        entry = object_or_empty(facet_entry)
        return "-" if not entry else f"{entry['value']:g} ({printable(entry['measurement'])})"

    gain = "-" if facet.get("gain") is None else f"{facet['gain']:+.1%}"
    network = ", ".join(printable(d) for d in list_or_empty(facet.get("network")))
    guardrails = ", ".join(
        f"{printable(n)} ≤{m:.0%}" for n, m in object_or_empty(facet.get("guardrails")).items()
    )
    lines = [
        f"◆ experiment {printable(facet['scope'])} · {printable(facet['metric'])} · baseline "
        f"{value(facet.get('baseline'))} · best {value(facet.get('best'))} · gain {gain}"
        + (f" · guardrails {guardrails}" if guardrails else "")
        + _target_text(facet.get("target"))
        + (f" · evaluator network {network}" if facet.get("network") else "")
    ]
    symbols = {"accepted": "✓", "rejected": "✗", "refused": "!", "pending": "○"}
    for c in map(object_or_empty, list_or_empty(facet["candidates"])):
        reason = f" — {printable(c['reason'])}" if c.get("reason") else ""
        shown = "-" if c["value"] is None else f"{c['value']:g}"
        lines.append(f"  {symbols[str(c['disposition'])]} {printable(c['measurement'])} {shown} "
                     f"{c['disposition']}{reason}")
        for name, text in object_or_empty(c.get("report")).items():
            lines.append(f"      {printable(name)}: {printable(text)}")
    return lines
