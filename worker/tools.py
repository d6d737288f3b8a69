"""The tools of the ``llm`` profile, and the check of ``finish_work`` output.

Every tool works inside the workspace (paths are relative to it and may not leave it),
returns text for the model, and reports a mistake as text instead of raising, so the
model can correct itself. Output is capped at the profile's ``tool_output_limit``.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cairn.proc import run

if TYPE_CHECKING:
    from cairn.protocol.jsonvalue import JSONObject, JSONValue

SEARCH_MATCH_LIMIT = 200
SEARCH_FILE_LIMIT = 2 << 20
READ_LINE_LIMIT = 2000
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv"}
# What an agent's commands inherit from the unit: the home and temp directories, and in
# allowlist mode the run's proxy (the only way out of the agent's namespace).
PASSED_ENV = ("HOME", "TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
              "NO_PROXY", "no_proxy")


class ToolError(Exception):
    """A tool call the model got wrong; the message goes back to it."""


def _schema(properties: JSONObject, required: list[JSONValue]) -> JSONObject:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def _str(description: str) -> JSONObject:
    return {"type": "string", "description": description}


TOOL_SPECS: list[JSONObject] = [
    {"name": "bash", "description": "Run a bash command in /workspace and return its exit "
     "status and output. No network. Long output is cut.",
     "parameters": _schema({"command": _str("the command line"),
                            "timeout": {"type": "number", "description": "seconds"}},
                           ["command"])},
    {"name": "read", "description": "Read a text file with line numbers.",
     "parameters": _schema({"path": _str("path relative to /workspace"),
                            "offset": {"type": "integer", "description": "first line, from 1"},
                            "limit": {"type": "integer", "description": "number of lines"}},
                           ["path"])},
    {"name": "write", "description": "Create or replace a file with the given content.",
     "parameters": _schema({"path": _str("path relative to /workspace"),
                            "content": _str("the whole new content")}, ["path", "content"])},
    {"name": "edit", "description": "Replace one exact occurrence of old_text with new_text "
     "in a file. old_text must occur exactly once.",
     "parameters": _schema({"path": _str("path relative to /workspace"),
                            "old_text": _str("text to replace, exactly as in the file"),
                            "new_text": _str("replacement")},
                           ["path", "old_text", "new_text"])},
    {"name": "search", "description": "Search files for a regular expression; returns "
     "path:line: text for each match.",
     "parameters": _schema({"pattern": _str("Python regular expression"),
                            "path": _str("directory or file relative to /workspace")},
                           ["pattern"])},
    {"name": "notes", "description": "Record a short progress note the people running "
     "this workflow can see.",
     "parameters": _schema({"text": _str("the note")}, ["text"])},
]


class Toolbox:
    """Run tool calls against one workspace."""

    def __init__(
        self,
        workspace: Path,
        *,
        note: Callable[[str], None],
        bash_timeout: float,
        output_limit: int,
    ) -> None:
        self.workspace = workspace.resolve()
        self.note = note
        self.bash_timeout = bash_timeout
        self.output_limit = output_limit

    def call(self, name: str, args: Mapping[str, JSONValue]) -> str:
        """Run one tool; a mistake comes back as ``error: ...`` text."""
        handler = {
            "bash": self.bash, "read": self.read, "write": self.write, "edit": self.edit,
            "search": self.search, "notes": self.notes,
        }.get(name)
        if handler is None:
            return f"error: no tool named {name!r}"
        try:
            return self._cap(handler(args))
        except ToolError as exc:
            return f"error: {exc}"
        except OSError as exc:
            return f"error: {exc.strerror or exc}"

    def _cap(self, text: str) -> str:
        if len(text) <= self.output_limit:
            return text
        half = self.output_limit // 2
        cut = len(text) - 2 * half
        return f"{text[:half]}\n[... {cut} characters cut ...]\n{text[-half:]}"

    def _path(self, args: Mapping[str, JSONValue], key: str = "path",
              default: str | None = None) -> Path:
        raw = args.get(key, default)
        if not isinstance(raw, str) or not raw:
            raise ToolError(f"{key} must be a non-empty string")
        rel = raw.removeprefix("/workspace/") if raw != "/workspace" else "."
        if os.path.isabs(rel):
            raise ToolError(f"{raw} is outside /workspace; use a relative path")
        path = Path(os.path.realpath(self.workspace / rel))
        if path != self.workspace and self.workspace not in path.parents:
            raise ToolError(f"{raw} is outside /workspace")
        return path

    @staticmethod
    def _text(args: Mapping[str, JSONValue], key: str) -> str:
        value = args.get(key)
        if not isinstance(value, str):
            raise ToolError(f"{key} must be a string")
        return value

    def bash(self, args: Mapping[str, JSONValue]) -> str:
        command = self._text(args, "command")
        timeout = args.get("timeout", self.bash_timeout)
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ToolError("timeout must be a positive number of seconds")
        timeout = min(float(timeout), self.bash_timeout)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        try:
            proc = run(["/bin/bash", "-c", command], env=env, cwd=self.workspace,
                       check=False, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            out = _decode(exc.stdout) + _decode(exc.stderr)
            return f"timed out after {timeout:g}s\n{out}"
        out = _decode(proc.stdout) + _decode(proc.stderr)
        return f"exit status {proc.returncode}\n{out}"

    def read(self, args: Mapping[str, JSONValue]) -> str:
        path = self._path(args)
        offset, limit = args.get("offset", 1), args.get("limit", READ_LINE_LIMIT)
        if not isinstance(offset, int) or offset < 1 or not isinstance(limit, int) or limit < 1:
            raise ToolError("offset and limit must be positive whole numbers")
        if path.is_dir():
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
            return "\n".join(names) or "(empty directory)"
        lines = path.read_text(errors="replace").splitlines()
        chosen = lines[offset - 1 : offset - 1 + limit]
        numbered = [f"{n:6d}\t{line}" for n, line in enumerate(chosen, start=offset)]
        more = len(lines) - (offset - 1 + len(chosen))
        tail = [f"({more} more lines)"] if more > 0 else []
        return "\n".join(numbered + tail) or "(empty file)"

    def write(self, args: Mapping[str, JSONValue]) -> str:
        path = self._path(args)
        content = self._text(args, "content")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return f"wrote {len(content.encode())} bytes to {path.relative_to(self.workspace)}"

    def edit(self, args: Mapping[str, JSONValue]) -> str:
        path = self._path(args)
        old, new = self._text(args, "old_text"), self._text(args, "new_text")
        if not old:
            raise ToolError("old_text is empty; use write to create a file")
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise ToolError(
                f"old_text occurs {count} times in {args['path']}; it must occur exactly once"
                + ("" if count else " (read the file and copy the text exactly)")
            )
        path.write_text(text.replace(old, new, 1))
        return f"edited {path.relative_to(self.workspace)}"

    def search(self, args: Mapping[str, JSONValue]) -> str:
        try:
            pattern = re.compile(self._text(args, "pattern"))
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from exc
        root = self._path(args, default=".")
        files = [root] if root.is_file() else _walk(root)
        hits: list[str] = []
        for file in files:
            try:
                if file.stat().st_size > SEARCH_FILE_LIMIT:
                    continue
                data = file.read_bytes()
            except OSError:
                continue
            if b"\0" in data[:8192]:
                continue
            for n, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
                if pattern.search(line):
                    hits.append(f"{file.relative_to(self.workspace)}:{n}: {line}")
                    if len(hits) >= SEARCH_MATCH_LIMIT:
                        hits.append(f"(stopped at {SEARCH_MATCH_LIMIT} matches)")
                        return "\n".join(hits)
        return "\n".join(hits) or "no matches"

    def notes(self, args: Mapping[str, JSONValue]) -> str:
        text = self._text(args, "text").strip()
        if not text:
            raise ToolError("text is empty")
        self.note(text[:2000])
        return "noted"


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        found.extend(Path(dirpath) / f for f in sorted(filenames))
    return found


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


# --- the finish_work output check -----------------------------------------------------

def schema_error(schema: JSONObject, value: JSONValue) -> str | None:
    """The first way ``value`` breaks ``schema`` (a pydantic model's JSON schema), or None.

    Covers what workflow models can express: objects with required and forbidden extra
    properties, strings with lengths and patterns, numbers with bounds, lists, string-keyed
    dicts, optionals, literals and nested models, as strictly as the model in strict mode
    (no "yes" for ``true``). The coordinator validates again with the model itself; this
    check only lets the agent correct its output before it finishes.
    """
    return _check(schema, value, _subschema(schema.get("$defs")), "output")


def _subschema(value: JSONValue) -> JSONObject:
    """A part of the schema; one that is not an object constrains nothing."""
    return value if isinstance(value, dict) else {}


def _bound(schema: JSONObject, key: str) -> int | float | None:
    bound = schema.get(key)
    return bound if isinstance(bound, int | float) else None


def _check(schema: JSONObject, value: JSONValue, defs: JSONObject,
           where: str) -> str | None:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _check(_subschema(defs[ref.rsplit("/", 1)[-1]]), value, defs, where)
    any_of = schema.get("anyOf")
    if isinstance(any_of, list):
        errors = [_check(_subschema(s), value, defs, where) for s in any_of]
        return None if None in errors else next(e for e in errors if e)
    if "const" in schema and value != schema["const"]:
        return f"{where}: must be {schema['const']!r}"
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return f"{where}: must be one of {', '.join(repr(v) for v in enum)}"
    kind = schema.get("type")
    checker = _TYPE_CHECKS.get(kind) if isinstance(kind, str) else None
    return checker(schema, value, defs, where) if checker else None


def _check_object(schema: JSONObject, value: JSONValue, defs: JSONObject,
                  where: str) -> str | None:
    if not isinstance(value, dict):
        return f"{where}: must be an object"
    properties = _subschema(schema.get("properties"))
    required = schema.get("required")
    for name in required if isinstance(required, list) else []:
        if name not in value:
            return f"{where}.{name}: field required"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            error = _check(_subschema(properties[name]), item, defs, f"{where}.{name}")
        elif extra is False:
            error = f"{where}.{name}: extra field not permitted"
        elif isinstance(extra, dict):
            error = _check(extra, item, defs, f"{where}.{name}")
        else:
            error = None
        if error:
            return error
    return None


def _check_string(schema: JSONObject, value: JSONValue, defs: JSONObject,
                  where: str) -> str | None:
    if not isinstance(value, str):
        return f"{where}: must be a string"
    least, most = _bound(schema, "minLength"), _bound(schema, "maxLength")
    pattern = schema.get("pattern")
    if least is not None and len(value) < least:
        return f"{where}: must have at least {least} characters"
    if most is not None and len(value) > most:
        return f"{where}: must have at most {most} characters"
    if isinstance(pattern, str) and not re.search(pattern, value):
        return f"{where}: must match {pattern}"
    return None


def _check_number(schema: JSONObject, value: JSONValue, defs: JSONObject,
                  where: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{where}: must be a number"
    if schema.get("type") == "integer" and not (isinstance(value, int) or value.is_integer()):
        return f"{where}: must be a whole number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: must be finite"
    number = float(value)
    minimum, maximum = _bound(schema, "minimum"), _bound(schema, "maximum")
    above, below = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    if minimum is not None and not number >= minimum:
        return f"{where}: must be >= {minimum}"
    if maximum is not None and not number <= maximum:
        return f"{where}: must be <= {maximum}"
    if above is not None and not number > above:
        return f"{where}: must be > {above}"
    if below is not None and not number < below:
        return f"{where}: must be < {below}"
    step = _bound(schema, "multipleOf")
    if step and not math.isclose(value / step, round(value / step), abs_tol=1e-9):
        return f"{where}: must be a multiple of {step}"
    return None


def _check_array(schema: JSONObject, value: JSONValue, defs: JSONObject,
                 where: str) -> str | None:
    if not isinstance(value, list):
        return f"{where}: must be a list"
    least, most = _bound(schema, "minItems"), _bound(schema, "maxItems")
    if least is not None and len(value) < least:
        return f"{where}: must have at least {least} items"
    if most is not None and len(value) > most:
        return f"{where}: must have at most {most} items"
    items = schema.get("items")
    for n, item in enumerate(value):
        error = _check(items, item, defs, f"{where}.{n}") if isinstance(items, dict) else None
        if error:
            return error
    return None


def _check_bool(schema: JSONObject, value: JSONValue, defs: JSONObject,
                where: str) -> str | None:
    return None if isinstance(value, bool) else f"{where}: must be true or false"


def _check_null(schema: JSONObject, value: JSONValue, defs: JSONObject,
                where: str) -> str | None:
    return None if value is None else f"{where}: must be null"


_TYPE_CHECKS: dict[str, Callable[[JSONObject, JSONValue, JSONObject, str], str | None]] = {
    "object": _check_object,
    "string": _check_string,
    "integer": _check_number,
    "number": _check_number,
    "array": _check_array,
    "boolean": _check_bool,
    "null": _check_null,
}
