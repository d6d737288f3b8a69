"""The shipped ``agent-result`` wrapper turns an agent CLI's prose answer into the typed
``{"output", "handoff"}`` result. Each example profile's argv runs as a host would run it
— the worker's ``run_command``, the wrapper from a sealed release built from this tree —
with a stand-in for the agent CLI at the place of the real one."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from cairn.errors import CairnError
from cairn.proc import run
from cairn.protocol.agent import AgentInstruction
from cairn.protocol.launch import MODEL_ENV, ProfileSpec
from cairn.worker import agent_result, profiles

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs/examples/profiles.d"
PROSE_CLIS = ("aider", "claude", "codex", "opencode")
PROMPT = "Add a CHANGELOG entry for the release."
ROUTE_MODEL = "gpt-4.1-mini"

# A stand-in agent CLI: records its argv and the relay URL it was given, prints
# answer.txt of its working directory.
STAND_IN = f"""#!{sys.executable}
import json, os, pathlib, sys
pathlib.Path("argv.json").write_text(json.dumps(sys.argv[1:]))
pathlib.Path("model_url.txt").write_text(os.environ.get("CAIRN_MODEL_URL", ""))
sys.stdout.write(pathlib.Path("answer.txt").read_text())
"""


class Summary(BaseModel):
    summary: str = Field(min_length=1, max_length=200)


class Change(BaseModel):
    summary: str
    files: int


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cairn-worker`` of a sealed release built from this tree (the wrapper ships in it)."""
    out = tmp_path_factory.mktemp("release")
    name = run([sys.executable, REPO / "sealed-release/build.py", "--out", out],
               timeout=120).stdout.decode().strip()
    return out / "releases" / name / "cairn-worker"


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(profiles, "WORKSPACE", tmp_path)
    monkeypatch.setattr(profiles, "OUTPUTS", tmp_path / "outputs")
    monkeypatch.setenv("CAIRN_MODEL_SOCKET", str(tmp_path / "model.sock"))
    monkeypatch.setenv(MODEL_ENV, ROUTE_MODEL)  # root's, from the pinned route
    stand_in = tmp_path / "stand-in"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    return tmp_path


def host_argv(name: str, launcher: Path, stand_in: Path) -> tuple[list[str], ProfileSpec]:
    """The example profile's argv with the three host paths pointed at this test's."""
    data = tomllib.loads((EXAMPLES / f"{name}.toml").read_text())
    profile = ProfileSpec.model_validate({**data, "name": name})
    argv = list(profile.argv)
    assert argv[:5] == ["/usr/bin/python3", "-I", "-B", "/runtime/capsule/cairn-worker",
                        "agent-result"], f"{name} does not use the wrapper"
    cli = argv.index("--") + 1
    assert argv[cli] == f"/usr/local/bin/{name}"
    return [sys.executable, "-I", "-B", str(launcher), *argv[4:cli], str(stand_in),
            *argv[cli + 1:]], profile


def instruction(profile: ProfileSpec, model: type[BaseModel]) -> AgentInstruction:
    return AgentInstruction(
        run_id="flow_" + "0" * 32, op_id="root-1", attempt=1, prompt=PROMPT, title="changelog",
        descriptor="writer", output_schema=model.model_json_schema(), profile=profile,
    )


@pytest.mark.parametrize("name", PROSE_CLIS)
def test_each_example_profile_ends_with_a_typed_result(
    name: str, launcher: Path, workspace: Path
) -> None:
    (workspace / "answer.txt").write_text(
        "I read the project and added an entry under Unreleased.\n\n"
        '```json\n{"summary": "added a CHANGELOG entry", "files": 1}\n```\n'
    )
    argv, profile = host_argv(name, launcher, workspace / "stand-in")
    output, handoff = profiles.run_command(argv, instruction(profile, Change))
    assert output == {"summary": "added a CHANGELOG entry", "files": 1}
    assert handoff.startswith("I read the project and added an entry under Unreleased.")
    # the CLI got its own arguments, the prompt extended by the fields to end with
    got = json.loads((workspace / "argv.json").read_text())
    model_url = (workspace / "model_url.txt").read_text()
    assert model_url.startswith("http://127.0.0.1:")
    expected = [PROMPT if a == "{prompt}" else
                a.replace("{model}", ROUTE_MODEL).replace("{model_url}", model_url)
                for a in profile.argv[profile.argv.index("--") + 2:]]
    (at,) = [i for i, a in enumerate(expected) if a == PROMPT]
    assert got[:at] == expected[:at] and got[at + 1 :] == expected[at + 1 :]
    assert got[at].startswith(PROMPT + "\n\nWhen you are done, end your answer with one")
    assert '"summary" (string), "files" (integer)' in got[at]
    # aider reads a fenced block as a file to write: its example asks for a bare line
    assert ("```json" in got[at]) == (name != "aider"), got[at]


def test_plain_prose_fills_a_schema_of_one_text_field(launcher: Path, workspace: Path) -> None:
    (workspace / "answer.txt").write_text("Added the entry.\n")
    argv, profile = host_argv("claude", launcher, workspace / "stand-in")
    assert profiles.run_command(argv, instruction(profile, Summary)) == (
        {"summary": "Added the entry."}, "Added the entry.")


def test_prose_that_cannot_fit_the_schema_fails_the_agent(
    launcher: Path, workspace: Path
) -> None:
    (workspace / "answer.txt").write_text("Added the entry.\n")
    argv, profile = host_argv("codex", launcher, workspace / "stand-in")
    with pytest.raises(CairnError, match="exited 3"):
        profiles.run_command(argv, instruction(profile, Change))


def test_an_answer_written_to_the_result_file_is_left_to_the_worker(
    launcher: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--answer file``: the CLI is asked to write the result with its own tools, and the
    worker reads that file as it reads any agent's result.json."""
    (workspace / "outputs").mkdir()
    writer = workspace / "writer"
    writer.write_text(f"""#!{sys.executable}
import json, os, pathlib, sys
pathlib.Path("argv.json").write_text(json.dumps(sys.argv[1:]))
pathlib.Path(os.environ["CAIRN_RESULT_FILE"]).write_text(
    json.dumps({{"summary": "written by the CLI", "files": 2}}))
print("I wrote the result file.")
""")
    writer.chmod(0o755)
    profile = ProfileSpec(name="tool", kind="command", argv=["x"])
    argv = [sys.executable, "-I", "-B", str(launcher), "agent-result", "--answer", "file",
            "--", str(writer), "{prompt}"]
    output, _ = profiles.run_command(argv, instruction(profile, Change))
    assert output == {"summary": "written by the CLI", "files": 2}
    (asked,) = json.loads((workspace / "argv.json").read_text())
    assert asked.endswith("write one JSON object with these fields to the file "
                          f"{workspace / 'outputs' / 'result.json'}: \"summary\" (string), "
                          '"files" (integer).')


def test_a_result_file_asked_for_and_not_written_falls_back_to_the_answer(
    launcher: Path, workspace: Path
) -> None:
    (workspace / "outputs").mkdir()
    (workspace / "answer.txt").write_text('Done.\n{"summary": "from the answer", "files": 1}\n')
    profile = ProfileSpec(name="tool", kind="command", argv=["x"])
    argv = [sys.executable, "-I", "-B", str(launcher), "agent-result", "--answer=file", "--",
            str(workspace / "stand-in"), "{prompt}"]
    output, _ = profiles.run_command(argv, instruction(profile, Change))
    assert output == {"summary": "from the answer", "files": 1}


@pytest.mark.parametrize("args", [["--answer=yaml", "--", "cli"], ["--answer"],
                                  ["--verbose", "--", "cli"], ["--answer", "line", "--"]])
def test_the_wrappers_own_options_are_checked(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent_result.main(args) == 2
    assert "usage: cairn-worker agent-result [--answer fenced|line|file] -- CLI" in (
        capsys.readouterr().err)


def test_each_style_asks_for_the_fields_its_own_way() -> None:
    fields = '"summary" (string), "files" (integer)'
    assert agent_result.schema_hint(schema(Change)).endswith(
        f"one JSON object in a ```json block with these fields: {fields}.")
    assert agent_result.schema_hint(schema(Change), "line").endswith(
        f"one last line that holds only a JSON object, not in a code block, with these "
        f"fields: {fields}.")
    assert agent_result.parse_options(["--answer", "line", "--", "cli", "-p"]) == (
        "line", ["cli", "-p"])
    assert agent_result.parse_options(["cli", "--answer=x"]) == ("fenced", ["cli", "--answer=x"])


# --- reading an answer --------------------------------------------------------------------


def schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def test_the_last_object_with_the_required_fields_wins() -> None:
    answer = ('First try: {"summary": "old", "files": 0}\nnested {"a": {"b": 1}}\n'
              'Final: {"summary": "new", "files": 3}\nThanks!')
    assert agent_result.typed_result(answer, schema(Change))["output"] == {
        "summary": "new", "files": 3}


def test_an_output_and_handoff_object_is_taken_as_it_is() -> None:
    answer = 'done {"output": {"summary": "s"}, "handoff": "next: tests"}'
    assert agent_result.typed_result(answer, schema(Summary)) == {
        "output": {"summary": "s"}, "handoff": "next: tests"}


def test_a_long_answer_is_cut_to_the_fields_length() -> None:
    result: dict[str, Any] = agent_result.typed_result("x" * 500, schema(Summary))
    assert len(result["output"]["summary"]) == 200 and result["output"]["summary"][-1] == "…"


def test_an_empty_answer_or_no_cli_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(agent_result.NoResult, match="printed no answer"):
        agent_result.typed_result("  \n", schema(Summary))
    assert agent_result.main(["--"]) == 2
    assert agent_result.main(["--", "/nonexistent/agent"]) == 127
    assert "cannot run /nonexistent/agent" in capsys.readouterr().err
