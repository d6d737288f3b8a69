"""``cairn launch``: what it sends cairnd, and its arguments read without click.

A launch is the command people (and schedules, scripts and CI jobs) start many at a time,
so it costs no more than an interpreter's start and one request: this module loads neither
click nor pydantic. The request goes as plain JSON (cairnd validates it as a
:class:`~cairn.protocol.daemon.LaunchRequest`), the description comes back as JSON
(:mod:`cairn.cli.attest`), the reply is read as JSON (a test holds what is read to
:class:`~cairn.protocol.run_replies.LaunchReply`), and :func:`read_argv` reads the common
command line itself.
``cairn launch --help`` and anything :func:`read_argv` is unsure of go to the click
command (:func:`cairn.cli.runs.launch`), whose options :data:`OPTIONS` must match (a test
holds them to it) and which calls :func:`launch` with what it parsed.
"""

from __future__ import annotations

import os
import sys

from cairn import leanjson
from cairn.cli.attest import Expected
from cairn.cli.client import emit, fail, object_or_empty, request
from cairn.errors import PermissionDenied, UsageError
from cairn.terminal import printable

# Read by type checkers only: typing and pathlib cost a launch 12 ms of CPU to import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from cairn.protocol.jsonvalue import JSONObject

APPLY_MODES = ("auto", "ask", "never")
# Limits counted in bytes: their values may be written as sizes (2G, 512M).
BYTE_LIMITS = frozenset({"memory_max"})

# The click command's options: option -> (keyword of launch(), repeatable); None: a flag.
OPTIONS: dict[str, tuple[str, bool] | None] = {
    "--args": ("args", False),
    "--arg": ("arg", True),
    "--project": ("project", False),
    "--scripted": ("scripted", True),
    "--confirm": ("confirm", False),
    "--limit": ("limit", True),
    "--apply": ("apply_mode", False),
    "--run-key": ("run_key", False),
    "--json": None,
    "--watch": None,  # a launch that stays to follow its run: read by the click command
    "--wait": None,  # likewise
}
# A shell's completion request reaches click through its environment, whatever the argv.
COMPLETION_ENV = "_CAIRN_COMPLETE"


def read_argv(argv: list[str], environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The keywords of :func:`launch` for ``cairn ARGV`` when it is a launch this reader
    understands as click would; None for anything else (help, another command, a value
    that starts with a dash, an unknown option, a bad choice), which the click command
    then reads and, when wrong, explains."""
    if not argv or argv[0] != "launch" or COMPLETION_ENV in environ:
        return None
    given: dict[str, Any] = {"scripted": [], "limit": [], "arg": []}
    definition = None
    words = iter(argv[1:])
    for word in words:
        if not word.startswith("-"):
            if definition is not None:
                return None
            definition = word
            continue
        name, eq, attached = word.partition("=")
        if name not in OPTIONS:
            return None
        spec = OPTIONS[name]
        if spec is None:
            if eq or name != "--json":
                return None
            given["json_out"] = True
            continue
        value = attached if eq else next(words, None)
        if value is None or (not eq and value.startswith("-")):
            return None
        keyword, repeatable = spec
        if repeatable:
            given[keyword].append(value)
        else:
            given[keyword] = value
    if definition is None or given.get("apply_mode", "auto") not in APPLY_MODES:
        return None
    if "project" in given:  # as click's Path reads it: "" is ".", "p/" is "p"
        given["project"] = os.path.normpath(given["project"])
    return {"definition": definition, **given}


def arg_pairs(pairs: Iterable[str]) -> JSONObject:
    """``--arg KEY=VALUE`` options as arguments: VALUE read as JSON where it is JSON (3,
    true, null, [1, 2], "quoted text"), else taken as the text it is."""
    found: JSONObject = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key or not key.isidentifier():
            fail(f"--arg {pair!r} is not KEY=VALUE",
                 hint="e.g. --arg objective='add a CHANGELOG entry' --arg attempts=3", code=2)
        try:
            found[key] = leanjson.loads(text)
        except leanjson.JSONError:
            found[key] = text
    return found


def launch(
    definition: str,
    *,
    args: str = "{}",
    arg: Iterable[str] = (),
    project: str | os.PathLike[str] = ".",
    scripted: Iterable[str] = (),
    confirm: str | None = None,
    limit: Iterable[str] = (),
    apply_mode: str = "auto",
    run_key: str | None = None,
    json_out: bool = False,
) -> str:
    """Launch ``definition`` on ``project`` and print the new run's ID (or, with
    ``json_out``, cairnd's answer); a queued run says so on stderr, and so does a run
    ``run_key`` named before (its ID is printed: the launch is not made again). Returns
    the run's ID."""
    source = None
    if definition.endswith(".py"):
        # here, not at the top: only a workflow file pays for the definitions and review
        from pathlib import Path

        from cairn.definitions.resolve import refuse_draft_file

        refuse_draft_file(Path(definition), "launched")
        try:
            source = Path(definition).read_text()
        except OSError as exc:
            fail(f"cannot read {definition}: {exc.strerror}", code=2)
    try:
        parsed = leanjson.loads(args)
    except leanjson.JSONError as exc:
        fail(
            f"--args is not JSON: {exc.msg} (column {exc.colno})",
            hint='quote it for the shell: --args \'{"objective": "…"}\'',
            code=2,
        )
    if not isinstance(parsed, dict):
        fail("--args must be a JSON object", code=2)
    parsed.update(arg_pairs(arg))
    root = os.path.abspath(os.path.expanduser(project))
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        fail(f"project {root} not found", code=2)
    except NotADirectoryError:
        fail(f"project {root} is not a directory", code=2)
    except PermissionError:
        fail(f"project {root} is not readable by you", code=2)
    try:
        if definition.startswith(("user:", "project:")):
            source, confirm = _pinned(definition, confirm, fd, root)
        profiles = load_scripted(scripted)
        result = object_or_empty(request(
            launch_request(
                definition=definition,
                source=source,
                confirm=confirm,
                limits=parse_limits(limit),
                apply_mode=apply_mode,
                args=parsed,
                project=root,
                scripted=profiles,
                run_key=run_key,
            ),
            fd=fd,
            expect=Expected(
                project=root,
                definition=definition,
                review_hash=confirm if source is not None else None,
                source=source,
                apply_mode=apply_mode,
                args=parsed,
                scripted=profiles,
            ),
        ))
    finally:
        os.close(fd)
    run_id = str(result["run_id"])
    if json_out:
        emit(result)
        return run_id
    # cairnd's words: escaped like every other text this CLI did not write
    print(printable(run_id), flush=True)
    if result.get("launched_before"):
        print(
            f"run key {printable(run_key)} names run {printable(run_id)} "
            f"({printable(result.get('state'))}), launched before: not launched again",
            file=sys.stderr,
            flush=True,
        )
    elif result.get("state") == "queued":
        print(queued_note(run_id, result.get("position")), file=sys.stderr, flush=True)
    return run_id


def launch_request(
    *,
    definition: str,
    source: str | None,
    confirm: str | None,
    limits: dict[str, int],
    apply_mode: str,
    args: JSONObject,
    project: str,
    scripted: dict[str, JSONObject],
    run_key: str | None = None,
) -> dict[str, object]:
    """The ``launch`` request as it goes on the socket: every field of
    :class:`~cairn.protocol.daemon.LaunchRequest`, in its JSON form."""
    return {
        "op": "launch",
        "definition": definition,
        "args": args,
        "project": project,
        "scripted": scripted,
        "source": source,
        "confirm": confirm,
        "limits": limits,
        "apply_mode": apply_mode,
        "run_key": run_key,
    }


def queued_note(run_id: str, position: object) -> str:
    """What a person is told of a run that waits for a machine-wide slot."""
    where = f" (position {printable(position)})" if position else ""
    return (
        f"queued{where}: the machine runs as many runs as its limit allows; {printable(run_id)} "
        "starts when a slot frees ('cairn show' tells its place, 'cairn cancel' drops it)"
    )


def _pinned(definition: str, confirm: str | None, fd: int, root: str) -> tuple[str, str]:
    """(source, review hash) of a user: or project: definition as installed or trusted;
    a --confirm given with it must be that hash."""
    # here, not at the top: only these definitions pay for the definitions and review
    from cairn.definitions.resolve import for_launch

    source, review_hash = for_launch(definition, fd, root)
    if confirm is not None and confirm != review_hash:
        raise PermissionDenied(
            f"{definition} has review hash {review_hash}, not the confirmed {confirm}",
            hint="launch it without --confirm: its install or trust decision confirms it",
        )
    return source, review_hash


def parse_limits(specs: Iterable[str]) -> dict[str, int]:
    """``--limit NAME=NUMBER`` options as a mapping (``NAME=SIZE`` for a byte limit)."""
    limits: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        if sep and name in BYTE_LIMITS and value.strip():
            from cairn.sizes import parse_size  # sizes compile a pattern: only memory_max pays

            limits[name] = parse_size(value)
            continue
        if not sep or not value.strip().isdigit():
            raise UsageError(
                f"--limit takes NAME=NUMBER, got {spec!r}",
                hint="sizes such as 2G are for memory_max only",
            )
        limits[name] = int(value)
    return limits


def load_scripted(specs: Iterable[str]) -> dict[str, JSONObject]:
    """``--scripted PROFILE=FILE.json`` options: each file read and validated as a
    scripted profile named PROFILE, in its JSON form."""
    specs = list(specs)
    if not specs:
        return {}
    from cairn.protocol.launch import ProfileSpec  # only --scripted pays for it

    scripted: dict[str, JSONObject] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise UsageError(f"--scripted takes PROFILE=FILE.json, got {spec!r}")
        try:
            with open(file) as opened:
                data = leanjson.loads(opened.read())
        except OSError as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror}") from exc
        except leanjson.JSONError as exc:
            raise UsageError(f"{file} is not JSON: {exc.msg} at line {exc.lineno}") from exc
        scripted[name] = ProfileSpec.model_validate(
            {"kind": "scripted", **data, "name": name}
        ).model_dump(mode="json")
    return scripted
