"""The tools ``cairn mcp`` offers a model: one per exposed workflow, and the fixed
``cairn_runs``, ``cairn_show``, ``cairn_watch``, ``cairn_inbox``, ``cairn_answer`` and
``cairn_workflow_draft``.

Every tool is a request to cairnd as the user who started the server, so a model can do
nothing that user's ``cairn`` could not. No tool approves, rejects or applies: those stay a
person's acts through the CLI, and approval requests are shown without what approving one
takes (its fingerprint). ``cairn_workflow_draft`` writes a draft in the user's config and
reviews it; a draft is inert until a person installs it (and exposes it) in a terminal.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from cairn.cli.attest import Expected
from cairn.cli.client import typed
from cairn.definitions import registry, user
from cairn.definitions.resolve import current_review, for_launch, split
from cairn.errors import CairnError, NotFound, PermissionDenied, UsageError
from cairn.mcp.forms import filled, launch_form
from cairn.protocol.daemon import (
    AnswerRequest,
    ArtifactsRequest,
    InboxRequest,
    LaunchRequest,
    OpRequest,
    PsRequest,
    ShowRequest,
    WatchRequest,
)
from cairn.protocol.jsonvalue import JSONObject, JSONValue, json_list, json_object
from cairn.protocol.mcp import (
    MAX_ARTIFACT_TEXT,
    AnswerArgs,
    ArtifactArgs,
    DraftArgs,
    ElicitAnswer,
    ElicitForm,
    InboxArgs,
    LaunchArgs,
    RunArgs,
    RunsArgs,
    Tool,
    ToolArgs,
    WatchArgs,
)
from cairn.protocol.replies import AnswerReply, ArtifactContent, InboxReply, PsReply
from cairn.protocol.run_replies import LaunchReply, WatchReply
from cairn.protocol.view_replies import ShowReply
from cairn.terminal import printable
from cairn.validation import invalid
from cairn.workflow.review import Review, ReviewRejected, render_review, review_source
from cairn.workflow.schema import json_schema

log = logging.getLogger(__name__)

ParsedArgs = TypeVar("ParsedArgs", bound=ToolArgs)

# Report progress: how many events so far, and the latest one as a line.
Reporter = Callable[[float, str], None]

WATCH_POLL_SECONDS = 1.0
WITHHELD_KEYS = frozenset({"fingerprint"})
APPROVAL_KEYS_SHOWN = ("kind", "run_id", "op_id", "deadline")
DECIDED_BY = (
    "a person, with 'cairn inbox' and 'cairn approve' or 'cairn apply' in their terminal; "
    "no tool of this server approves"
)


class Requester(Protocol):
    """Send one request to cairnd (``cairn.cli.client.request``: the user's own client);
    its reply is JSON each tool reads as the shape it expects."""

    def __call__(
        self, body: OpRequest, *, fd: int | None = None, expect: Expected | None = None
    ) -> object: ...


class UnknownTool(CairnError):
    """A ``tools/call`` of a name that is not in ``tools/list`` (a protocol error)."""

    code = "not-found"


@dataclass(frozen=True)
class Session:
    """What a tool works with: the user's client, where the server runs (the default
    project), the clock (injected, so a test never waits), whether the client cancelled
    the call (a watch stops at its next poll), and a form to ask the person through
    (None when the client shows none)."""

    request: Requester
    cwd: Path
    clock: Callable[[], float]
    pause: Callable[[float], None]
    cancelled: Callable[[], bool] = lambda: False
    elicit: Callable[[str, ElicitForm], ElicitAnswer] | None = None


@dataclass(frozen=True)
class ExposedWorkflow:
    """An exposed definition whose current review still has the hash it was exposed at."""

    definition: str
    review: Review

    @property
    def tool_name(self) -> str:
        namespace, name = split(self.definition)
        return f"{namespace}_{name}"


def exposed_workflows() -> Iterator[ExposedWorkflow]:
    """The registry's definitions a model may launch now. One that is gone, broken or was
    reinstalled since it was exposed (``stale`` in ``cairn workflow list``) is left out:
    a person exposes it again."""
    for definition, pinned in sorted(registry.exposed_hashes().items()):
        try:
            review = current_review(definition)
        except CairnError as exc:
            log.warning("%s is exposed but not offered: %s", definition, exc.message)
            continue
        if review.review_hash != pinned:
            log.warning("%s changed since it was exposed; not offered", definition)
            continue
        yield ExposedWorkflow(definition, review)


def _schema(model: type[BaseModel]) -> JSONObject:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


def workflow_tool(workflow: ExposedWorkflow) -> Tool:
    """The tool that launches ``workflow``: its description, and its input model's JSON
    Schema as ``args`` (the models it refers to in ``$defs`` at the top)."""
    review = workflow.review
    schema = _schema(LaunchArgs)
    args = json_schema(review.models, review.workflow.input)
    defs = args.pop("$defs", None)
    json_object(schema["properties"])["args"] = args
    schema["required"] = ["args"]
    if defs:
        schema["$defs"] = defs
    description = (
        f"{review.workflow.description}\n\nLaunches {workflow.definition} (review hash "
        f"{review.review_hash}) as a Cairn run on a project, sandboxed and journalled; "
        "returns the run ID. Follow it with cairn_watch."
    )
    return Tool(name=workflow.tool_name, description=description, input_schema=schema)


def _runs(args: RunsArgs, session: Session, report: Reporter | None) -> JSONObject:
    listed = typed(PsReply, {"runs": session.request(PsRequest())})
    return listed.model_dump(mode="json")


def _show(args: RunArgs, session: Session, report: Reporter | None) -> JSONObject:
    view = typed(ShowReply, session.request(ShowRequest(run_id=args.run))).model_dump(
        mode="json")
    return {
        "run": view["run"],
        "question": _open_request(view["question"]),
        "settlement": view["settlement"],
        "settlement_summary": view["settlement_summary"],
        "operations": view["operations"],
        "progress": view["progress"],
        "latest_event": view["latest_event"],
    }


def _open_request(facet: JSONValue) -> JSONObject | None:
    if facet is None:
        return None
    question = json_object(facet)
    return {**_without_approval_keys(question), "also_waiting": question.get("also_waiting", 0)}


def _inbox(args: InboxArgs, session: Session, report: Reporter | None) -> JSONObject:
    sent = session.request(InboxRequest())
    # checked by its model, then passed on as sent: a question is the journal's row whole
    typed(InboxReply, {"items": sent})
    return {"items": [_without_approval_keys(json_object(item)) for item in json_list(sent)]}


def _artifact(args: ArtifactArgs, session: Session, report: Reporter | None) -> JSONObject:
    """One published file as text (its first :data:`MAX_ARTIFACT_TEXT` characters), or
    only its size and hash when it is not UTF-8: a model reads text."""
    got = typed(ArtifactContent, session.request(
        ArtifactsRequest(run_id=args.run, op_id=args.op, name=args.name)))
    data = base64.b64decode(got.content_base64, validate=True)
    if hashlib.sha256(data).hexdigest() != got.sha256:
        raise CairnError(f"artifact {printable(got.name)} arrived damaged (its SHA-256 differs)")
    try:
        text: str | None = data.decode()
    except UnicodeDecodeError:
        text = None
    return {
        "run_id": got.run_id, "op_id": got.op_id, "name": got.name, "size": got.size,
        "sha256": got.sha256,
        "text": None if text is None else text[:MAX_ARTIFACT_TEXT],
        "truncated": text is not None and len(text) > MAX_ARTIFACT_TEXT,
        "binary": text is None,
    }


def _without_approval_keys(item: JSONObject) -> JSONObject:
    """A question as cairnd gives it; an approval request without its fingerprint and
    request ID, with who decides it."""
    if item.get("kind") == "question":
        return item
    kept: JSONObject = {k: item[k] for k in APPROVAL_KEYS_SHOWN if k in item}
    kept["decided_by"] = DECIDED_BY
    return kept


def _answer(args: AnswerArgs, session: Session, report: Reporter | None) -> JSONObject:
    text = args.answer if isinstance(args.answer, str) else json.dumps(args.answer)
    answered = typed(AnswerReply, session.request(
        AnswerRequest(run_id=args.run, challenge=args.challenge, answer=text)
    ))
    return answered.model_dump(mode="json")


def _watch(args: WatchArgs, session: Session, report: Reporter | None) -> JSONObject:
    """The run's events after ``cursor`` until its state changes, it ends, or ``timeout``
    runs out; each event is reported as progress when the call asked for it."""
    deadline = session.clock() + args.timeout
    cursor, first_state = args.cursor, None
    events: list[JSONValue] = []
    while True:
        got = typed(WatchReply,
            session.request(WatchRequest(run_id=args.run, cursor=cursor)))
        data = got.model_dump(mode="json")
        for event in json_list(data["events"]):
            events.append(event)
            if report is not None:
                report(float(len(events)), _event_line(json_object(event)))
        cursor = got.cursor
        first_state = first_state or got.state
        if got.more:
            continue
        if got.finished or got.state != first_state or session.clock() >= deadline:
            break
        if session.cancelled():
            break
        session.pause(min(WATCH_POLL_SECONDS, max(0.0, deadline - session.clock())))
    waiting: list[JSONValue] = [
        _without_approval_keys({**json_object(w), "run_id": got.run_id})
        for w in json_list(data["waiting"])
    ]
    return {
        "run_id": got.run_id,
        "state": got.state,
        "finished": got.finished,
        "error": got.error,
        "output": data["output"],
        "events": events,
        "cursor": cursor,
        "waiting": waiting,
    }


def _draft(args: DraftArgs, session: Session, report: Reporter | None) -> JSONObject:
    """Read the draft ``user:NAME`` or write it (``source``), and review what it holds:
    what a person would install, with what installing it takes."""
    if args.source is None:
        draft = user.read_draft(args.name)
        if draft is None:
            raise NotFound(f"user:{args.name} has no draft",
                           hint="give 'source' to write one")
    else:
        draft = user.write_draft(args.name, args.source, replaces=args.replaces)
    installed = user.find_installed(args.name)
    answer: JSONObject = {
        "definition": f"user:{args.name}",
        "path": str(draft.path),
        "draft": draft.draft_hash,
        "written": args.source is not None,
        "installed_review_hash": installed.review_hash if installed is not None else None,
        "review": _draft_review(draft, replace=installed is not None),
    }
    if args.source is None:
        answer["source"] = draft.source
    return answer


def _draft_review(draft: user.Draft, *, replace: bool) -> JSONObject:
    """The review of a draft's text as ``cairn workflow review`` gives it, and what a
    person runs to install it (``replace``: over the installed ``user:NAME``); or every
    violation, for the model to fix."""
    try:
        review = review_source(draft.source, filename=f"{draft.name}.py")
    except ReviewRejected as exc:
        return {"passed": False,
                "violations": [v.model_dump(mode="json") for v in exc.violations]}
    verb = "install --replace" if replace else "install"
    return {
        "passed": True,
        "review_hash": review.review_hash,
        "manifest": render_review(review),
        "to_install": f"a person reads 'cairn workflow review {draft.path}', then runs "
        f"'cairn workflow {verb} {draft.path} --confirm {review.review_hash}' (and "
        f"'cairn workflow expose user:{draft.name}' to offer it here); no tool installs",
    }


def _event_line(event: Mapping[str, JSONValue]) -> str:
    where = f" {event['op_id']}" if event.get("op_id") else ""
    return f"{event['event']}{where}"


# A fixed tool's handler, given the call's arguments and the tool's name (for errors).
ToolHandler = Callable[[JSONObject, str, Session, Reporter | None], JSONObject]


def _fixed(
    model: type[ParsedArgs],
    handler: Callable[[ParsedArgs, Session, Reporter | None], JSONObject],
    description: str,
) -> tuple[type[ToolArgs], ToolHandler, str]:
    """A :data:`FIXED` entry: the handler parses the arguments with ``model`` first."""

    def parsing(
        arguments: JSONObject, name: str, session: Session, report: Reporter | None
    ) -> JSONObject:
        return handler(_parsed(model, arguments, name), session, report)

    return model, parsing, description


FIXED: dict[str, tuple[type[ToolArgs], ToolHandler, str]] = {
    "cairn_runs": _fixed(
        RunsArgs, _runs,
        "Your Cairn runs: state, definition, current operation, "
        "settlement."),
    "cairn_show": _fixed(
        RunArgs, _show,
        "One run: its state, operations, the question it waits on "
        "(if any), its settlement and progress."),
    "cairn_artifact": _fixed(
        ArtifactArgs, _artifact,
        "Read a file an agent of a run published "
        "(its operation's artifacts in cairn_show): its text, or only its size "
        "and hash when it is not text."),
    "cairn_watch": _fixed(
        WatchArgs, _watch,
        "Follow a run: its events until its state changes, it "
        "ends, or the timeout; progress notifications carry each event. Call "
        "again with the returned cursor to go on."),
    "cairn_inbox": _fixed(
        InboxArgs, _inbox,
        "Questions your runs wait on (answer them with "
        "cairn_answer), and approval requests, which only a person decides."),
    "cairn_answer": _fixed(
        AnswerArgs, _answer,
        "Answer a run's question (its challenge from "
        "cairn_inbox or cairn_watch): text, or JSON for a typed question."),
    "cairn_workflow_draft": _fixed(
        DraftArgs, _draft,
        "Write a Cairn workflow as a draft in your "
        "config and review it statically (violations to fix, or its "
        "effect manifest and review hash); without 'source', read the "
        "current draft. A draft never runs: a person installs it."),
}


def list_tools() -> list[Tool]:
    """Every exposed workflow's tool, then the fixed tools."""
    tools = [workflow_tool(w) for w in exposed_workflows()]
    for name, (model, _, description) in FIXED.items():
        tools.append(Tool(name=name, description=description, input_schema=_schema(model)))
    return tools


def call_tool(name: str, arguments: JSONObject, session: Session,
              report: Reporter | None) -> JSONObject:
    """Carry out tool ``name``; CairnError when cairnd or the arguments refuse it,
    :class:`UnknownTool` when there is no such tool."""
    if name in FIXED:
        _, handler, _ = FIXED[name]
        return withheld_object(handler(arguments, name, session, report))
    for workflow in exposed_workflows():
        if workflow.tool_name == name:
            return launch(workflow, _parsed(LaunchArgs, arguments, name), session)
    raise UnknownTool(
        f"no tool named {name!r}",
        hint="see tools/list; a workflow is offered once a person runs "
        "'cairn workflow expose user:NAME'",
    )


def withheld(value: JSONValue) -> JSONValue:
    """``value`` without any approval's fingerprint, wherever cairnd put one (the waiting
    items, the question facet, the data of an ``approval-requested`` event): it is what
    ``cairn approve`` takes, and only a person approves."""
    if isinstance(value, dict):
        return withheld_object(value)
    if isinstance(value, list):
        return [withheld(v) for v in value]
    return value


def withheld_object(value: JSONObject) -> JSONObject:
    """:func:`withheld` of an object."""
    return {k: withheld(v) for k, v in value.items() if k not in WITHHELD_KEYS}


def _parsed(model: type[ParsedArgs], arguments: JSONObject, name: str) -> ParsedArgs:
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise invalid(exc, f"{name} arguments", top="arguments") from exc


def launch(workflow: ExposedWorkflow, args: LaunchArgs, session: Session) -> JSONObject:
    """Launch ``workflow`` on ``args.project`` (default: the server's directory) as
    ``cairn launch`` does: the project as an open descriptor, a ``user:`` definition's
    installed source with its hash, which must still be the exposed one."""
    root = Path(os.path.normpath(session.cwd / Path(args.project or ".").expanduser()))
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(
            f"project {root}: {exc.strerror}",
            hint="give the project directory as 'project' (an absolute path of yours)",
        ) from exc
    try:
        given = _form_filled(workflow, args.args, root, session)
        source = confirm = None
        if workflow.definition.startswith("user:"):
            source, confirm = for_launch(workflow.definition, fd, str(root))
            if confirm != workflow.review.review_hash:
                raise PermissionDenied(
                    f"{workflow.definition} changed since it was exposed",
                    hint=f"a person exposes it again: 'cairn workflow expose "
                    f"{workflow.definition}'",
                )
        result = typed(LaunchReply, session.request(
            LaunchRequest(
                definition=workflow.definition,
                source=source,
                confirm=confirm,
                args=given,
                project=str(root),
                apply_mode=args.apply,
                run_key=args.run_key,
            ),
            fd=fd,
            expect=Expected(
                project=str(root),
                definition=workflow.definition,
                review_hash=workflow.review.review_hash,
                source=source,
                apply_mode=args.apply,
                args=given,
                scripted={},
            ),
        ))
    finally:
        os.close(fd)
    launched: JSONObject = {"run_id": result.run_id, "definition": workflow.definition,
                "project": str(root), "state": result.state}
    if result.position is not None:
        launched["position"] = result.position  # queued for a machine-wide slot
    if result.launched_before:
        launched["launched_before"] = True  # the run this run_key named, not a new one
    return launched


def _form_filled(workflow: ExposedWorkflow, given: JSONObject, root: Path,
                 session: Session) -> JSONObject:
    """``given``, or, when it lacks a required input field and the client shows forms,
    ``given`` with what the person entered in the launch form (each field proposed at the
    caller's value). A declined form launches nothing."""
    if session.elicit is None:
        return given
    review = workflow.review
    form = launch_form(json_schema(review.models, review.workflow.input), given)
    if form is None:
        return given
    # a client shows the message to the person as it is: no control character reaches it
    answer = session.elicit(
        printable(f"Launch {workflow.definition} on {root}: {review.workflow.description}"),
        form)
    if answer.action != "accept":
        done = {"decline": "declined", "cancel": "cancelled"}[answer.action]
        raise UsageError(f"the launch form was {done}; nothing was launched",
                         hint="a person fills it in, or the call gives 'args'")
    return filled(given, answer.content)
