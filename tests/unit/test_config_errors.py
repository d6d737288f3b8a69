"""Configuration errors say where and what: the file, the line (TOML syntax) or the field
(schema), what to do, and every problem of the files loaded together at once. cairnd
answers them with their own code, never as an internal error."""

from __future__ import annotations

import ast
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from cairn import paths
from cairn.config import ConfigError, Problems
from cairn.daemon import server
from cairn.daemon.launch import resolve_profiles
from cairn.journal.readwrite import Journal
from cairn.policy import PolicyError, load_policy
from cairn.protocol.daemon import LaunchRequest
from cairn.providers import load_providers
from cairn.schedules import host_config
from cairn.workflow.review import review_source

REPO = Path(__file__).resolve().parents[2]

TWO_AGENTS = '''"""Two agents on two host profiles."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Ask(Model):
    """What to do."""

    text: str = Field(min_length=1, max_length=100)


class Done(Model):
    """What was done."""

    summary: str = Field(min_length=1, max_length=100)


first = agent(profile="claude", access="read", network="none", output=Done)
second = agent(profile="codex", access="read", network="none", output=Done)


@workflow(description="Two agents.", input=Ask, output=Done)
async def run(flow: Any, args: Ask) -> Done:
    one = await flow.agent(first, prompt=args.text)
    two = await flow.agent(second, prompt=one.output.summary)
    done: Done = two.output
    return done
'''

# a string left open at the end of line 2: tomllib says where
SYNTAX_ERROR = 'kind = "command"\nprovider = "anthropic\nargv = ["/bin/true", "{prompt}"]\n'
# valid TOML, but max_steps must be a number and argvv is no field
SCHEMA_ERROR = (
    'kind = "command"\nargv = ["/bin/true", "{prompt}"]\nmax_steps = "many"\nargvv = []\n'
)


@pytest.fixture(autouse=True)
def etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "etc" / "cairn" / "profiles.d").mkdir(parents=True)
    return tmp_path / "etc" / "cairn"


def _bad_profiles(etc: Path) -> tuple[Path, Path]:
    claude, codex = etc / "profiles.d" / "claude.toml", etc / "profiles.d" / "codex.toml"
    claude.write_text(SYNTAX_ERROR)
    codex.write_text(SCHEMA_ERROR)
    return claude, codex


# --- one file ---------------------------------------------------------------------------


def test_a_toml_syntax_error_names_the_file_line_and_column(etc: Path) -> None:
    file = etc / "providers.toml"
    file.write_text('default = "local"\n[providers.local]\nbase_url = http://x\n')
    with pytest.raises(ConfigError) as caught:
        load_providers()
    error = caught.value
    assert error.code == "config"
    assert error.message.startswith(f"{file}: line 3, column 12: not valid TOML: ")
    assert "\n" not in error.message
    assert error.hint is not None and "TOML syntax" in error.hint


def test_a_schema_error_names_every_field(etc: Path) -> None:
    file = etc / "providers.toml"
    file.write_text(
        '[providers.a]\nbase_url = "ftp://h"\nmodel = "m"\n'
        '[providers.b]\nmodel = 7\nbase_url = "http://h/v1"\ntimeout = 3\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_providers()
    lines = caught.value.message.splitlines()
    assert lines[0] == "3 errors in 1 config file:"
    assert f"  {file}: providers.b.model: Input should be a valid string (got 7)" in lines
    assert f"  {file}: providers.b.timeout: unknown field: remove it or correct its name" in lines
    assert any(line.startswith(f"  {file}: providers.a.base_url: ") for line in lines)


def test_an_invalid_policy_default_is_refused_with_the_allowed_values(etc: Path) -> None:
    (etc / "policy.toml").write_text('default = "allw"\n')
    with pytest.raises(PolicyError) as caught:
        load_policy()
    error = caught.value
    assert error.code == "policy"
    assert error.message == (
        f"{etc / 'policy.toml'}: default: Input should be 'allow', 'deny' or "
        "'require_approval' (got 'allw')"
    )
    assert error.hint is not None and "allow, deny or require_approval" in error.hint


def test_every_error_of_a_policy_is_reported_and_types_are_not_converted(etc: Path) -> None:
    (etc / "policy.toml").write_text(
        'default = "allw"\napproval_deadline_sec = "60"\n'
        '[capabilities]\n"network:host" = "ask"\n'
        '[definitions."builtin:implement".capabilities]\nwrite = "never"\n'
    )
    with pytest.raises(PolicyError) as caught:
        load_policy()
    lines = caught.value.message.splitlines()
    assert lines[0] == "4 errors in 1 config file:"
    wheres = [line.split(": ")[1] for line in lines[1:]]
    assert wheres == [
        "default",
        "approval_deadline_sec",
        'capabilities."network:host"',
        'definitions."builtin:implement".capabilities.write',
    ]


def test_a_file_that_is_not_utf8_names_its_line(etc: Path) -> None:
    (etc / "policy.toml").write_bytes(b'default = "allow"\n# caf\xe9\n')
    with pytest.raises(PolicyError, match=r"policy.toml: line 2: not UTF-8 text"):
        load_policy()


def test_schedules_toml_errors_name_the_field(etc: Path) -> None:
    (etc / "schedules.toml").write_text("max_active_scheduled_runs = -1\nsurprise = 1\n")
    with pytest.raises(ConfigError) as caught:
        host_config()
    assert caught.value.message.splitlines()[1:] == [
        f"  {etc / 'schedules.toml'}: max_active_scheduled_runs: "
        "Input should be greater than or equal to 0 (got -1)",
        f"  {etc / 'schedules.toml'}: surprise: unknown field: remove it or correct its name",
    ]


def test_missing_files_mean_the_defaults(etc: Path) -> None:
    assert load_policy().default == "allow"
    assert load_providers().providers == {}
    assert host_config().max_active_scheduled_runs >= 0


# --- files loaded together ----------------------------------------------------------------


def test_two_bad_profiles_are_one_error_naming_both_files_and_the_field(etc: Path) -> None:
    claude, codex = _bad_profiles(etc)
    review = review_source(TWO_AGENTS, filename="two.py")
    with pytest.raises(ConfigError) as caught:
        resolve_profiles(review, {})
    lines = caught.value.message.splitlines()
    assert lines[0] == "3 errors in 2 config files:"
    assert lines[1].startswith(f"  {claude}: line 2, column 22: not valid TOML: ")
    assert lines[2].startswith(f"  {codex}: max_steps: Input should be a valid integer")
    assert lines[3] == f"  {codex}: argvv: unknown field: remove it or correct its name"
    hint = caught.value.hint or ""
    assert "TOML syntax" in hint and "/usr/share/doc/cairn/docs/agents.md" in hint


def test_a_profile_value_of_the_wrong_toml_type_is_not_converted(etc: Path) -> None:
    (etc / "profiles.d" / "claude.toml").write_text('kind = "command"\nargv = ["/bin/true"]\n')
    codex = etc / "profiles.d" / "codex.toml"
    codex.write_text('kind = "command"\nargv = ["/bin/true"]\nmax_steps = "5"\n')
    with pytest.raises(ConfigError) as caught:
        resolve_profiles(review_source(TWO_AGENTS, filename="two.py"), {})
    assert caught.value.message == f"{codex}: max_steps: Input should be a valid integer (got '5')"


def test_problems_of_the_policy_and_the_profiles_come_together(etc: Path) -> None:
    _bad_profiles(etc)
    (etc / "policy.toml").write_text('default = "allw"\n')
    problems = Problems()
    policy = load_policy(problems=problems)
    assert policy.default == "deny", "a policy that failed to load allows nothing"
    with pytest.raises(ConfigError) as caught:
        resolve_profiles(review_source(TWO_AGENTS, filename="two.py"), {}, problems=problems)
    assert caught.value.message.startswith("4 errors in 3 config files:\n")


# --- cairnd -------------------------------------------------------------------------------


def _launch(project: Path, request: LaunchRequest) -> dict[str, Any]:
    client, conn = socket.socketpair()
    fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with client:
            line = request.model_dump_json().encode() + b"\n"
            client.sendmsg(
                [line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))]
            )
            server.handle(conn)  # closes conn
            reply: dict[str, Any] = json.loads(client.recv(1 << 20))
    finally:
        os.close(fd)
    return reply


def _two_agent_launch(project: Path) -> LaunchRequest:
    review = review_source(TWO_AGENTS, filename="two.py")
    return LaunchRequest(
        definition="two.py",
        source=TWO_AGENTS,
        confirm=review.review_hash,
        args={"text": "go"},
        project=str(project),
    )


def test_cairnd_answers_bad_config_with_its_code_not_internal(
    etc: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths.journal_path().parent.mkdir(parents=True)
    claude, codex = _bad_profiles(etc)
    reply = _launch(tmp_path, _two_agent_launch(tmp_path))
    assert reply["ok"] is False
    error = reply["error"]
    assert error["code"] == "config"
    assert "internal" not in error["message"]
    assert str(claude) in error["message"] and str(codex) in error["message"]
    assert f"{codex}: max_steps:" in error["message"]
    assert "Traceback" not in caplog.text
    journal = Journal(paths.journal_path())
    try:  # nothing was recorded: the launch was refused before its run existed
        assert journal.list_runs(None) == []
    finally:
        journal.close()


def test_cairnd_refuses_a_launch_under_an_invalid_policy(etc: Path, tmp_path: Path) -> None:
    paths.journal_path().parent.mkdir(parents=True)
    (etc / "profiles.d" / "claude.toml").write_text('kind = "command"\nargv = ["/bin/true"]\n')
    (etc / "profiles.d" / "codex.toml").write_text('kind = "command"\nargv = ["/bin/true"]\n')
    (etc / "policy.toml").write_text('default = "allw"\n')
    error = _launch(tmp_path, _two_agent_launch(tmp_path))["error"]
    assert error["code"] == "config"
    assert error["message"] == (
        f"{etc / 'policy.toml'}: default: Input should be 'allow', 'deny' or "
        "'require_approval' (got 'allw')"
    )


# --- no other reader ------------------------------------------------------------------------


def test_only_cairn_config_parses_toml() -> None:
    """Every configuration file is read through cairn.config, so none can fail without
    its file name or reach cairnd's socket as an internal error."""
    readers = []
    for folder in ("cairn", "daemon", "broker", "coordinator", "worker"):
        for file in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(file.read_text(), str(file))
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                )
                if any(name.split(".")[0] in ("tomllib", "tomli") for name in names):
                    readers.append(str(file.relative_to(REPO)))
    # and root, which re-reads what a launch froze from /etc itself, refusing by file name
    # (ARCHITECTURE §7); it does not load the host-config models
    assert sorted(readers) == ["broker/hostfiles.py", "cairn/config.py"]
