"""Launch: resolve and review a definition, validate arguments, freeze the launch
description, record the run through the machine-wide admission and ask the broker to pin
it and (admitted) start its coordinator."""

from __future__ import annotations

import functools
import logging
import os
import pwd
import re
import secrets
import stat
import threading
import time
from collections.abc import Sequence
from importlib import resources
from typing import NotRequired, TypedDict

from pydantic import BaseModel, ValidationError

import cairn
from cairn import paths, retention
from cairn.admission import admission_config
from cairn.capsule import current_release
from cairn.config import Problems
from cairn.daemon import admission, attest
from cairn.definitions.builtin import builtin_names, builtin_source
from cairn.errors import CairnError, NotFound, PermissionDenied, UsageError, ValidationFailed
from cairn.evaluators import frozen_evaluators
from cairn.hostconfig import check_profile, profile_file
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow, RunRow, RunState
from cairn.journal.runs import RunKeyTaken
from cairn.operations.measure_proposal import evaluators_of
from cairn.policy import load_policy
from cairn.protocol.daemon import LaunchRequest
from cairn.protocol.definitions import DEFINITION_RE
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.launch import (
    LaunchDescription,
    Limits,
    ModelRoute,
    ProfileSpec,
    ProjectSpec,
    ReplayOrigin,
    SettlementPolicySpec,
)
from cairn.protocol.names import is_profile_name
from cairn.protocol.run_replies import LaunchReply
from cairn.providers import load_providers, providers_path, unpriced
from cairn.validation import first_error, invalid
from cairn.verifiers import matching_verifiers
from cairn.workflow.review import Review, review_source
from cairn.workflow.schema import build_models

PROFILE_BUILTIN_RE = re.compile(r"^builtin:([a-z][a-z0-9_-]{0,40})$")

log = logging.getLogger(__name__)


def resolve_definition(definition: str) -> tuple[str, str]:
    """Return (source, filename) of a definition cairnd reads itself: ``builtin:`` only.
    ``user:`` and ``project:`` definitions live where cairnd does not read (the person's
    config, the project): the client sends their source with the confirmed hash."""
    match = DEFINITION_RE.match(definition)
    if match is None or match.group(1) != "builtin":
        if match is not None:
            raise UsageError(
                f"{definition}: cairnd does not read user: or project: definitions itself",
                hint="the person's CLI ('cairn launch', 'cairn schedule') sends their source",
            )
        raise NotFound(
            f"unknown definition {definition!r}",
            hint=f"builtin definitions: {', '.join('builtin:' + n for n in builtin_names())}",
        )
    return builtin_source(match.group(2))


def sends_source(definition: str) -> bool:
    """Whether ``definition`` is one whose source the person's CLI sends (``user:``,
    ``project:``) rather than one cairnd reads itself (``builtin:``)."""
    match = DEFINITION_RE.match(definition)
    return match is not None and match.group(1) != "builtin"


def source_filename(definition: str) -> str:
    """The file name sent source is reviewed under: ``NAME.py`` of a ``user:`` or
    ``project:`` definition, a workflow file's own basename otherwise."""
    match = DEFINITION_RE.match(definition)
    if match is not None and match.group(1) != "builtin":
        return f"{match.group(2)}.py"
    return file_definition_name(definition)


def file_definition_name(definition: str) -> str:
    """The file name a workflow file is reviewed under (its basename, ``*.py``)."""
    name = os.path.basename(definition)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,80}\.py", name):
        raise UsageError(f"{definition!r} is not a workflow file name (NAME.py)")
    return name


def unconfirmed(definition: str, filename: str, review_hash: str) -> PermissionDenied:
    """Sent source whose review hash is not the one the person confirmed."""
    if DEFINITION_RE.match(definition):
        return PermissionDenied(
            f"{definition} does not match its confirmed hash: its review hash is {review_hash}",
            hint="it changed while it was being launched; launch it again",
        )
    return PermissionDenied(
        f"{filename} is not confirmed: its review hash is {review_hash}",
        hint=f"read 'cairn workflow review {definition}', then launch with "
        f"--confirm {review_hash}",
    )


# One review or model build at a time: a burst of launches of one definition (cairnd
# serves each on its own thread) then reviews it once, not once per launch that arrived
# before the first review was remembered. Reviews are pure CPU: queueing costs nothing.
_REVIEWING = threading.RLock()


def reviewed(source: str, filename: str) -> Review:
    """``review_source``, remembered: a review depends on nothing but the source and its
    file name, and a definition is launched again and again. A rejected source is not
    remembered."""
    with _REVIEWING:
        return _reviewed(source, filename)


@functools.lru_cache(maxsize=32)
def _reviewed(source: str, filename: str) -> Review:
    return review_source(source, filename=filename)


_INPUT_MODELS: dict[str, type[BaseModel]] = {}


def input_model(review: Review) -> type[BaseModel]:
    """The workflow's input model, built once per review hash: building a model costs a
    launch more than everything else cairnd does for it."""
    with _REVIEWING:
        model = _INPUT_MODELS.get(review.review_hash)
        if model is None:
            model = build_models(review.models)[review.workflow.input]
            if len(_INPUT_MODELS) >= 32:
                _INPUT_MODELS.clear()
            _INPUT_MODELS[review.review_hash] = model
        return model


def validate_args(review: Review, args: JSONObject) -> JSONObject:
    """``args`` validated by the workflow's input model, as JSON."""
    model = input_model(review)
    try:
        return model.model_validate(args).model_dump(mode="json")
    except ValidationError as exc:
        raise invalid(
            exc,
            f"arguments do not match {review.workflow.input}",
            top="args",
            hint=f"fields: {', '.join(model.model_fields)}",
        ) from exc


def check_project(path: str | None, fd: int | None, uid: int) -> ProjectSpec:
    """The caller proves access by sending an open directory fd; it must own it."""
    if not path or fd is None:
        raise UsageError("no project given", hint="pass --project DIR")
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        raise UsageError(f"project path {path!r} must be absolute and normalised")
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"project {path} is not a directory")
    if st.st_uid != uid:
        raise PermissionDenied(
            f"project {path} is owned by uid {st.st_uid}, not by you",
            hint="you can only launch on a project you own",
        )
    return ProjectSpec(root=path, owner_uid=uid, on_pool_fs=False)


def builtin_profile_prompt(name: str) -> str | None:
    """The system prompt of ``builtin:NAME`` shipped with Cairn, if there is one."""
    match = PROFILE_BUILTIN_RE.match(name)
    if match is None:
        return None
    file = resources.files("cairn.builtin") / "profiles" / f"{match.group(1)}.md"
    return file.read_text() if file.is_file() else None


def resolve_profiles(
    review: Review, scripted: dict[str, ProfileSpec], *, problems: Problems | None = None
) -> dict[str, ProfileSpec]:
    """Freeze every profile the workflow's agents name: a scripted profile the caller
    supplied, the host's ``/etc/cairn/profiles.d/<name>.toml``, or a builtin ``llm``
    profile on the host's default model provider. ``llm`` profiles are frozen with their
    system prompt and provider name.

    ``providers.toml`` and every profile file are read before anything is refused, so the
    problems of all of them (with those already in ``problems``) come as one
    :class:`cairn.config.ConfigError`."""
    found = Problems() if problems is None else problems
    providers = load_providers(problems=found)
    read: dict[str, ProfileSpec] = {}
    builtin_prompts: dict[str, str | None] = {}
    for name in sorted({a.profile for a in review.agents.values()}):
        if name in scripted:
            profile = scripted[name]
            if profile.kind != "scripted":
                raise PermissionDenied(
                    f"profile {name}: only scripted profiles may come from the caller",
                    hint="command profiles are configured by the administrator in "
                    "/etc/cairn/profiles.d/",
                )
            read[name] = profile.model_copy(update={"name": name})
            continue
        if not is_profile_name(name):
            raise UsageError(f"invalid profile name {name!r}")
        file = profile_file(name)
        builtin_prompts[name] = builtin_profile_prompt(name)
        before = len(found)
        data = found.toml(file)
        if data is None and len(found) == before:  # the file is missing
            if builtin_prompts[name] is None:
                raise NotFound(
                    f"profile {name} is not configured on this host",
                    hint=f"pass --scripted {name}=FILE.json, or configure {file}",
                )
            data = {"kind": "llm"}
        if data is not None:
            checked = check_profile(found, file, data, name)
            if checked is not None:
                read[name] = checked.model_copy(
                    update={"config_sha256": found.read_sha256.get(file, "")}
                )
    found.check()
    resolved: dict[str, ProfileSpec] = {}
    for name, profile in read.items():
        if profile.kind == "llm":
            profile = profile.model_copy(  # noqa: PLW2901  (the resolved profile)
                update={
                    "provider": profile.provider or providers.route().provider,
                    "system_prompt": profile.system_prompt or builtin_prompts.get(name) or "",
                }
            )
        if profile.provider and name not in scripted:
            route = providers.route(profile.provider)  # fail at launch, not at agent start
            if profile.kind == "llm" and route.api != "openai":
                raise UsageError(
                    f"profile {name}: Cairn's llm agent speaks the OpenAI chat API, and "
                    f"provider {route.provider} speaks the {route.api} API",
                    hint="give the profile a provider with api = \"openai\" (or an "
                    "OpenAI-compatible gateway) in /etc/cairn/providers.toml",
                )
        resolved[name] = profile
    unknown = sorted(set(scripted) - set(resolved))
    if unknown:
        raise UsageError(f"the workflow has no agent with profile {', '.join(unknown)}")
    return resolved


def resolve_routes(profiles: dict[str, ProfileSpec]) -> dict[str, ModelRoute]:
    """Freeze the provider route of every profile that reaches the model relay."""
    providers = load_providers()
    names = sorted({p.provider for p in profiles.values() if p.provider})
    return {name: providers.route(name) for name in names}


def settlement_policy(review: Review, profiles: dict[str, ProfileSpec]) -> SettlementPolicySpec:
    """What of the run's proposal may settle: the workflow's write paths, less what any of
    its profiles' tools leave behind (their ``settle_ignore``)."""
    return SettlementPolicySpec(
        write_paths=review.workflow.write_paths or ["**"],
        ignore=sorted({glob for p in profiles.values() for glob in p.settle_ignore}),
    )


# Limits the host sets (admission.toml), which no launch may choose.
HOST_LIMITS = frozenset({"daily_cost_cents"})


def resolve_limits(
    overrides: dict[str, int], routes: dict[str, ModelRoute], daily: int | None = None
) -> Limits:
    """Defaults, with the caller's overrides (validated: unknown names and values out of
    range are refused) and the host's ``daily`` money budget per user. A money budget
    needs a price for every provider the run's agents reach: it could not be kept
    otherwise."""
    choosable = sorted(set(Limits.model_fields) - HOST_LIMITS)
    unknown = sorted(set(overrides) - set(choosable))
    if unknown:
        raise UsageError(f"unknown limit {', '.join(unknown)}",
                         hint=f"limits: {', '.join(choosable)}")
    try:
        limits = Limits(**overrides, daily_cost_cents=daily)
    except ValidationError as exc:
        where, message = first_error(exc, top="limits")
        raise ValidationFailed(f"limit {where}: {message}") from exc
    missing = unpriced(routes)
    if missing and limits.model_cost_cents is not None:
        raise UsageError(
            f"limit model_cost_cents needs prices, and provider {', '.join(missing)} has none",
            hint=f"set input_price_per_million and output_price_per_million in "
            f"{providers_path()}, or launch without the limit",
        )
    if missing and daily is not None:
        raise PermissionDenied(
            f"this host keeps a daily model money budget per user, and provider "
            f"{', '.join(missing)} has no prices to keep it with",
            hint=f"an administrator sets input_price_per_million and output_price_per_million "
            f"in {providers_path()}",
        )
    return limits


class Admitted(TypedDict):
    """A new run as the machine-wide admission took it: ``state`` and, queued, its
    ``position`` (1 = next)."""

    state: RunState
    position: NotRequired[int | None]


def launch(
    journal: Journal,
    request: LaunchRequest,
    uid: int,
    fd: int | None,
    *,
    run_id: str | None = None,
    schedule: JSONObject | None = None,
) -> JSONObject:
    """Review, freeze and start one run (:func:`start`), its :class:`LaunchReply` as
    cairnd sends it."""
    started = start(journal, request, uid, fd, run_id=run_id, schedule=schedule)
    return started.model_dump(mode="json", exclude_unset=True)


def start(
    journal: Journal,
    request: LaunchRequest,
    uid: int,
    fd: int | None,
    *,
    run_id: str | None = None,
    schedule: JSONObject | None = None,
) -> LaunchReply:
    """Review, freeze and start one run. A schedule admission passes the run ID it
    recorded beforehand and the schedule revision that authorized the run."""
    if not request.definition:
        raise UsageError("no definition given", hint="e.g. cairn launch builtin:implement")
    if request.source is not None:
        source, filename = request.source, source_filename(request.definition)
        review = reviewed(source, filename)
        if request.confirm != review.review_hash:
            raise unconfirmed(request.definition, filename, review.review_hash)
    else:
        source, filename = resolve_definition(request.definition)
        review = reviewed(source, filename)
    args = validate_args(review, request.args)
    project = check_project(request.project, fd, uid)
    key = request.run_key
    if key is not None and (earlier := journal.run_by_key(uid, key)) is not None:
        return launched_before(journal, earlier, request, review.review_hash, args, project)
    desc = freeze(
        request,
        uid,
        run_id or "flow_" + secrets.token_hex(16),
        source=source,
        filename=filename,
        review=review,
        args=args,
        project=project,
        schedule=schedule,
    )
    attest.require_channel()  # an unattested launch is refused before the run exists
    retention.admit("launch")  # a full pool refuses the launch before the run exists
    try:
        admitted = admit_or_queue(journal, desc, run_key=key)
    except RunKeyTaken as taken:  # a concurrent launch of the same key recorded it first
        return launched_before(journal, taken.run, request, review.review_hash, args, project)
    return LaunchReply.model_validate({
        "run_id": desc.run_id,
        "review_hash": review.review_hash,
        "launch_hash": desc.launch_hash(),
        **admitted,
    })


def launched_before(
    journal: Journal,
    earlier: RunRow,
    request: LaunchRequest,
    review_hash: str,
    args: JSONObject,
    project: ProjectSpec,
) -> LaunchReply:
    """The answer to a launch whose run key names ``earlier``: that run, when it was
    launched with the same definition, reviewed source, arguments and project; otherwise
    a ``UsageError`` naming what differs (a key names one launch, not a slot to reuse)."""
    desc = journal.launch_description(earlier.run_id)
    differs = [
        what
        for what, same in (
            ("definition", desc.definition == request.definition),
            ("source", desc.review_hash == review_hash),
            ("arguments", desc.args == args),
            ("project", desc.project.root == project.root),
        )
        if not same
    ]
    if differs:
        raise UsageError(
            f"run key {earlier.run_key} already names run {earlier.run_id}, launched with "
            f"another {', '.join(differs)}",
            hint=f"use another --run-key, or see that run with 'cairn show {earlier.run_id}'",
        )
    log.info("launch of run key %s answered with run %s", earlier.run_key, earlier.run_id)
    return LaunchReply(
        run_id=earlier.run_id,
        review_hash=desc.review_hash,
        launch_hash=desc.launch_hash(),
        state=earlier.state,
        launched_before=True,
    )


def admit_or_queue(
    journal: Journal,
    desc: LaunchDescription,
    *,
    imported: Sequence[OpRow] = (),
    run_key: str | None = None,
) -> Admitted:
    """Record the new run through the machine-wide admission (:mod:`cairn.admission`):
    started now if a slot is free, else ``queued`` — pinned on its owner's attestation
    now, while the owner's CLI is there to give it, and started by cairnd when a slot
    frees. A replay passes the operations it imports. Returns the run's ``state`` and,
    queued, its ``position`` (1 = next)."""
    config = admission.current_config()
    admitted = journal.launch_run(
        desc,
        machine_limit=config.machine_limit,
        user_limit=config.user_limit,
        imported=imported,
        run_key=run_key,
    )
    start_or_fail(journal, desc)  # with no start intent (queued), the broker only pins
    if admitted:
        return {"state": "pending"}
    joined = journal.join_queue(desc.run_id)
    admission.queue_changed()
    state = journal.get_run(desc.run_id).state
    result: Admitted = {"state": state}
    if joined and state == "queued":
        result["position"] = admission.position(journal, desc.run_id)
    return result


def freeze(
    request: LaunchRequest,
    uid: int,
    run_id: str,
    *,
    source: str,
    filename: str,
    review: Review,
    args: JSONObject,
    project: ProjectSpec,
    schedule: JSONObject | None = None,
    replay: ReplayOrigin | None = None,
) -> LaunchDescription:
    """The launch description of a new run of reviewed ``source``: the host's current
    policy, verifiers, evaluators, profiles and routes, read and checked now."""
    if not request.definition:
        raise UsageError("no definition given", hint="e.g. cairn launch builtin:implement")
    config = Problems()
    load_policy(problems=config)  # a bad policy refuses the launch, not its first agent
    verifiers = matching_verifiers(project.root, request.definition, config)
    evaluators = frozen_evaluators(evaluators_of(review.manifest(), args), config)
    retention.load_policy(problems=config)
    # read here, not as admission does (a broken file there means the defaults): a
    # daily money budget the host set is kept or the launch refused
    daily = admission_config(problems=config).max_daily_cost_cents_per_user
    profiles = resolve_profiles(review, request.scripted, problems=config)
    try:
        user = pwd.getpwuid(uid)
    except KeyError as exc:
        raise PermissionDenied(f"uid {uid} has no account on this host") from exc
    if uid == 0:
        raise PermissionDenied("runs are not launched as root", hint="launch as a normal user")
    return LaunchDescription(
        run_id=run_id,
        owner_uid=uid,
        owner_gid=user.pw_gid,
        owner_name=user.pw_name,
        definition=request.definition,
        source=source,
        source_filename=filename,
        review_hash=review.review_hash,
        review=review.model_dump(mode="json"),
        args=args,
        project=project,
        profiles=profiles,
        routes=(routes := resolve_routes(profiles)),
        limits=resolve_limits(request.limits, routes, daily),
        cairn_version=cairn.__version__,
        created_at=time.time(),
        schedule=schedule,
        capsule_hash=current_release(paths.release_dir()),
        apply_mode=request.apply_mode,
        verifiers=verifiers,
        evaluators=evaluators,
        policy=settlement_policy(review, profiles),
        replay=replay,
    )


def start_or_fail(journal: Journal, desc: LaunchDescription) -> None:
    """Have the broker pin the new run on its owner's attestation and start its
    coordinator (a queued run has no start intent yet: it is only pinned), or end the run
    ``failed`` with the reason, so a launch is all or nothing:
    a run its launch could not start is never started later (the boot reconciler starts
    only ``pending`` and ``running`` runs, and fails one whose launch left no receipt). A
    coordinator that took the run all the same (the reply was lost) keeps it."""
    run_id = desc.run_id
    try:
        reply = attest.start_attested(desc)
    except CairnError as exc:
        reason = f"the launch could not start the run: {exc.message}"
        if not journal.fail_unstarted_run(run_id, reason):
            log.warning("%s: the broker answered %s, but its coordinator runs", run_id, exc)
            return
        log.error("%s failed at launch: %s", run_id, exc.message)
        exc.message = f"{exc.message} (run {run_id} is recorded failed and will not start)"
        raise
    # The receipt is the launch's durable "done": the boot reconciler fails a run that
    # never got one (cairnd stopped mid-launch) instead of starting it.
    journal.record_receipts(run_id, [r.model_dump(mode="json") for r in reply.receipts])
