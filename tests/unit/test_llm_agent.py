"""The ``llm`` profile: its tools, its output check, and whole agents as real processes.

The end-to-end tests run what a unit runs, on the host: a chat-completions server on
127.0.0.1 scripted with tool calls, the coordinator's relay on a Unix socket, the
coordinator's agent socket, and ``python -m cairn.worker`` as a separate process with
``CAIRN_AGENT_SOCKET``/``CAIRN_MODEL_SOCKET`` pointing at them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cairn.coordinator.agentsock import AgentSocket
from cairn.coordinator.budget import TokenBudget
from cairn.coordinator.relay import ModelRelay, TranscriptEntry
from cairn.proc import run
from cairn.protocol.agent import AgentInstruction
from cairn.protocol.launch import PROFILE_SHA256_ENV, ModelRoute, ProfileSpec
from cairn.worker.tools import Toolbox, schema_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_provider import FakeProvider, Turn  # noqa: E402

KEY = "sk-live-not-for-agents"


class Change(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str = Field(min_length=1)
    kind: Literal["added", "modified"]


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    summary: str = Field(min_length=1, max_length=200)
    changes: list[Change] = Field(min_length=1)
    tests_passed: bool
    confidence: float | None = Field(default=None, ge=0, le=1)


# --- tools --------------------------------------------------------------------------


@pytest.fixture
def toolbox(tmp_path: Path) -> Toolbox:
    notes: list[str] = []
    box = Toolbox(tmp_path, note=notes.append, bash_timeout=5, output_limit=1000)
    (tmp_path / "a.txt").write_text("one\ntwo\ntwo\nthree\n")
    return box


def test_edit_replaces_exactly_one_occurrence(toolbox: Toolbox, tmp_path: Path) -> None:
    assert toolbox.call("edit", {"path": "a.txt", "old_text": "one", "new_text": "1"}) == (
        "edited a.txt"
    )
    refused = toolbox.call("edit", {"path": "a.txt", "old_text": "two", "new_text": "2"})
    assert refused.startswith("error: old_text occurs 2 times")
    missing = toolbox.call("edit", {"path": "a.txt", "old_text": "four", "new_text": "4"})
    assert "occurs 0 times" in missing
    assert (tmp_path / "a.txt").read_text() == "1\ntwo\ntwo\nthree\n"


def test_paths_stay_inside_the_workspace(toolbox: Toolbox, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("/etc")
    assert toolbox.call("read", {"path": "/etc/passwd"}).startswith("error: /etc/passwd is "
                                                                    "outside")
    assert "outside" in toolbox.call("read", {"path": "../x"})
    assert "outside" in toolbox.call("write", {"path": "link/evil", "content": "x"})
    assert toolbox.call("read", {"path": "/workspace/a.txt"}).startswith("     1\tone")
    assert toolbox.call("write", {"path": "d/e.txt", "content": "hi"}).startswith("wrote 2")
    assert (tmp_path / "d" / "e.txt").read_text() == "hi"


def test_bash_has_a_timeout_and_an_output_cap(toolbox: Toolbox) -> None:
    assert toolbox.call("bash", {"command": "cat a.txt | wc -l"}) == "exit status 0\n4\n"
    assert toolbox.call("bash", {"command": "exit 3"}).startswith("exit status 3")
    # Blocks until the timeout: a FIFO that nothing ever opens for writing.
    slow = toolbox.call(
        "bash", {"command": "echo started; mkfifo never; read -r line < never", "timeout": 1}
    )
    assert slow.startswith("timed out after 1s")
    big = toolbox.call("bash", {"command": "head -c 100000 /dev/zero | tr '\\0' x"})
    assert len(big) < 1100 and "characters cut" in big


def test_search_and_unknown_tools(toolbox: Toolbox, tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("two\n")
    assert toolbox.call("search", {"pattern": "^two$"}) == "a.txt:2: two\na.txt:3: two"
    assert toolbox.call("search", {"pattern": "("}).startswith("error: invalid regular")
    assert toolbox.call("rm", {}) == "error: no tool named 'rm'"


@pytest.mark.parametrize("value", [
    {"summary": "ok", "changes": [{"path": "a", "kind": "added"}], "tests_passed": True},
    {"summary": "ok", "changes": [{"path": "a", "kind": "added"}], "tests_passed": False,
     "confidence": 0.5},
    {"summary": "", "changes": [{"path": "a", "kind": "added"}], "tests_passed": True},
    {"summary": "ok", "changes": [], "tests_passed": True},
    {"summary": "ok", "changes": [{"path": "a", "kind": "deleted"}], "tests_passed": True},
    {"summary": "ok", "changes": [{"path": "a", "kind": "added", "x": 1}], "tests_passed": True},
    {"summary": "ok", "changes": [{"path": "a", "kind": "added"}], "tests_passed": "yes"},
    {"summary": "ok", "changes": [{"path": "a", "kind": "added"}], "tests_passed": True,
     "confidence": 1.5},
    {"summary": "ok", "changes": [{"path": "a", "kind": "added"}]},
    {"summary": "x" * 201, "changes": [{"path": "a", "kind": "added"}], "tests_passed": True},
])
def test_output_check_agrees_with_the_strict_model(value: dict[str, Any]) -> None:
    try:
        Summary.model_validate(value, strict=True)
        valid = True
    except ValidationError:
        valid = False
    assert (schema_error(Summary.model_json_schema(), value) is None) == valid


# --- whole agents ---------------------------------------------------------------------


def _call(name: str, **args: Any) -> tuple[str, dict[str, Any]]:
    return (name, args)


GOOD = {"summary": "value() returns 2", "changes": [{"path": "app.py", "kind": "modified"},
                                                    {"path": "NOTES.md", "kind": "added"}],
        "tests_passed": True}


# The worker's entry point, with its finish record (/outputs/finish.json inside a unit)
# in the test's directory.
WORKER = """\
import sys
from pathlib import Path
import cairn.worker.__main__ as worker
worker.write_result.__defaults__ = (Path(sys.argv[1]),)
worker.main()
"""


@dataclass
class Harness:
    workspace: Path
    provider: FakeProvider
    relay: ModelRelay
    sock: AgentSocket
    budget: TokenBudget
    transcript: Path
    notes: list[str]

    def run_worker(self) -> tuple[int, str]:
        outputs = self.workspace.parent / "outputs"
        outputs.mkdir(exist_ok=True)
        proc = run(
            [sys.executable, "-c", WORKER, str(outputs / "finish.json")],
            env={
                "CAIRN_AGENT_SOCKET": str(self.sock.path),
                "CAIRN_MODEL_SOCKET": str(self.relay.socket_path),
                "CAIRN_WORKSPACE": str(self.workspace),
                "CAIRN_OUTPUTS": str(outputs),
                "HOME": str(self.workspace.parent / "home"),
                # what root sets in the agent unit: the profile it froze for this agent
                PROFILE_SHA256_ENV: self.sock.instruction.profile.sha256(),
            },
            cwd=self.workspace,
            check=False,
            timeout=120,
        )
        return proc.returncode, proc.stderr.decode()


@pytest.fixture
def harness_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "cairn-provider-fake").write_text(KEY)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    opened: list[Any] = []

    def make(turns: list[Turn], profile: ProfileSpec, budget_limit: int = 100_000) -> Harness:
        workspace = tmp_path / "workspace"
        workspace.mkdir(exist_ok=True)
        (workspace / "app.py").write_text("def value():\n    return 1\n")
        provider = FakeProvider(turns, require_key=KEY).start()
        opened.append(provider)
        route = ModelRoute(provider="fake", base_url=provider.base_url, model="fake-1",
                           credential="cairn-provider-fake")
        budget = TokenBudget(budget_limit)
        transcript = tmp_path / "boundary" / "transcript.jsonl"
        relay = ModelRelay(tmp_path / "sockets" / "op-1.model.sock", route=route,
                           owner_uid=os.getuid(), transcript=transcript, budget=budget)
        relay.start()
        opened.append(relay)
        notes: list[str] = []
        instruction = AgentInstruction(
            run_id="flow_" + "0" * 32, op_id="op-1", attempt=1,
            prompt="Make value() return 2 and leave a note in NOTES.md.",
            title="implement", descriptor="implement",
            output_schema=Summary.model_json_schema(), profile=profile,
        )
        sock = AgentSocket(tmp_path / "sockets" / "op-1.sock", owner_uid=os.getuid(),
                           instruction=instruction, output_model=Summary,
                           on_note=notes.append)
        opened.append(sock)
        return Harness(workspace, provider, relay, sock, budget, transcript, notes)

    yield make
    for thing in reversed(opened):
        thing.close()


LLM = ProfileSpec(name="builtin:implementer", kind="llm", provider="fake",
                  system_prompt="You are a careful engineer.", max_corrections=2)


def test_llm_agent_edits_runs_bash_and_finishes_with_valid_output(harness_factory: Any) -> None:
    turns = [
        Turn(tool_calls=[_call("read", path="app.py")]),
        Turn(tool_calls=[_call("edit", path="app.py", old_text="return 1",
                               new_text="return 2")]),
        Turn(tool_calls=[_call("write", path="NOTES.md", content="value() now returns 2\n"),
                         _call("notes", text="edited app.py")]),
        Turn(tool_calls=[_call("bash", command="python3 -c 'import app; print(app.value())'")]),
        Turn(content="I think I am done."),
        Turn(tool_calls=[_call("finish_work", output={**GOOD, "summary": ""}, handoff="")]),
        Turn(tool_calls=[_call("finish_work", output=GOOD, handoff="run the tests next")]),
    ]
    h: Harness = harness_factory(turns, LLM)
    code, stderr = h.run_worker()
    assert code == 0, stderr
    assert (h.workspace / "app.py").read_text() == "def value():\n    return 2\n"
    assert (h.workspace / "NOTES.md").read_text() == "value() now returns 2\n"
    assert h.sock.finish is not None
    assert h.sock.finish.output == GOOD and h.sock.finish.handoff == "run the tests next"
    assert h.notes == ["edited app.py"]
    requests = [r.body for r in h.provider.requests]
    assert len(requests) == 7
    assert all(r["model"] == "fake-1" for r in requests)
    first = requests[0]["messages"]
    assert first[0]["role"] == "system" and "careful engineer" in first[0]["content"]
    assert '"tests_passed"' in first[0]["content"]
    assert {t["function"]["name"] for t in requests[0]["tools"]} == {
        "bash", "read", "write", "edit", "search", "notes", "finish_work"
    }
    assert requests[1]["messages"][-1]["content"].startswith("     1\tdef value():")
    assert requests[4]["messages"][-1]["content"] == "exit status 0\n2\n"
    assert "finish_work(output, handoff)" in requests[5]["messages"][-1]["content"]
    refusal = requests[6]["messages"][-1]["content"]
    assert refusal.startswith("error: finish_work refused: output.summary")
    entries = [TranscriptEntry.model_validate_json(line)
               for line in h.transcript.read_text().splitlines()]
    assert [e.status for e in entries] == [200] * 7
    usage = h.relay.usage
    assert usage["requests"] == 7 and usage["output_tokens"] == 70
    assert h.budget.used == usage["total_tokens"] > 70
    assert KEY not in h.transcript.read_text()


def test_too_many_corrections_end_the_agent_without_finishing(harness_factory: Any) -> None:
    turns = [Turn(tool_calls=[_call("finish_work", output={"summary": "x"}, handoff="")])]
    h: Harness = harness_factory(turns, LLM)
    code, stderr = h.run_worker()
    assert code == 1
    assert "3 times (limit 2)" in stderr
    assert h.sock.finish is None
    assert len(h.provider.requests) == 3


def test_unparsable_arguments_are_corrected(harness_factory: Any) -> None:
    turns = [
        Turn(tool_calls=[_call("write", path="x", content="y")], raw_arguments="{not json"),
        Turn(tool_calls=[_call("finish_work", output=GOOD, handoff="")]),
    ]
    h: Harness = harness_factory(turns, LLM)
    code, stderr = h.run_worker()
    assert code == 0, stderr
    assert "not a JSON object" in h.provider.requests[1].body["messages"][-1]["content"]
    assert not (h.workspace / "x").exists()


def test_a_spent_budget_stops_the_agent_cleanly(harness_factory: Any) -> None:
    turns = [Turn(tool_calls=[_call("bash", command="true")], tokens=500)]
    h: Harness = harness_factory(turns, LLM, budget_limit=300)
    code, stderr = h.run_worker()
    assert code == 1
    assert "token budget (300) is spent" in stderr
    assert h.sock.finish is None
    assert len(h.provider.requests) == 1
    assert h.relay.usage["refused"] == 1
    assert h.budget.exhausted


def test_rate_limits_and_server_errors_are_retried_and_noted(harness_factory: Any) -> None:
    now = {"Retry-After": "0"}  # the worker really waits; the wait itself is unit-tested
    turns = [
        Turn(status=429, headers=now, error={"message": "slow down", "type": "rate_limit_error",
                                             "code": None}),
        Turn(status=500, headers=now),
        Turn(tool_calls=[_call("finish_work", output=GOOD, handoff="")]),
    ]
    h: Harness = harness_factory(turns, LLM.model_copy(update={"model_attempts": 3}))
    code, stderr = h.run_worker()
    assert code == 0, stderr
    assert h.sock.finish is not None and h.sock.finish.output == GOOD
    assert len(h.notes) == 2
    assert "HTTP 429: slow down; retry 1 of 2 in 0.0s" in h.notes[0]
    assert "HTTP 500" in h.notes[1] and "retry 2 of 2" in h.notes[1]
    entries = [TranscriptEntry.model_validate_json(line)
               for line in h.transcript.read_text().splitlines()]
    assert [(e.status, e.attempt) for e in entries] == [(429, 1), (500, 2), (200, 3)]
    assert h.relay.usage["retries"] == 2


def test_spent_attempts_end_the_agent_naming_the_last_status(harness_factory: Any) -> None:
    turns = [Turn(status=503, headers={"Retry-After": "0"})]
    h: Harness = harness_factory(turns, LLM.model_copy(update={"model_attempts": 2}))
    code, stderr = h.run_worker()
    assert code == 1
    assert "model call failed 2 times; the last: HTTP 503" in stderr
    assert h.sock.finish is None
    assert len(h.provider.requests) == 2


def test_command_profile_reaches_the_relay_through_the_shim(
    harness_factory: Any, tmp_path: Path
) -> None:
    script = Path(__file__).resolve().parents[1] / "support" / "openai_client.py"
    extra = json.dumps({"changes": [{"path": "ANSWER.txt", "kind": "added"}],
                        "tests_passed": True})
    profile = ProfileSpec(name="aider-like", kind="command", provider="fake",
                          argv=["/usr/bin/python3", "-I", str(script), extra])
    h: Harness = harness_factory([Turn(content="the answer")], profile)
    code, stderr = h.run_worker()
    assert code == 0, stderr
    assert (h.workspace / "ANSWER.txt").read_text() == "the answer"
    assert h.sock.finish is not None
    assert h.sock.finish.output["summary"] == "the answer"
    assert h.sock.finish.handoff == "from the client"
    (received,) = h.provider.requests
    assert received.headers["authorization"] == f"Bearer {KEY}"
    assert received.body["model"] == "fake-1"
    assert h.relay.usage["requests"] == 1


# --- launch-time resolution -------------------------------------------------------------


def test_builtin_llm_profiles_freeze_prompt_and_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cairn.daemon.launch import resolve_definition, resolve_profiles, resolve_routes
    from cairn.errors import NotFound
    from cairn.workflow.review import review_source

    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    source, filename = resolve_definition("builtin:implement")
    review = review_source(source, filename=filename)
    with pytest.raises(NotFound, match="no model provider"):
        resolve_profiles(review, {})
    (tmp_path / "etc" / "cairn").mkdir(parents=True)
    (tmp_path / "etc" / "cairn" / "providers.toml").write_text(
        'default = "local"\n[providers.local]\nbase_url = "http://127.0.0.1:8080/v1"\n'
        'model = "small"\ncredential = "cairn-provider-local"\n'
    )
    profiles = resolve_profiles(review, {})
    profile = profiles["builtin:implementer"]
    assert profile.kind == "llm" and profile.provider == "local"
    assert profile.system_prompt.startswith("You are the implementer")
    routes = resolve_routes(profiles)
    assert routes["local"].model == "small"
    assert routes["local"].credential == "cairn-provider-local"
    assert "sk-" not in profile.model_dump_json() + routes["local"].model_dump_json()


def test_the_llm_agent_is_refused_a_provider_that_speaks_another_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cairn.daemon.launch import resolve_definition, resolve_profiles
    from cairn.errors import UsageError
    from cairn.workflow.review import review_source

    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    (tmp_path / "etc" / "cairn").mkdir(parents=True)
    (tmp_path / "etc" / "cairn" / "providers.toml").write_text(
        'default = "claude"\n[providers.claude]\napi = "anthropic"\n'
        'base_url = "https://api.anthropic.test/v1"\nmodel = "big"\n')
    source, filename = resolve_definition("builtin:implement")
    with pytest.raises(UsageError, match="profile builtin:implementer: Cairn's llm agent "
                       "speaks the OpenAI chat API, and provider claude speaks the anthropic"):
        resolve_profiles(review_source(source, filename=filename), {})
