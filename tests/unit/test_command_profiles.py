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
from cairn.protocol.launch import MODEL_API_ENV, MODEL_ENV, ProfileSpec
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
    assert coordinator.agents.read_command_failure(op) is None
    path = out / COMMAND_FAILED_FILE
    path.write_text(json.dumps({"exit_status": 2, "stderr": ["usage: \x1b[2Jx"]}))
    owned(path, OWNER)
    failure = coordinator.agents.read_command_failure(op)
    assert failure == CommandFailure(exit_status=2, stderr=["usage: \x1b[2Jx"])
    for hostile in (b'{"exit_status": "2"}', b"[" * 5000, b'{"exit_status": 2, "x": 1}'):
        path.write_bytes(hostile)
        owned(path, OWNER)
        assert coordinator.agents.read_command_failure(op) is None, hostile
    path.unlink()
    os.mkfifo(path)
    owned(path, OWNER)
    assert coordinator.agents.read_command_failure(op) is None  # not waited for
    path.unlink()
    path.symlink_to("/etc/passwd")
    assert coordinator.agents.read_command_failure(op) is None


def test_a_usage_error_fails_the_operation_once_with_the_clis_message(
    coordinator: Any,
) -> None:
    op = agent_op(coordinator)
    ended = "exited 2: error: unexpected argument '--full-auto' found"
    with pytest.raises(CommandFailed) as caught:
        coordinator.agents.fail_deterministic(op, ended)
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
    monkeypatch.setenv(MODEL_ENV, "gpt-9")
    argv = ["cli", "-c", "openai_base_url={model_url}", "--schema", "{output_schema_file}",
            '{"literal": 1}', "{prompt}", "--model={model}", "{home}/.config"]
    ask = instruction().model_copy(update={"prompt": "say {model_url} back"})
    values = profiles.placeholder_values(ask, "http://127.0.0.1:4242/v1", "/state", argv)
    filled = [profiles.fill(arg, values) for arg in argv]
    assert filled == ["cli", "-c", "openai_base_url=http://127.0.0.1:4242/v1", "--schema",
                      str(command_env / "output-schema.json"), '{"literal": 1}',
                      "say {model_url} back", "--model=gpt-9", "/state/.config"]
    written = json.loads((command_env / "output-schema.json").read_text())
    assert written == ask.output_schema


def test_the_schema_file_is_written_only_when_used(
    command_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiles, "STATE", command_env)
    profiles.placeholder_values(instruction(), "", "/state", ["cli", "{prompt}"])
    assert not (command_env / "output-schema.json").exists()
    profiles.placeholder_values(instruction(), "", "/state", ["SCHEMA={output_schema_file}"])
    assert (command_env / "output-schema.json").exists()


ENV_PRINTER = ("import json, os, sys; print(json.dumps({'output': {'summary': json.dumps("
               "[os.environ.get(n) for n in sys.argv[1:]])}}))")


def test_a_profiles_env_is_set_over_cairns_with_its_placeholders_filled(
    command_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiles, "STATE", command_env)
    monkeypatch.setattr(profiles, "PROFILE_FILES", command_env / "none")
    monkeypatch.setenv(MODEL_ENV, "qwen-7b")
    monkeypatch.setenv("HOME", "/state")
    env = {"TOOL_MODEL": "{model}", "TOOL_TASK": "do: {prompt}", "LANG": "de_DE.UTF-8",
           "TOOL_CONFIG": "{home}/tool.json", "TOOL_BRACES": "{other}"}
    spec = ProfileSpec(name="tool", kind="command", provider="fake", env=env)
    ask = instruction().model_copy(update={"profile": spec, "prompt": "p {model}"})
    names = ["TOOL_MODEL", "TOOL_TASK", "LANG", "TOOL_CONFIG", "TOOL_BRACES", "HOME"]
    output: Any
    with relay_shim_stubbed(monkeypatch):
        output, _ = profiles.run_command([sys.executable, "-c", ENV_PRINTER, *names], ask)
    assert json.loads(output["summary"]) == [
        "qwen-7b", "do: p {model}", "de_DE.UTF-8", "/state/tool.json", "{other}", "/state"]


@pytest.mark.parametrize(("api", "family", "absent"), [
    ("openai", {"OPENAI_BASE_URL": "http://127.0.0.1:4242/v1",
                "OPENAI_API_BASE": "http://127.0.0.1:4242/v1", "OPENAI_API_KEY": "cairn-relay"},
     "ANTHROPIC_"),
    ("anthropic", {"ANTHROPIC_BASE_URL": "http://127.0.0.1:4242",
                   "ANTHROPIC_API_KEY": "cairn-relay"}, "OPENAI_"),
])
def test_only_the_providers_api_is_pointed_at_the_relay(
    api: str, family: dict[str, str], absent: str, command_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CLI that speaks both APIs finds only the one the relay serves for this profile
    (opencode picked Anthropic's when both keys were set)."""
    monkeypatch.setattr(profiles, "PROFILE_FILES", command_env / "none")
    monkeypatch.setenv(MODEL_API_ENV, api)
    spec = ProfileSpec(name="tool", kind="command", provider="fake")
    code = ("import json, os; print(json.dumps({'output': {'summary': json.dumps("
            "{k: v for k, v in os.environ.items() if k[:7] in ('OPENAI_', 'ANTHROP', "
            "'CAIRN_M')})}}))")
    output: Any
    with relay_shim_stubbed(monkeypatch):
        output, _ = profiles.run_command([sys.executable, "-c", code],
                                         instruction().model_copy(update={"profile": spec}))
    seen = json.loads(output["summary"])
    assert seen == {**family, "CAIRN_MODEL_URL": "http://127.0.0.1:4242/v1"}
    assert not any(k.startswith(absent) for k in seen)


@pytest.mark.parametrize(("name", "refusal"), [
    ("HOME", "HOME is set by Cairn"),
    ("TMPDIR", "TMPDIR is set by Cairn"),
    ("CAIRN_PROFILE_SHA256", "CAIRN_PROFILE_SHA256 is set by Cairn"),
    ("CAIRN_MODEL", "CAIRN_MODEL is set by Cairn"),
    ("1ST", "not a variable name"),
    ("A=B", "not a variable name"),
    ("", "not a variable name"),
    ("X" * 129, "not a variable name"),
])
def test_a_profile_may_not_set_what_cairn_sets_nor_a_name_that_is_no_name(
    name: str, refusal: str
) -> None:
    with pytest.raises(ValueError, match=refusal):
        ProfileSpec(name="tool", kind="command", env={name: "x"})
    with pytest.raises(ValueError, match="NUL"):
        ProfileSpec(name="tool", kind="command", env={"OK": "a\0b"})


def test_the_model_placeholder_needs_a_provider_in_argv_and_env() -> None:
    for fields in ({"argv": ["cli", "--model", "{model}"]}, {"env": {"M": "{model}"}},
                   {"env": {"U": "{model_url}"}}):
        with pytest.raises(ValueError, match="no provider is named"):
            ProfileSpec(name="tool", kind="command", **fields)
        ProfileSpec(name="tool", kind="command", provider="fake", **fields)


@pytest.mark.parametrize("glob", ["/etc/*", "../up", "a/../b", "", "a\0b"])
def test_settle_ignore_takes_only_globs_inside_the_project(glob: str) -> None:
    with pytest.raises(ValueError, match="is not a glob of paths inside the project"):
        ProfileSpec(name="aider", kind="command", settle_ignore=[glob])
    assert ProfileSpec(name="aider", kind="command",
                       settle_ignore=[".aider*", "**/__pycache__"]).settle_ignore


def test_a_run_ignores_what_any_of_its_profiles_tools_leave_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_config_errors import TWO_AGENTS

    from cairn.daemon.launch import resolve_profiles, settlement_policy
    from cairn.workflow.review import review_source

    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    profiles_d = tmp_path / "etc" / "cairn" / "profiles.d"
    profiles_d.mkdir(parents=True)
    (profiles_d / "claude.toml").write_text(
        'kind = "command"\nargv = ["/usr/bin/claude"]\nsettle_ignore = [".claude/**"]\n')
    (profiles_d / "codex.toml").write_text(
        'kind = "command"\nargv = ["/usr/bin/codex"]\n'
        'settle_ignore = ["**/__pycache__", ".claude/**"]\n')
    review = review_source(TWO_AGENTS, filename="two.py")
    policy = settlement_policy(review, resolve_profiles(review, {}))
    assert policy.ignore == ["**/__pycache__", ".claude/**"]
    assert policy.write_paths == ["**"]


class relay_shim_stubbed:  # noqa: N801 - a context manager used as a phrase
    """No relay socket in the unit tier: the shim's start and close do nothing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def __enter__(self) -> None:
        from cairn.worker import shim

        class Shim:
            port = 4242

            def __init__(self, path: str) -> None:
                pass

            def start(self) -> Shim:
                return self

            def close(self) -> None:
                pass

        self.monkeypatch.setattr(shim, "TcpShim", Shim)

    def __exit__(self, *exc: object) -> None:
        pass


# --- the profile's files, copied into the agent's home ------------------------------


def test_the_profiles_files_are_copied_into_the_home_as_they_are(tmp_path: Path) -> None:
    source, home = tmp_path / "tool.d", tmp_path / "home"
    (source / ".config" / "tool").mkdir(parents=True)
    (source / ".config" / "tool" / "config.json").write_text('{"provider": "relay"}')
    (source / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(source / "run.sh", 0o4755)  # set-user-ID: never copied as such
    (source / "link").symlink_to("/etc/shadow")  # a link stays a link, never followed
    (source / "dirlink").symlink_to(source / ".config")
    os.mkfifo(source / "fifo")  # neither read nor copied
    home.mkdir()
    (home / "run.sh").write_text("kept\n")  # what the home already holds stays
    copied = profiles.seed_home(source, home)
    assert sorted(copied) == [".config/tool/config.json", "dirlink", "link"]
    assert (home / ".config/tool/config.json").read_text() == '{"provider": "relay"}'
    assert (home / "run.sh").read_text() == "kept\n"
    assert os.readlink(home / "link") == "/etc/shadow"
    assert os.readlink(home / "dirlink") == str(source / ".config")
    assert not os.path.lexists(home / "fifo")
    (home / "run.sh").unlink()
    assert profiles.seed_home(source, home) == ["run.sh"]
    assert os.stat(home / "run.sh").st_mode & 0o7777 == 0o755


def test_no_profile_files_is_no_copy(tmp_path: Path) -> None:
    assert profiles.seed_home(tmp_path / "missing", tmp_path) == []
    (tmp_path / "linked.d").symlink_to(tmp_path)
    assert profiles.seed_home(tmp_path / "linked.d", tmp_path / "home") == []


def test_profile_files_the_owner_cannot_read_fail_the_attempt_with_the_fix(
    command_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = command_env / "tool.d"
    source.mkdir()
    (source / "secret.json").write_text("{}")
    monkeypatch.setattr(profiles, "PROFILE_FILES", source)
    monkeypatch.setenv("HOME", str(command_env / "home"))
    (command_env / "home").mkdir()
    real_open = os.open

    def unreadable(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("secret.json") and not flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", unreadable)
    spec = ProfileSpec(name="my:tool", kind="command")
    with pytest.raises(CairnError, match=r"cannot copy profile my:tool's files .*Permission "
                       r"denied.*profiles.d/my-tool.d/ must be readable"):
        profiles.run_command(["/bin/true"], instruction().model_copy(update={"profile": spec}))


def test_a_profile_that_uses_the_relay_url_must_name_a_provider() -> None:
    with pytest.raises(ValueError, match="no provider is named"):
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
