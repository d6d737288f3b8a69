"""A command profile's CLI (issue 29): its argv's placeholders (the prompt, the relay's
URL, the answer's schema as a file), and when it exits non-zero it says why, and costs
one attempt when another would only repeat it: the worker passes the CLI's stderr on to the
journal and keeps its last lines in ``command-failed.json``; the coordinator reads that
file as the agent's words (bounded, typed, escaped) and fails a usage or configuration
error at once, with the CLI's own message."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_result_bounds import command_env, instruction
from test_untrusted import OWNER, agent_op, coordinator, desc, outputs_of, owned

from cairn.coordinator.base import CommandFailed, OperationError
from cairn.errors import CairnError
from cairn.protocol.agent import (
    COMMAND_FAILED_FILE,
    COMMAND_FAILED_LIMIT,
    DETERMINISTIC_EXIT_STATUSES,
    STDERR_LINES,
    CommandFailure,
)
from cairn.protocol.launch import ProfileSpec
from cairn.worker import agentproc, profiles

__all__ = ["command_env", "coordinator", "desc"]  # fixtures of the modules above


def test_stderr_goes_on_to_the_journal_and_its_tail_is_kept(
    capfd: pytest.CaptureFixture[str],
) -> None:
    errors = agentproc.Tail(COMMAND_FAILED_LIMIT)
    script = "echo progress >&2; echo 'error: unexpected argument --full-auto' >&2; exit 2"
    status, _ = agentproc.run_to_exit(["/bin/sh", "-c", script], stderr=errors)
    assert status == 2
    assert errors.data == b"progress\nerror: unexpected argument --full-auto\n"
    assert capfd.readouterr().err == "progress\nerror: unexpected argument --full-auto\n"


def test_a_flood_on_stderr_is_passed_on_and_kept_bounded(
    capfd: pytest.CaptureFixture[str],
) -> None:
    errors = agentproc.Tail(COMMAND_FAILED_LIMIT)
    code = "import sys\nfor _ in range(8): sys.stderr.write('e' * (1 << 20))\nsys.exit(1)"
    status, _ = agentproc.run_to_exit([sys.executable, "-c", code], stderr=errors)
    assert status == 1
    assert errors.total == 8 << 20 and len(errors.data) == COMMAND_FAILED_LIMIT
    assert len(capfd.readouterr().err) == 8 << 20


def test_a_child_holding_stderr_does_not_hold_the_worker(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the child blocks opening it, stderr inherited, until the test ends
    started = time.monotonic()
    try:
        status, _ = agentproc.run_to_exit(["/bin/sh", "-c", f"cat {gate} & exit 3"],
                                          stderr=agentproc.Tail(64))
        assert time.monotonic() - started < 5
    finally:
        with open(gate, "w"):  # lets the child end
            pass
    assert status == 3


def test_the_worker_records_the_status_and_the_last_lines(command_env: Path) -> None:
    lines = "; ".join(f"echo line {i} >&2" for i in range(9))
    with pytest.raises(CairnError) as caught:
        profiles.run_command(["/bin/sh", "-c", f"{lines}; echo >&2; exit 78"], instruction())
    assert str(caught.value) == "agent command /bin/sh exited 78: line 8"
    written = json.loads((command_env / "outputs" / COMMAND_FAILED_FILE).read_text())
    assert written == {"exit_status": 78,
                       "stderr": [f"line {i}" for i in range(9 - STDERR_LINES, 9)]}


def test_a_signal_is_reported_as_a_shell_would_and_long_lines_fit_the_file() -> None:
    assert profiles.command_failure(-9, b"").describe() == "exited 137"
    failure = profiles.command_failure(1, ("\u2603" * 1000 + "\n").encode() * 9)
    assert len(failure.model_dump_json().encode()) <= COMMAND_FAILED_LIMIT
    assert failure.stderr and all(len(line) == 300 for line in failure.stderr)


@pytest.mark.parametrize(("status", "deterministic"),
                         [(2, True), (64, True), (78, True), (126, True), (127, True),
                          (1, False), (75, False), (137, False)])
def test_which_statuses_another_attempt_would_repeat(status: int, deterministic: bool) -> None:
    assert CommandFailure(exit_status=status).deterministic is deterministic


def test_the_coordinator_reads_the_failure_as_untrusted(coordinator: Any) -> None:
    op = agent_op(coordinator)
    out = outputs_of(coordinator, op)
    assert coordinator.read_command_failure(op) is None
    path = out / COMMAND_FAILED_FILE
    path.write_text(json.dumps({"exit_status": 2, "stderr": ["usage: \x1b[2Jx"]}))
    owned(path, OWNER)
    failure = coordinator.read_command_failure(op)
    assert failure == CommandFailure(exit_status=2, stderr=["usage: \x1b[2Jx"])
    for hostile in (b'{"exit_status": "2"}', b"[" * 5000, b'{"exit_status": 2, "x": 1}'):
        path.write_bytes(hostile)
        owned(path, OWNER)
        assert coordinator.read_command_failure(op) is None, hostile
    path.unlink()
    os.mkfifo(path)
    owned(path, OWNER)
    assert coordinator.read_command_failure(op) is None  # not waited for
    path.unlink()
    path.symlink_to("/etc/passwd")
    assert coordinator.read_command_failure(op) is None


def test_a_usage_error_fails_the_operation_once_with_the_clis_message(
    coordinator: Any,
) -> None:
    op = agent_op(coordinator)
    ended = "exited 2: error: unexpected argument '--full-auto' found"
    with pytest.raises(CommandFailed) as caught:
        coordinator.fail_deterministic(op, ended)
    assert isinstance(caught.value, OperationError)  # the workflow sees OperationFailed
    assert caught.value.message == f"agent root-1 agent command {ended}"
    assert (caught.value.hint or "").startswith("not retried: another attempt would exit")
    row = coordinator.journal.get_op_by_id(op.run_id, op.op_id)
    assert (row.state, row.error, row.attempt) == ("failed", f"agent command {ended}", 1)


# --- what a command profile's argv may hold -----------------------------------------


def test_placeholders_are_filled_in_one_pass_and_other_braces_stay(
    command_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiles, "STATE", command_env)
    argv = ["cli", "-c", "openai_base_url={model_url}", "--schema", "{output_schema_file}",
            '{"literal": 1}', "{prompt}"]
    ask = instruction().model_copy(update={"prompt": "say {model_url} back"})
    filled = profiles.filled_argv(argv, ask, "http://127.0.0.1:4242/v1")
    assert filled == ["cli", "-c", "openai_base_url=http://127.0.0.1:4242/v1", "--schema",
                      str(command_env / "output-schema.json"), '{"literal": 1}',
                      "say {model_url} back"]
    written = json.loads((command_env / "output-schema.json").read_text())
    assert written == ask.output_schema


def test_a_profile_that_uses_the_relay_url_must_name_a_provider() -> None:
    with pytest.raises(ValueError, match="names no provider"):
        ProfileSpec(name="codex", kind="command", argv=["codex", "{model_url}"])
    with_provider = ProfileSpec(name="codex", kind="command", argv=["codex", "{model_url}"],
                                provider="fake")
    assert with_provider.argv[1] == "{model_url}"


# --- what the documents say of it -----------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"


def statuses_in(text: str) -> set[int]:
    """The exit statuses a passage lists: numbers, and ranges such as ``64–66``."""
    found: set[int] = set()
    for low, high in re.findall(r"\b(\d+)(?:–(\d+))?\b", text):
        found |= set(range(int(low), int(high or low) + 1))
    return found


@pytest.mark.parametrize(("doc", "start", "end"), [
    ("agents.md", "another attempt would only repeat", "fails"),
    ("troubleshooting.md", "another attempt would only repeat", "`cairn show"),
    ("architecture.md", "with a status another attempt would repeat", "`network"),
])
def test_the_documents_list_the_statuses_the_code_does_not_retry(
    doc: str, start: str, end: str
) -> None:
    text = " ".join((DOCS / doc).read_text().split())
    passage = text[text.index(start):]
    passage = passage[:passage.index(end)]
    assert statuses_in(passage) == DETERMINISTIC_EXIT_STATUSES, passage


def test_the_documents_say_how_many_stderr_lines_are_kept() -> None:
    for doc in ("agents.md", "troubleshooting.md"):
        text = " ".join((DOCS / doc).read_text().split())
        assert f"last {STDERR_LINES} " in text, doc
