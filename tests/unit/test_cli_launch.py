"""``cairn launch`` as a person types it: the project is the current directory unless
named, byte limits take sizes, and ``cairn --version`` says which cairn this is."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cairn.cli import app, runs
from cairn.cli.options import parse_limits
from cairn.errors import UsageError
from cairn.protocol.daemon import LaunchRequest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[LaunchRequest, Path]]:
    """What the CLI would send cairnd: the request and the directory its descriptor opens."""
    seen: list[tuple[LaunchRequest, Path]] = []

    def request(req: LaunchRequest, fd: int | None = None, **_: Any) -> dict[str, Any]:
        assert fd is not None
        seen.append((req, Path(os.readlink(f"/proc/self/fd/{fd}"))))
        return {"run_id": "flow_" + "0" * 32}

    monkeypatch.setattr(runs, "request", request)
    return seen


def test_the_project_is_the_current_directory_by_default(
    tmp_path: Path, sent: list[tuple[LaunchRequest, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["launch", "builtin:implement"])
    assert result.exit_code == 0, result.output
    request, opened = sent[0]
    assert request.project == str(project)
    assert opened == project


def test_a_named_project_still_wins(
    tmp_path: Path, sent: list[tuple[LaunchRequest, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other").mkdir()
    result = CliRunner().invoke(app, ["launch", "builtin:implement", "--project", "other"])
    assert result.exit_code == 0, result.output
    assert sent[0][0].project == str(tmp_path / "other")


def test_memory_limit_takes_a_size_and_counts_do_not() -> None:
    assert parse_limits(["memory_max=2G", "max_agent_ops=20"]) == {
        "memory_max": 2 << 30,
        "max_agent_ops": 20,
    }
    assert parse_limits(["memory_max=536870912"]) == {"memory_max": 512 << 20}
    with pytest.raises(UsageError, match="max_agent_ops=2K") as caught:
        parse_limits(["max_agent_ops=2K"])
    assert caught.value.hint == "sizes such as 2G are for memory_max only"
    with pytest.raises(UsageError, match="cannot read size"):
        parse_limits(["memory_max=lots"])


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"cairn {metadata.version('cairn')}\n"
