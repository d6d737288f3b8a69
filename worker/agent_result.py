"""``cairn-worker agent-result -- CLI ARGS…``: run an agent CLI that answers in prose
(``claude -p``, ``codex exec``, ``aider --message``, ``opencode run``) and turn its final
answer into the typed result a ``command`` profile must end with,
``{"output": {...}, "handoff": "..."}``. It ships in the sealed release, so a profile in
``/etc/cairn/profiles.d`` uses it as::

    argv = ["/usr/bin/python3", "-I", "-B", "/runtime/capsule/cairn-worker", "agent-result",
            "--", "/usr/local/bin/claude", "-p", "{prompt}"]

It adds to the prompt argument (the one holding ``$CAIRN_PROMPT``) the fields the answer
must end with, as one JSON object (from ``$CAIRN_OUTPUT_SCHEMA``, set by the worker), in
the way ``--answer STYLE`` (before ``--``) names, for the CLI's own conventions:

- ``fenced`` (the default): in a ```` ```json ```` block at the end of the answer;
- ``line``: on a last line of its own, no code block (aider reads a fenced block as a file
  to write);
- ``file``: written by the CLI's own tools to ``$CAIRN_RESULT_FILE`` (``/outputs/result.json``),
  which the worker reads and judges itself; an answer without it is read as below.

It runs the CLI with no stdin until it exits, its output copied to the unit's log, and
reads the answer (its last MiB):

- the last JSON object in it that has every required field of the schema (or is itself
  ``{"output": …, "handoff": …}``) is the output;
- otherwise, when the schema requires exactly one field and it is a string, the whole
  answer is that field (cut to its ``maxLength``);
- otherwise it fails, naming the fields the answer lacked.

The handoff is the answer (its last ``HANDOFF_LIMIT`` characters). It prints the result as
its only stdout line, which the worker reads; the coordinator validates the output against
the workflow's own model as for any agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from cairn.worker.agentproc import run_to_exit

if TYPE_CHECKING:
    from cairn.protocol.jsonvalue import JSONObject

HANDOFF_LIMIT = 8000
ANSWER_LIMIT = 1 << 20  # the answer's last bytes kept; its JSON object is at the end
ANSWER_STYLES = ("fenced", "line", "file")
RESULT_FILE = "/outputs/result.json"
USAGE = "usage: cairn-worker agent-result [--answer fenced|line|file] -- CLI [ARG…]"


class NoResult(Exception):
    """The CLI's answer cannot be made into the typed result."""


def _properties(schema: JSONObject) -> dict[str, JSONObject]:
    """The schema's properties; one whose schema is not an object constrains nothing."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    return {name: spec if isinstance(spec, dict) else {} for name, spec in properties.items()}


def _required(schema: JSONObject) -> list[str]:
    names = schema.get("required")
    return [str(name) for name in names] if isinstance(names, list) else []


def schema_hint(schema: JSONObject, style: str = "fenced",
                result_file: str = RESULT_FILE) -> str:
    """What the prompt asks the answer to end with, in the ``style`` of
    :data:`ANSWER_STYLES`."""
    fields = ", ".join(
        f'"{name}" ({spec.get("type", "value")})'
        for name, spec in _properties(schema).items()
    )
    if style == "line":
        return ("\n\nWhen you are done, end your answer with one last line that holds only a "
                f"JSON object, not in a code block, with these fields: {fields}.")
    if style == "file":
        return ("\n\nWhen you are done, write one JSON object with these fields to the file "
                f"{result_file}: {fields}.")
    return (
        "\n\nWhen you are done, end your answer with one JSON object in a ```json block "
        f"with these fields: {fields}."
    )


def parse_options(args: list[str]) -> tuple[str, list[str]] | None:
    """(answer style, CLI argv) of the wrapper's arguments; None if they are not
    ``[--answer STYLE] -- CLI [ARG…]`` (a CLI without ``--`` is taken as it is)."""
    style = "fenced"
    rest = list(args)
    while rest and rest[0] != "--":
        option = rest.pop(0)
        if option.startswith("--answer="):
            style = option.split("=", 1)[1]
        elif option == "--answer" and rest:
            style = rest.pop(0)
        elif not option.startswith("-"):
            return style, [option, *rest]  # no "--": the CLI itself
        else:
            return None
        if style not in ANSWER_STYLES:
            return None
    return style, rest[1:] if rest[:1] == ["--"] else rest


def with_hint(argv: list[str], prompt: str, hint: str) -> list[str]:
    """``argv`` with ``hint`` after the prompt in the first argument that holds it."""
    if not prompt:
        return argv
    for i, arg in enumerate(argv):
        if prompt in arg:
            return [*argv[:i], arg.replace(prompt, prompt + hint, 1), *argv[i + 1 :]]
    return argv


def json_objects(text: str) -> list[JSONObject]:
    """The top-level JSON objects in ``text``, in order (inside fences or not)."""
    decoder = json.JSONDecoder()
    found: list[JSONObject] = []
    i = text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
        i = text.find("{", end)
    return found


def typed_result(answer: str, schema: JSONObject) -> JSONObject:
    """The answer as ``{"output", "handoff"}`` for ``schema``; :class:`NoResult` if it
    does not fit."""
    text = answer.strip()
    if not text:
        raise NoResult("the agent printed no answer")
    handoff = text[-HANDOFF_LIMIT:]
    required = _required(schema)
    for candidate in reversed(json_objects(text)):
        if isinstance(candidate.get("output"), dict) and "output" not in required:
            return {"output": candidate["output"],
                    "handoff": str(candidate.get("handoff") or handoff)}
        if required and all(name in candidate for name in required):
            return {"output": candidate, "handoff": handoff}
    properties = _properties(schema)
    if len(required) == 1 and properties.get(required[0], {}).get("type") == "string":
        limit = properties[required[0]].get("maxLength")
        value = text if not isinstance(limit, int) or len(text) <= limit else (
            text[: limit - 1] + "…")
        return {"output": {required[0]: value}, "handoff": handoff}
    raise NoResult(
        f"the answer has no JSON object with the fields {', '.join(required) or '(none)'}; "
        "only a schema of one required text field can take plain prose"
    )


def main(args: list[str]) -> int:
    parsed = parse_options(args)
    if parsed is None or not parsed[1]:
        print(USAGE, file=sys.stderr)
        return 2
    style, args = parsed
    schema: JSONObject = json.loads(os.environ.get("CAIRN_OUTPUT_SCHEMA") or "{}")
    result_file = os.environ.get("CAIRN_RESULT_FILE") or RESULT_FILE
    argv = with_hint(args, os.environ.get("CAIRN_PROMPT", ""),
                     schema_hint(schema, style, result_file))
    try:  # until the CLI exits, not until what it left behind closes stdout
        returncode, stdout = run_to_exit(argv, stdin=subprocess.DEVNULL, keep=ANSWER_LIMIT)
    except OSError as exc:
        print(f"agent-result: cannot run {args[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    answer = stdout.data.decode(errors="replace")
    sys.stderr.write(answer)  # the CLI's own output belongs in the unit's log
    if returncode != 0:
        print(f"agent-result: {args[0]} exited {returncode}", file=sys.stderr)
        return returncode if returncode > 0 else 1
    if style == "file" and os.path.lexists(result_file):
        return 0  # the worker reads and judges the file itself, never through a link
    try:
        result = typed_result(answer, schema)
    except NoResult as exc:
        print(f"agent-result: {args[0]}: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(result))
    return 0
