"""Agent profiles that run inside the unit: ``scripted`` (deterministic), ``command`` (a
host-configured argv, pointed at the model relay) and ``llm`` (:mod:`cairn.worker.llm`).

The worker starts from the capsule without bytecode, so what only one profile uses (the
``llm`` agent's HTTP client and tools, the relay shim's threads) is imported by that
profile when it runs, not by every agent at start."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cairn import paths, untrusted
from cairn.errors import CairnError
from cairn.fsutil import write_atomic
from cairn.pathrules import is_plain_relative
from cairn.protocol.agent import (
    COMMAND_FAILED_FILE,
    COMMAND_FAILED_LIMIT,
    STDERR_LINES,
    AgentInstruction,
    CommandFailure,
)
from cairn.protocol.launch import (
    HOME,
    MODEL,
    MODEL_API_ENV,
    MODEL_ENV,
    MODEL_URL,
    OUTPUT_SCHEMA_FILE,
    PLACEHOLDERS,
    PROFILE_FILES_DIR,
    PROMPT,
    ScriptStep,
)
from cairn.resultjson import RESULT_LIMIT, ResultInvalid, fingerprint_stream, parse
from cairn.worker.agentproc import Tail, run_to_exit
from cairn.worker.channel import MODEL_SOCKET, AgentChannel
from cairn.worker.tools import PASSED_ENV

if TYPE_CHECKING:
    from cairn.protocol.jsonvalue import JSONObject, JSONValue

log = logging.getLogger(__name__)

WORKSPACE = Path(os.environ.get("CAIRN_WORKSPACE", "/workspace"))
OUTPUTS = Path(os.environ.get("CAIRN_OUTPUTS", "/outputs"))
STATE = Path(os.environ.get("CAIRN_STATE", "/state"))
PROFILE_FILES = Path(PROFILE_FILES_DIR)
# What agent CLIs read to find their API; the key is a placeholder the relay replaces.
RELAY_KEY = "cairn-relay"


def run_profile(instruction: AgentInstruction, channel: AgentChannel) -> tuple[JSONObject, str]:
    """Run the instruction's profile; return (output, handoff) for finish_work."""
    profile = instruction.profile
    if profile.kind == "scripted":
        for step in profile.steps:
            run_step(step, instruction)
            channel.note(f"{step.action} {step.path or ' '.join(step.argv)}".strip())
        written = read_result_file()  # a step may answer as a command agent would
        if written is not None:
            return typed(written)
        return _fill_object(profile.output, instruction), _fill_text(profile.handoff, instruction)
    if profile.kind == "llm":
        from cairn.worker.llm import run_llm

        return run_llm(instruction, channel, WORKSPACE)
    return run_command(profile.argv, instruction)


def _fill_text(text: str, instruction: AgentInstruction) -> str:
    return text.replace("{prompt}", instruction.prompt).replace("{title}", instruction.title)


def _fill(value: JSONValue, instruction: AgentInstruction) -> JSONValue:
    if isinstance(value, str):
        return _fill_text(value, instruction)
    if isinstance(value, list):
        return [_fill(v, instruction) for v in value]
    if isinstance(value, dict):
        return _fill_object(value, instruction)
    return value


def _fill_object(value: Mapping[str, JSONValue], instruction: AgentInstruction) -> JSONObject:
    return {k: _fill(v, instruction) for k, v in value.items()}


def run_step(step: ScriptStep, instruction: AgentInstruction) -> None:
    relative = _fill_text(step.path, instruction)
    if relative and not is_plain_relative(relative):
        raise CairnError(f"scripted path {relative!r} is not a plain path below the workspace")
    path = WORKSPACE / relative
    content = _fill_text(step.content, instruction)
    if step.action == "write":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    elif step.action == "append":
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(content)
    elif step.action == "delete":
        path.unlink()
    elif step.action == "mkdir":
        path.mkdir(parents=True, exist_ok=True)
    elif step.action == "symlink":
        path.symlink_to(step.target)
    elif step.action == "chmod":
        assert step.mode is not None
        os.chmod(path, step.mode)
    elif step.action == "sleep":
        time.sleep(step.seconds)
    elif step.action == "run":
        argv = [_fill_text(a, instruction) for a in step.argv]
        proc = subprocess.run(argv, cwd=WORKSPACE, check=False, timeout=600)
        if proc.returncode != 0:
            raise CairnError(f"scripted step {step.argv[0]} exited {proc.returncode}")


def run_command(argv: list[str], instruction: AgentInstruction) -> tuple[JSONObject, str]:
    """Run a host-configured agent CLI until it exits; its result is /outputs/result.json
    or its last stdout line (JSON with ``output`` and optional ``handoff``), judged by
    :mod:`cairn.resultjson` (:class:`ResultInvalid`). The profile's files are copied into
    the agent's home first, and its ``env`` is set over Cairn's (placeholders filled)."""
    home = os.environ.get("HOME", str(STATE))
    try:
        seed_home(PROFILE_FILES, Path(home))
    except OSError as exc:
        raise CairnError(
            f"cannot copy profile {instruction.profile.name}'s files into the agent's home: "
            f"{exc.strerror}: {exc.filename}",
            hint=f"every file in {paths.profile_files_dir(instruction.profile.name)}/ must be "
            "readable by the run's owner",
        ) from None
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "CAIRN_PROMPT": instruction.prompt,
        # what the answer must fit, and where it may be written (read by the agent-result
        # wrapper, cairn.worker.agent_result)
        "CAIRN_OUTPUT_SCHEMA": json.dumps(instruction.output_schema),
        "CAIRN_RESULT_FILE": str(OUTPUTS / "result.json"),
        **{k: os.environ[k] for k in PASSED_ENV if k in os.environ and k != "HOME"},
    }
    shim = None
    if instruction.profile.provider:
        from cairn.worker.shim import TcpShim

        shim = TcpShim(os.environ.get("CAIRN_MODEL_SOCKET", MODEL_SOCKET)).start()
    if shim is not None:
        env.update(relay_environment(shim.port, os.environ.get(MODEL_API_ENV, "openai")))
    values = placeholder_values(instruction, env.get("CAIRN_MODEL_URL", ""), home,
                                [*argv, *instruction.profile.env.values()])
    env.update({name: fill(text, values) for name, text in instruction.profile.env.items()})
    errors = Tail(COMMAND_FAILED_LIMIT)
    try:
        returncode, stdout = run_to_exit(
            [fill(arg, values) for arg in argv], cwd=WORKSPACE, env=env, stderr=errors,
        )
    finally:
        if shim is not None:
            shim.close()
    if returncode != 0:
        failure = command_failure(returncode, errors.data)
        try:
            write_atomic(OUTPUTS / COMMAND_FAILED_FILE, failure.model_dump_json())
        except OSError as exc:  # the status still reaches the journal, below
            log.warning("cannot leave %s: %s", COMMAND_FAILED_FILE, exc)
        raise CairnError(f"agent command {argv[0]} {failure.describe()}")
    result = read_result_file()
    if result is None:
        line = stdout.last_line("the last line of stdout")
        if line is None:
            raise CairnError(f"agent command {argv[0]} printed no result")
        result = parse(line, "the last line of stdout")
    return typed(result)


def placeholder_values(
    instruction: AgentInstruction, model_url: str, home: str, texts: list[str]
) -> dict[str, str]:
    """What each of :data:`PLACEHOLDERS` stands for in this attempt. The answer's schema
    is written to the agent's state directory only when one of ``texts`` uses it."""
    schema = STATE / "output-schema.json"
    if any(OUTPUT_SCHEMA_FILE in text for text in texts):
        write_atomic(schema, json.dumps(instruction.output_schema, indent=2))
    values = {PROMPT: instruction.prompt, MODEL_URL: model_url,
              MODEL: os.environ.get(MODEL_ENV, ""), OUTPUT_SCHEMA_FILE: str(schema),
              HOME: home}
    assert set(values) == set(PLACEHOLDERS)
    return values


_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS))


def fill(text: str, values: dict[str, str]) -> str:
    """``text`` with its placeholders replaced in one pass (a prompt that holds
    "{model_url}" stays the prompt it is); any other text in braces stays as it is."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], text)


def seed_home(source: Path, home: Path) -> list[str]:
    """Copy the profile's files (root's read-only bind of /etc/cairn/profiles.d/NAME.d)
    into the agent's home, keeping what is already there; return the paths copied.

    Directories and regular files are copied with their permission bits (never set-ID);
    symbolic links as links; anything else is left out. Nothing is followed: the copy
    sees the tree the administrator wrote, not where its links point."""
    copied: list[str] = []
    if not source.is_dir() or source.is_symlink():
        return copied
    for top, dirs, files in os.walk(source):
        relative = Path(top).relative_to(source)
        target_dir = home / relative
        for name in sorted(dirs):
            here = Path(top) / name
            if here.is_symlink():
                files.append(name)  # copied below as the link it is, not walked
                continue
            (target_dir / name).mkdir(mode=os.lstat(here).st_mode & 0o777, exist_ok=True)
        dirs[:] = [d for d in dirs if not (Path(top) / d).is_symlink()]
        for name in sorted(files):
            here, there = Path(top) / name, target_dir / name
            if os.path.lexists(there):
                continue
            st = os.lstat(here)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(here), there)
            elif stat.S_ISREG(st.st_mode):
                _copy_file(here, there, st.st_mode & 0o777)
            else:
                continue
            copied.append(str(relative / name))
    return copied


def _copy_file(source: Path, target: Path, mode: int) -> None:
    """Copy a regular file, neither end reached through a link (the target is new)."""
    reading = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        writing = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, mode)
        with open(reading, "rb", closefd=False) as src, open(writing, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    finally:
        os.close(reading)


def command_failure(returncode: int, stderr: bytes) -> CommandFailure:
    """The CLI's exit status and its last :data:`STDERR_LINES` non-blank stderr lines (as
    text, each cut to 300 characters), kept under :data:`COMMAND_FAILED_LIMIT` bytes as
    JSON. A status from a signal is 128 + its number, as a shell reports it."""
    status = 128 - returncode if returncode < 0 else returncode
    lines = [line.strip()[:300] for line in stderr.decode("utf-8", "replace").splitlines()]
    kept = [line for line in lines if line][-STDERR_LINES:]
    while kept and len(CommandFailure(exit_status=status, stderr=kept).model_dump_json()
                       .encode()) > COMMAND_FAILED_LIMIT:
        kept = kept[1:]
    return CommandFailure(exit_status=status, stderr=kept)


def read_result_file() -> JSONValue:
    """The JSON value of ``/outputs/result.json``, None if the agent wrote none. Its
    size is checked before a byte is read; :class:`ResultInvalid` if refused."""
    what = "/outputs/result.json"
    try:  # the agent's own file, yet a FIFO or a link there must not hang or mislead
        fd = untrusted.open_file(OUTPUTS, "result.json", owner=os.getuid(), limit=sys.maxsize)
    except untrusted.UntrustedFileMissing:
        return None
    except untrusted.UntrustedFileError as exc:
        raise ResultInvalid("file", f"{what}: {exc.reason}") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if size > RESULT_LIMIT:
            raise ResultInvalid(
                "size", f"{what} is {size} bytes; a result may have at most {RESULT_LIMIT}",
                sha256=fingerprint_stream(fh, size),
            )
        data = fh.read(RESULT_LIMIT + 1)
    value: JSONValue = parse(data, what)
    return value


def typed(result: JSONValue) -> tuple[JSONObject, str]:
    """(output, handoff) of a parsed result: ``{"output": {...}, "handoff": "..."}``, or
    the output object alone."""
    if not isinstance(result, dict):
        raise ResultInvalid("schema", "the result is not a JSON object")
    output = result.get("output", result)
    if not isinstance(output, dict):
        raise ResultInvalid("schema", "the result's output is not a JSON object")
    handoff = result.get("handoff", "")
    return output, handoff if isinstance(handoff, str) else json.dumps(handoff)


def relay_environment(port: int, api: str) -> dict[str, str]:
    """Variables that point the clients of the provider's API (``openai`` or
    ``anthropic``) at the relay's shim: a CLI that also speaks the other API finds no
    setting of it and keeps to the one the relay serves."""
    base = f"http://127.0.0.1:{port}"
    if api == "anthropic":
        family = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": RELAY_KEY}
    else:
        family = {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_BASE": f"{base}/v1",
                  "OPENAI_API_KEY": RELAY_KEY}
    return {**family, "CAIRN_MODEL_URL": f"{base}/v1"}


def flush_workspace(path: str = "/workspace") -> None:
    """Write the agent's changes out before it finishes, so the boundary's snapshot does
    not pay for flushing them (that cost grows with the tree; it belongs to the agent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syncfs(fd) != 0:  # only an optimisation: the snapshot flushes anyway
            log.warning("syncfs(%s): errno %d", path, ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        log.warning("syncfs(%s) unavailable: %s", path, exc)
    finally:
        os.close(fd)
