"""``cairn config check``: every file of /etc/cairn checked with the loader that reads it,
every problem reported at once with its file, its line or field, and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirunner import CliRunner

from cairn.cli.commands import app
from cairn.hostconfig import check_host_config


@pytest.fixture(autouse=True)
def etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "etc/cairn/profiles.d").mkdir(parents=True)
    return tmp_path / "etc/cairn"


def test_two_errors_in_two_files_are_reported_at_once_with_their_fields(etc: Path) -> None:
    (etc / "policy.toml").write_text('default = "allw"\n')
    (etc / "profiles.d/codex.toml").write_text(
        'kind = "command"\nargv = ["/bin/true"]\nmax_steps = "many"\n'
    )
    result = CliRunner().invoke(app, ["config", "check"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines == [
        f"{etc / 'policy.toml'}: default: Input should be 'allow', 'deny' or "
        "'require_approval' (got 'allw')",
        lines[1],
        f"{etc / 'profiles.d/codex.toml'}: max_steps: Input should be a valid integer "
        "(got 'many')",
        lines[3],
        "2 errors in 2 config files",
    ]
    assert lines[1].startswith("  fix: ") and "allow, deny or require_approval" in lines[1]
    assert lines[3].startswith("  fix: a profile has kind")


def test_every_file_is_checked_not_only_those_a_launch_reads(etc: Path) -> None:
    (etc / "providers.toml").write_text('default = "local"\n[providers.local]\nmodel = 7\n')
    (etc / "schedules.toml").write_text("max_active_scheduled_runs = -1\n")
    (etc / "profiles.d/unused.toml").write_text('kind = command\n')
    (etc / "provider.toml").write_text("")  # a misspelt name Cairn never reads
    found = [(p.file.name, p.where) for p in check_host_config()]
    assert found == [
        ("providers.toml", "providers.local.base_url"),
        ("providers.toml", "providers.local.model"),
        ("schedules.toml", "max_active_scheduled_runs"),
        ("unused.toml", "line 1, column 8"),
        ("provider.toml", ""),
    ]


def test_a_command_profiles_files_another_user_could_write_are_a_problem(etc: Path) -> None:
    """The broker refuses them when an agent starts; the check says so before a launch."""
    (etc / "profiles.d/opencode.toml").write_text('kind = "command"\nargv = ["/bin/true"]\n')
    files = etc / "profiles.d/opencode.d"
    files.mkdir()
    files.chmod(0o755)
    assert check_host_config() == []
    files.chmod(0o777)
    (problem,) = check_host_config()
    assert (problem.file, problem.message) == (files, "not a directory that only root can "
                                                      "write")
    assert "owned by root with mode 0755" in problem.fix


def test_a_clean_host_passes_and_json_lists_the_problems(etc: Path) -> None:
    ok = CliRunner().invoke(app, ["config", "check"])
    assert ok.exit_code == 0 and ok.output == f"{etc}: no problems\n"
    (etc / "policy.toml").write_text("default = 1\n")
    result = CliRunner().invoke(app, ["config", "check", "--json"])
    assert result.exit_code == 1
    (problem,) = json.loads(result.output)
    assert problem["file"] == str(etc / "policy.toml") and problem["where"] == "default"
    assert problem["fix"]
