"""``cairn-worker agent-result -- CLI ARGS…``: run an agent CLI that answers in prose
(``claude -p``, ``codex exec``, ``aider --message``, ``opencode run``) and turn its final
answer into the typed result a ``command`` profile must end with,
``{"output": {...}, "handoff": "..."}``. It ships in the sealed release, so a profile in
``/etc/cairn/profiles.d`` uses it as::

    argv = ["/usr/bin/python3", "-I", "-B", "/runtime/capsule/cairn-worker", "agent-result",
            "--", "/usr/local/bin/claude", "-p", "{prompt}"]

It adds to the prompt argument (the one holding ``$CAIRN_PROMPT``) the fields the answer
must end with, as one JSON object (from ``$CAIRN_OUTPUT_SCHEMA``, set by the worker); runs
the CLI with no stdin until it exits, its output copied to the unit's log; and reads the
answer (its last MiB):

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
from typing import Any

from cairn.worker.agentproc import run_to_exit

HANDOFF_LIMIT = 8000
ANSWER_LIMIT = 1 << 20  # the answer's last bytes kept; its JSON object is at the end
USAGE = "usage: cairn-worker agent-result -- CLI [ARG…]"


class NoResult(Exception):
    """The CLI's answer cannot be made into the typed result."""


def schema_hint(schema: dict[str, Any]) -> str:
    """What the prompt asks the answer to end with."""
    fields = ", ".join(
        f'"{name}" ({spec.get("type", "value")})'
        for name, spec in schema.get("properties", {}).items()
    )
    return (
        "\n\nWhen you are done, end your answer with one JSON object in a ```json block "
        f"with these fields: {fields}."
    )


def with_hint(argv: list[str], prompt: str, hint: str) -> list[str]:
    """``argv`` with ``hint`` after the prompt in the first argument that holds it."""
    if not prompt:
        return argv
    for i, arg in enumerate(argv):
        if prompt in arg:
            return [*argv[:i], arg.replace(prompt, prompt + hint, 1), *argv[i + 1 :]]
    return argv


def json_objects(text: str) -> list[dict[str, Any]]:
    """The top-level JSON objects in ``text``, in order (inside fences or not)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
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


def typed_result(answer: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The answer as ``{"output", "handoff"}`` for ``schema``; :class:`NoResult` if it
    does not fit."""
    text = answer.strip()
    if not text:
        raise NoResult("the agent printed no answer")
    handoff = text[-HANDOFF_LIMIT:]
    required = [str(name) for name in schema.get("required", [])]
    for candidate in reversed(json_objects(text)):
        if isinstance(candidate.get("output"), dict) and "output" not in required:
            return {"output": candidate["output"],
                    "handoff": str(candidate.get("handoff") or handoff)}
        if required and all(name in candidate for name in required):
            return {"output": candidate, "handoff": handoff}
    properties = schema.get("properties", {})
    if len(required) == 1 and properties.get(required[0], {}).get("type") == "string":
        limit = properties[required[0]].get("maxLength")
        value = text if limit is None or len(text) <= limit else text[: limit - 1] + "…"
        return {"output": {required[0]: value}, "handoff": handoff}
    raise NoResult(
        f"the answer has no JSON object with the fields {', '.join(required) or '(none)'}; "
        "only a schema of one required text field can take plain prose"
    )


def main(args: list[str]) -> int:
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    schema: dict[str, Any] = json.loads(os.environ.get("CAIRN_OUTPUT_SCHEMA") or "{}")
    argv = with_hint(args, os.environ.get("CAIRN_PROMPT", ""), schema_hint(schema))
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
    try:
        result = typed_result(answer, schema)
    except NoResult as exc:
        print(f"agent-result: {args[0]}: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(result))
    return 0
