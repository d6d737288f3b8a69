"""``cairn launch`` as a person types it: the project is the current directory unless
named, byte limits take sizes, and ``cairn --version`` says which cairn this is."""

from __future__ import annotations

import inspect
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import pytest
from clirunner import CliRunner

from cairn.cli import launching
from cairn.cli.commands import app
from cairn.cli.launching import parse_limits
from cairn.errors import UsageError
from cairn.protocol.daemon import LaunchRequest
from cairn.protocol.launch import ProfileSpec


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[LaunchRequest, Path]]:
    """What the CLI would send cairnd: the request and the directory its descriptor opens."""
    seen: list[tuple[LaunchRequest, Path]] = []

    def request(req: dict[str, Any], fd: int | None = None, **_: Any) -> dict[str, Any]:
        assert fd is not None
        seen.append((LaunchRequest.model_validate(req), Path(os.readlink(f"/proc/self/fd/{fd}"))))
        return {"run_id": "flow_" + "0" * 32}

    monkeypatch.setattr(launching, "request", request)
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


def test_arg_pairs_are_json_where_json_and_text_otherwise_over_args(
    tmp_path: Path, sent: list[tuple[LaunchRequest, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [
        "launch", "builtin:implement", "--args", '{"objective": "old", "keep": 1}',
        "--arg", "objective=add a CHANGELOG entry", "--arg", "attempts=3", "--arg", "dry=true",
        "--arg", 'version="1.0"', "--arg", "tags=[1, 2]", "--arg", "empty=", "--arg", "eq=a=b",
    ])
    assert result.exit_code == 0, result.output
    assert sent[0][0].args == {"objective": "add a CHANGELOG entry", "keep": 1, "attempts": 3,
                               "dry": True, "version": "1.0", "tags": [1, 2], "empty": "",
                               "eq": "a=b"}


@pytest.mark.parametrize("pair", ["novalue", "=x", "two words=x", "1st=x"])
def test_an_arg_that_is_not_key_equals_value_is_refused_before_anything_is_sent(
    tmp_path: Path, sent: list[tuple[LaunchRequest, Path]], monkeypatch: pytest.MonkeyPatch,
    pair: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["launch", "builtin:implement", "--arg", pair])
    assert result.exit_code == 2
    assert f"--arg {pair!r} is not KEY=VALUE" in result.stderr
    assert sent == []


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


# --- the command line read without click (cairn.cli.launching.read_argv) ---------------

READ_AS_CLICK_DOES = [
    ["launch", "builtin:implement"],
    ["launch", "builtin:implement", "--project", "p", "--args", '{"a": -1}'],
    ["launch", "--project=p", "wf.py", "--confirm", "sha256:" + "a" * 64, "--json"],
    ["launch", "builtin:goal", "--limit", "max_agent_ops=3", "--limit=memory_max=2G",
     "--scripted", "a=f.json", "--scripted", "b=g.json", "--apply", "never"],
    ["launch", "builtin:goal", "--apply=ask", "--args", "{}", "--args", '{"x": 2}'],
    ["launch", "builtin:goal", "--project", "", "--json", "--json"],
    ["launch", "user:with=sign"],
    ["launch", "builtin:goal", "--run-key", "nightly-1"],
    ["launch", "builtin:goal", "--arg", "objective=a b", "--arg=n=3", "--args", '{"x": 1}'],
]
HANDED_TO_CLICK = [
    ["launch"],
    ["launch", "builtin:goal", "--watch"],
    ["launch", "builtin:goal", "--wait"],
    ["launch", "builtin:goal", "--watch=yes"],
    ["launch", "--help"],
    ["launch", "builtin:goal", "--help"],
    ["launch", "a", "b"],
    ["launch", "a", "--apply", "sometimes"],
    ["launch", "a", "--args"],
    ["launch", "a", "--project", "-p"],
    ["launch", "a", "--json=yes"],
    ["launch", "a", "--no-such-option"],
    ["launch", "a", "--"],
    ["launch", "-"],
    ["--version", "launch", "a"],
    ["show", "a"],
]


def parsed_by_click(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def launch(definition: str, **keywords: Any) -> None:
        seen.append({"definition": definition, **keywords})

    monkeypatch.setattr(launching, "launch", launch)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0 and len(seen) == 1, result.output
    return {k: list(v) if isinstance(v, list | tuple) else v for k, v in seen[0].items()}


@pytest.mark.parametrize("argv", READ_AS_CLICK_DOES, ids=" ".join)
def test_a_launch_is_read_as_click_reads_it(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = {
        name: list(p.default) if isinstance(p.default, tuple) else p.default
        for name, p in inspect.signature(launching.launch).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    read = launching.read_argv(argv, {})
    assert read is not None
    assert {**defaults, **read} == parsed_by_click(argv, monkeypatch)


@pytest.mark.parametrize("argv", HANDED_TO_CLICK, ids=" ".join)
def test_anything_else_is_left_to_click(argv: list[str]) -> None:
    assert launching.read_argv(argv, {}) is None


def test_a_completion_request_is_left_to_click() -> None:
    argv = ["launch", "builtin:goal"]
    assert launching.read_argv(argv, {launching.COMPLETION_ENV: "bash_complete"}) is None
    assert launching.read_argv(argv, {}) is not None


def test_the_reader_knows_exactly_the_click_commands_options() -> None:
    command = app
    assert isinstance(command, click.Group)
    launch = command.commands["launch"]
    options = {
        opt: None if param.is_flag else (param.name, param.multiple)
        for param in launch.params
        if isinstance(param, click.Option)
        for opt in param.opts
    }
    assert options == {**launching.OPTIONS, "--json": None}
    json_flag = next(p for p in launch.params if "--json" in p.opts)
    assert json_flag.name == "json_out"
    apply = next(p for p in launch.params if "--apply" in p.opts)
    assert isinstance(apply.type, click.Choice)
    assert tuple(apply.type.choices) == launching.APPLY_MODES
    arguments = [p.name for p in launch.params if isinstance(p, click.Argument)]
    assert arguments == ["definition"]
    assert command.name is not None
    assert f"_{command.name.upper()}_COMPLETE" == launching.COMPLETION_ENV


def test_the_request_names_every_field_cairnd_validates() -> None:
    request = launching.launch_request(
        definition="builtin:goal", source=None, confirm=None, limits={"max_agent_ops": 3},
        apply_mode="never", args={"objective": "x"}, project="/p",
        scripted={"a": ProfileSpec(name="a", kind="scripted").model_dump(mode="json")},
    )
    assert set(request) == set(LaunchRequest.model_fields)
    assert LaunchRequest.model_validate(request).model_dump(mode="json") == request


# --- launch --watch ----------------------------------------------------------------------


@pytest.mark.parametrize(("state", "status"), [("succeeded", 0), ("failed", 1)])
def test_launch_watch_follows_the_new_run_and_exits_with_its_outcome(
    state: str, status: int, sent: list[tuple[LaunchRequest, Path]],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from cairn.cli import watchview

    followed: list[Any] = []

    def watch_request(body: Any, **_kwargs: Any) -> dict[str, Any]:
        followed.append(body)
        return {"run_id": body.run_id, "cursor": 1, "more": False, "finished": True,
                "state": state, "error": "it broke" if state == "failed" else None,
                "output": {"summary": "done"}, "waiting": [],
                "events": [{"event": f"run-{state}", "at": 1.0, "op_id": None, "data": {}}]}

    monkeypatch.setattr(watchview, "request", watch_request)
    monkeypatch.chdir(tmp_path)
    for flag in ("--watch", "--wait"):
        followed.clear()
        result = CliRunner().invoke(app, ["launch", "builtin:implement", flag])
        assert result.exit_code == status, result.output
        run_id = "flow_" + "0" * 32
        lines = result.output.splitlines()
        assert lines[0] == run_id
        assert [(b.op, b.run_id, b.cursor) for b in followed] == [("watch", run_id, 0)]
        # --watch prints the events; --wait only how the run ended
        assert any(f"run-{state}" in line for line in lines[1:-1]) == (flag == "--watch")
        assert lines[-1].startswith(f"{run_id} {state}"), lines
    assert len(sent) == 2


def test_launch_watch_with_json_is_refused_before_anything_is_sent(
    sent: list[tuple[LaunchRequest, Path]],
) -> None:
    for argv, says in ((["--watch", "--json"], "--watch prints the run's lines as it goes"),
                       (["--wait", "--json"], "--wait prints the run's lines as it goes"),
                       (["--watch", "--wait"], "--watch already waits for the run")):
        result = CliRunner().invoke(app, ["launch", "builtin:implement", *argv],
                                    terminal_width=200)
        assert result.exit_code == 2
        assert says in result.output
    assert sent == []

