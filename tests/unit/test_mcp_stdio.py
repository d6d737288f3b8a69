"""``cairn mcp`` over real stdio (a subprocess) against a stand-in cairnd on a real Unix
socket: the handshake, the tools a model sees (only exposed workflows, never an approving
one), calls, and JSON-RPC errors. ``cairn_watch`` is driven in process with an injected
clock."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_standin import (
    REPLY_SECONDS,
    RUN,
    SOURCE,
    StandInDaemon,
    StdioClient,
    install_definitions,
    review_hash,
)

from cairn import paths
from cairn.definitions import registry, user
from cairn.definitions.files import drafts_dir, workflows_dir
from cairn.mcp.server import Server
from cairn.mcp.tools import Session
from cairn.protocol.daemon import ErrorBody, OpRequest
from cairn.protocol.mcp import LATEST_PROTOCOL_VERSION, MAX_ARTIFACT_TEXT

FIXED = ["cairn_runs", "cairn_show", "cairn_artifact", "cairn_watch", "cairn_inbox",
         "cairn_answer", "cairn_workflow_draft"]
RUNS: list[dict[str, Any]] = [{
    "run_id": RUN, "state": "running", "position": None, "definition": "user:fix-flaky",
    "project": "/home/u/app", "owner_uid": 1000, "created_at": 1.0, "run_key": None,
    "current_op": None, "settlement_summary": None, "error": None, "replay_through": None,
    "replayed_by": []}]
QUESTION: dict[str, Any] = {
            "kind": "question", "run_id": RUN, "op_id": "root-3", "question": "Which branch?",
            "schema_name": None, "challenge": "sha256:" + "c" * 64, "created_at": 1.0,
            "commands": [], "run_state": "waiting", "definition": "user:fix-flaky",
            "json_schema": {}, "state": "waiting", "answer": None, "actor_uid": None,
            "decided_at": None}
APPROVAL = {"kind": "approval", "run_id": RUN, "op_id": "root-4", "request_id": "req-1",
            "fingerprint": "sha256:" + "f" * 64, "deadline": 2.0, "created_at": 1.0,
            "run_state": "waiting", "definition": "user:fix-flaky", "attempt": 1,
            "evaluation": {"decision": "ask"}, "state": "waiting", "actor_uid": None,
            "reason": None, "decided_at": None,
            "prepared": {"kind": "apply", "run_id": RUN, "accepted": [], "project": "/p",
                         "refused": 0, "f": "f", "diff_sha256": "0" * 64}}
# a launch as cairnd answers it (cairn.protocol.run_replies.LaunchReply)
LAUNCHED = {"run_id": RUN, "review_hash": "sha256:" + "a" * 64,
            "launch_hash": "sha256:" + "b" * 64, "state": "pending"}


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInDaemon]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path / "root"))
    install_definitions(tmp_path)
    paths.daemon_socket().parent.mkdir(parents=True)
    answers: dict[str, Any] = {
        "ps": RUNS,
        "launch": LAUNCHED,
        "inbox": [QUESTION, APPROVAL],
        "answer": {"run_id": RUN, "op_id": "root-3", "outcome": "answered", "woken": True},
        "show": ErrorBody(code="not-found", message="no run flow_9999 of yours",
                          hint="see 'cairn list'"),
    }
    stand_in = StandInDaemon(paths.daemon_socket(), answers)
    yield stand_in
    stand_in.close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "app"
    path.mkdir()
    return path


@pytest.fixture
def client(daemon: StandInDaemon, project: Path) -> Iterator[StdioClient]:
    session = StdioClient(cwd=project)
    yield session
    status, stderr = session.close()
    assert status == 0, stderr


def test_initialize_negotiates_the_protocol_version(client: StdioClient) -> None:
    result = client.initialize("2025-06-18")
    assert result["protocolVersion"] == "2025-06-18"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "cairn"
    assert "a person's act" in result["instructions"]
    # a version this server does not speak: it answers with its own latest
    assert client.initialize("1999-01-01")["protocolVersion"] == LATEST_PROTOCOL_VERSION


def test_tools_are_the_exposed_workflows_and_the_fixed_tools(client: StdioClient) -> None:
    client.initialize()
    tools = client.request("tools/list")["result"]["tools"]
    # not user:tidy (installed, not exposed), not the draft, not user:stale (reinstalled
    # since it was exposed), and nothing that approves, rejects or applies
    assert [t["name"] for t in tools] == ["user_fix-flaky", *FIXED]
    assert not [t for t in tools if {"approve", "reject", "apply"} & set(t["name"].split("_"))]
    launcher = tools[0]
    assert launcher["description"].startswith("fix-flaky: describe what a run does.")
    assert review_hash(SOURCE, "fix-flaky") in launcher["description"]
    schema = launcher["inputSchema"]
    assert schema["required"] == ["args"] and schema["additionalProperties"] is False
    objective = schema["properties"]["args"]["properties"]["objective"]
    assert (objective["minLength"], objective["maxLength"]) == (1, 20_000)
    assert schema["properties"]["args"]["required"] == ["objective"]
    assert set(schema["properties"]) == {"args", "project", "apply", "run_key"}


def test_cairn_runs_are_the_callers_runs_from_cairnd(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    result = client.call("cairn_runs", {})
    assert result["structuredContent"] == {"runs": RUNS}
    assert json.loads(result["content"][0]["text"]) == {"runs": RUNS}
    assert result["isError"] is False
    assert daemon.ops() == ["ps"] and daemon.asked[0]["all_users"] is False


def test_a_workflow_tool_launches_the_installed_source_on_the_servers_directory(
    client: StdioClient, daemon: StandInDaemon, project: Path
) -> None:
    client.initialize()
    result = client.call("user_fix-flaky", {"args": {"objective": "fix the flaky test"}})
    assert result["structuredContent"] == {
        "run_id": RUN, "definition": "user:fix-flaky", "project": str(project), "state": "pending"
    }
    [launch] = daemon.asked
    assert launch["op"] == "launch" and launch["definition"] == "user:fix-flaky"
    assert launch["source"] == SOURCE
    assert launch["confirm"] == review_hash(SOURCE, "fix-flaky")
    assert launch["args"] == {"objective": "fix the flaky test"}
    assert (launch["project"], launch["apply_mode"]) == (str(project), "auto")
    st = os.stat(project)
    assert daemon.passed == [(st.st_dev, st.st_ino)]  # the project, as an open descriptor
    assert daemon.channels == 1  # and the channel the server attests the launch on


def test_a_workflow_tool_passes_its_run_key_and_says_when_the_run_was_launched_before(
    client: StdioClient, daemon: StandInDaemon, project: Path
) -> None:
    client.initialize()
    daemon.answers["launch"] = {**daemon.answers["launch"], "state": "running",
                                "launched_before": True}
    result = client.call("user_fix-flaky", {"args": {"objective": "x"}, "run_key": "pr-7"})
    assert result["structuredContent"] == {
        "run_id": RUN, "definition": "user:fix-flaky", "project": str(project),
        "state": "running", "launched_before": True,
    }
    [launch] = daemon.asked
    assert launch["run_key"] == "pr-7"
    bad = client.call("user_fix-flaky", {"args": {"objective": "x"}, "run_key": "a b"})
    assert bad["isError"] is True and "run_key" in bad["content"][0]["text"]
    assert len(daemon.asked) == 1  # a key that is not a name never reaches cairnd


def test_unknown_and_approving_tools_are_protocol_errors(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    for name in ("cairn_approve", "cairn_apply", "user_tidy", "user_sketch", "user_stale"):
        reply = client.request("tools/call", {"name": name, "arguments": {}})
        assert reply["error"]["code"] == -32602
        assert reply["error"]["message"].startswith(f"no tool named '{name}'")
    assert daemon.asked == []  # nothing reached cairnd


def test_bad_lines_get_json_rpc_errors_and_the_session_goes_on(client: StdioClient) -> None:
    client.send(b"not json")
    reply = client.receive()
    assert reply["id"] is None and reply["error"]["code"] == -32700
    client.send({"jsonrpc": "1.0", "id": 7, "method": "ping"})
    reply = client.receive()
    assert (reply["id"], reply["error"]["code"]) == (7, -32600)
    assert client.request("no/such")["error"]["code"] == -32601
    assert client.request("initialize", {})["error"]["code"] == -32602
    assert client.request("ping")["result"] == {}


def test_refusals_are_results_the_model_reads(client: StdioClient, daemon: StandInDaemon) -> None:
    client.initialize()
    result = client.call("cairn_show", {"run": "flow_9999"})
    assert result["isError"] is True
    assert result["content"][0]["text"] == "no run flow_9999 of yours (hint: see 'cairn list')"
    result = client.call("cairn_show", {"run": "x!"})
    assert result["isError"] is True and "does not name a run" in result["content"][0]["text"]
    result = client.call("cairn_runs", {"all": True})
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("cairn_runs arguments: all: Extra inputs")
    assert daemon.ops() == ["show"]  # bad arguments never reach cairnd


def test_inbox_shows_questions_and_not_what_approving_takes(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    items = client.call("cairn_inbox", {})["structuredContent"]["items"]
    assert items[0] == QUESTION
    assert items[1]["kind"] == "approval" and "a person" in items[1]["decided_by"]
    assert "fingerprint" not in items[1] and "request_id" not in items[1]
    out = client.call("cairn_answer", {"run": RUN, "challenge": QUESTION["challenge"],
                                       "answer": {"branch": "main"}})
    assert out["structuredContent"]["outcome"] == "answered"
    assert daemon.asked[-1]["answer"] == '{"branch": "main"}'


# --- cairn_watch, in process, with an injected clock ------------------------------------


class ScriptedCairnd:
    """Answers watch requests from a list of replies; the clock moves only when the
    server pauses."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = replies
        self.cursors: list[int] = []
        self.now = 100.0

    def request(self, body: OpRequest, **_: Any) -> Any:
        self.cursors.append(body.model_dump()["cursor"])
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    def pause(self, seconds: float) -> None:
        self.now += seconds


def watch_reply(state: str, events: list[str], cursor: int) -> dict[str, Any]:
    return {
        "run_id": RUN, "state": state, "finished": state == "succeeded", "error": None,
        "output": {"summary": "done"} if state == "succeeded" else None,
        "events": [{"event": e, "op_id": "root-1", "at": 1.0, "data": {}, "cursor": i}
                   for i, e in enumerate(events, cursor - len(events) + 1)],
        "cursor": cursor, "more": False, "waiting": [],
    }


def serve(cairnd: ScriptedCairnd, *lines: dict[str, Any]) -> list[dict[str, Any]]:
    out = io.BytesIO()
    session = Session(request=cairnd.request, cwd=Path("/"), clock=lambda: cairnd.now,
                      pause=cairnd.pause)
    Server(out, session, "test").serve(json.dumps(line).encode() for line in lines)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def watch_call(arguments: dict[str, Any], token: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "cairn_watch", "arguments": arguments}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def test_watch_follows_a_run_to_its_next_state_with_progress() -> None:
    cairnd = ScriptedCairnd([
        watch_reply("running", ["run-started", "op-requested"], 2),
        watch_reply("running", [], 2),
        watch_reply("succeeded", ["op-committed", "run-succeeded"], 4),
    ])
    *progress, answer = serve(cairnd, watch_call({"run": RUN}, "tok"))
    assert [p["params"] for p in progress] == [
        {"progressToken": "tok", "progress": 1.0, "message": "run-started root-1"},
        {"progressToken": "tok", "progress": 2.0, "message": "op-requested root-1"},
        {"progressToken": "tok", "progress": 3.0, "message": "op-committed root-1"},
        {"progressToken": "tok", "progress": 4.0, "message": "run-succeeded root-1"},
    ]
    assert {p["method"] for p in progress} == {"notifications/progress"}
    result = answer["result"]["structuredContent"]
    assert (result["state"], result["finished"], result["cursor"]) == ("succeeded", True, 4)
    assert [e["event"] for e in result["events"]][-1] == "run-succeeded"
    assert cairnd.cursors == [0, 2, 2]  # each poll from the last cursor seen
    assert cairnd.now == 102.0  # paused a second between polls that brought nothing new


def test_watch_leaves_out_the_fingerprint_of_an_approval_requested() -> None:
    reply = watch_reply("waiting", ["approval-requested"], 1)
    reply["events"][0]["data"] = {"request_id": "req-1", "fingerprint": "sha256:" + "f" * 64}
    reply["waiting"] = [{"kind": "approval", "op_id": "root-1", "request_id": "req-1",
                         "fingerprint": "sha256:" + "f" * 64}]
    [answer] = serve(ScriptedCairnd([reply]), watch_call({"run": RUN, "timeout": 1}, None))
    result = answer["result"]
    assert result["structuredContent"]["events"][0]["data"] == {"request_id": "req-1"}
    assert "decided_by" in result["structuredContent"]["waiting"][0]
    assert "fingerprint" not in json.dumps(result)


def test_a_reply_cairnd_sent_that_does_not_fit_is_said_so_not_blamed_on_the_arguments() -> None:
    reply = watch_reply("running", ["run-started"], 1)
    del reply["cursor"]
    [answer] = serve(ScriptedCairnd([reply]), watch_call({"run": RUN, "timeout": 1}, None))
    result = answer["result"]
    assert result["isError"] is True
    assert _text(result).startswith("cairnd sent a reply this CLI cannot read"), result
    assert "cursor" not in _text(result)


def test_watch_returns_at_its_timeout_and_without_a_token_sends_no_progress() -> None:
    cairnd = ScriptedCairnd([watch_reply("running", ["run-started"], 5)])
    [answer] = serve(cairnd, watch_call({"run": RUN, "timeout": 3, "cursor": 4}, None))
    result = answer["result"]["structuredContent"]
    assert (result["state"], result["finished"], result["cursor"]) == ("running", False, 5)
    assert cairnd.now == 103.0 and cairnd.cursors[0] == 4


def test_a_cancelled_watch_stops_and_gets_no_answer() -> None:
    """The cancel arrives while the watch waits on cairnd; the watch stops at its next
    poll and the server sends no answer for it, but goes on answering others."""
    asked, release = threading.Event(), threading.Event()
    cairnd = ScriptedCairnd([watch_reply("running", ["run-started"], 1)])

    def blocking(body: OpRequest, **_: Any) -> Any:
        asked.set()
        assert release.wait(REPLY_SECONDS)
        return cairnd.request(body)

    def lines() -> Iterator[bytes]:
        yield json.dumps(watch_call({"run": RUN, "timeout": 600}, "tok")).encode()
        assert asked.wait(REPLY_SECONDS)
        yield json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": 1, "reason": "user"}}).encode()
        release.set()
        yield json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode()

    out = io.BytesIO()
    session = Session(request=blocking, cwd=Path("/"), clock=lambda: cairnd.now,
                      pause=cairnd.pause)
    Server(out, session, "test").serve(lines())
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [m.get("id") for m in written if "id" in m] == [2]  # no answer for the watch
    progress = [m["params"]["message"] for m in written if m.get("method")]
    assert progress == ["run-started root-1"]  # what came before the cancel took effect
    assert cairnd.now <= 101.0  # stopped at its first pause, not after 600 seconds


def test_unexposing_takes_effect_in_a_running_server(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    assert client.request("tools/list")["result"]["tools"][0]["name"] == "user_fix-flaky"
    registry.unexpose("user:fix-flaky")
    names = [t["name"] for t in client.request("tools/list")["result"]["tools"]]
    assert names == FIXED
    reply = client.request("tools/call", {"name": "user_fix-flaky",
                                          "arguments": {"args": {"objective": "x"}}})
    assert reply["error"]["code"] == -32602
    assert daemon.asked == []


def test_show_leaves_out_what_approving_takes() -> None:
    facet = {"kind": "approval", "op_id": "root-2", "request_id": "req-1",
             "fingerprint": "sha256:" + "f" * 64, "deadline": 2.0, "also_waiting": 1}
    view = {"run": {"run_id": RUN, "state": "waiting"}, "question": facet, "settlement": None,
            "settlement_summary": None, "operations": [], "progress": {}, "latest_event": None,
            "units": [], "storage": {"deleted": False, "deleted_at": None, "subvolumes": 0},
            "replayed_from": None, "worklists": [], "experiments": [], "model": None,
            "divergence": None, "integrity": {}, "events_shown": "0 events"}
    out = io.BytesIO()
    session = Session(request=lambda body, **_: view, cwd=Path("/"), clock=lambda: 0.0,
                      pause=lambda seconds: None)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "cairn_show", "arguments": {"run": RUN}}}
    Server(out, session, "test").serve([json.dumps(call).encode()])
    [answer] = [json.loads(line) for line in out.getvalue().splitlines()]
    shown = answer["result"]["structuredContent"]
    assert shown["run"]["state"] == "waiting"
    assert shown["question"]["kind"] == "approval" and shown["question"]["also_waiting"] == 1
    assert "fingerprint" not in json.dumps(shown) and "req-1" not in json.dumps(shown)


def _text(result: dict[str, Any]) -> str:
    text: str = result["content"][0]["text"]
    return text


def test_a_model_writes_a_draft_that_is_reviewed_and_never_installed(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    installed_before = sorted(p.name for p in workflows_dir().iterdir())
    result = client.call("cairn_workflow_draft", {"name": "triage", "source": SOURCE})
    assert result["isError"] is False, _text(result)
    answer = result["structuredContent"]
    path = drafts_dir() / "triage.py"
    assert (answer["definition"], answer["path"], answer["written"]) == (
        "user:triage", str(path), True)
    assert path.read_text() == SOURCE and (path.stat().st_mode & 0o777) == 0o600
    assert answer["draft"] == user.Draft("triage", path, SOURCE).draft_hash
    review = answer["review"]
    assert review["passed"] is True
    assert review["review_hash"] == review_hash(SOURCE, "triage")
    assert review["manifest"].endswith(f"review_hash: {review['review_hash']}")
    assert f"cairn workflow install {path} --confirm {review['review_hash']}" in review[
        "to_install"]
    assert answer["installed_review_hash"] is None
    # a draft is inert: not installed, not exposed, not a tool, and cairnd never asked
    assert sorted(p.name for p in workflows_dir().iterdir()) == installed_before
    assert "user:triage" not in registry.exposed_hashes()
    tools = client.request("tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["user_fix-flaky", *FIXED]
    assert daemon.ops() == []


def test_a_draft_that_fails_review_is_kept_with_every_violation(client: StdioClient) -> None:
    client.initialize()
    source = "import os\n\nos.system('true')\n"
    answer = client.call("cairn_workflow_draft", {"name": "broken", "source": source})
    assert answer["isError"] is False, _text(answer)
    review = answer["structuredContent"]["review"]
    assert review["passed"] is False and "review_hash" not in review
    assert review["violations"] and {"line", "col", "rule", "message"} == set(
        review["violations"][0])
    assert (drafts_dir() / "broken.py").read_text() == source


def test_a_draft_is_replaced_only_by_a_call_that_saw_it(client: StdioClient) -> None:
    client.initialize()
    path = drafts_dir() / "sketch.py"
    template = path.read_text()
    refused = client.call("cairn_workflow_draft", {"name": "sketch", "source": SOURCE})
    assert refused["isError"] is True and "already has a draft" in _text(refused)
    assert path.read_text() == template  # nothing was written
    read = client.call("cairn_workflow_draft", {"name": "sketch"})["structuredContent"]
    assert (read["source"], read["written"]) == (template, False)
    replaced = client.call("cairn_workflow_draft",
                           {"name": "sketch", "source": SOURCE, "replaces": read["draft"]})
    assert replaced["isError"] is False, _text(replaced)
    assert path.read_text() == SOURCE
    # a person edits the draft; the model's next write names the hash it last saw
    edited = SOURCE.replace("max_length=4_000", "max_length=3_000")
    path.write_text(edited)
    seen = replaced["structuredContent"]["draft"]
    stale = client.call("cairn_workflow_draft",
                        {"name": "sketch", "source": SOURCE + "\n", "replaces": seen})
    assert stale["isError"] is True and "changed since" in _text(stale)
    assert path.read_text() == edited  # the person's edit is kept
    # a draft of an installed definition: installing it replaces that one
    over = client.call("cairn_workflow_draft", {"name": "tidy", "source": SOURCE})
    answer = over["structuredContent"]
    assert answer["installed_review_hash"] == review_hash(SOURCE, "tidy")
    assert "cairn workflow install --replace " in answer["review"]["to_install"]
    gone = client.call("cairn_workflow_draft", {"name": "nothing-here"})
    assert gone["isError"] is True and "has no draft" in _text(gone)


def test_a_draft_is_never_written_through_a_link_or_outside_the_drafts(
    client: StdioClient, tmp_path: Path
) -> None:
    client.initialize()
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("kept\n")
    (drafts_dir() / "linked.py").symlink_to(elsewhere)
    for arguments in ({"name": "linked"}, {"name": "linked", "source": SOURCE}):
        result = client.call("cairn_workflow_draft", arguments)
        assert result["isError"] is True and "symbolic link" in _text(result), _text(result)
    assert elsewhere.read_text() == "kept\n"
    assert (drafts_dir() / "linked.py").is_symlink()
    for name in ("../escape", "Upper", "a/b", ""):
        result = client.call("cairn_workflow_draft", {"name": name, "source": SOURCE})
        assert result["isError"] is True and "arguments: name" in _text(result)
    big = client.call("cairn_workflow_draft", {"name": "big", "source": "é" * (600 * 1024)})
    assert big["isError"] is True and "at most 1048576" in _text(big)
    assert sorted(p.name for p in drafts_dir().iterdir()) == ["linked.py", "sketch.py"]


FORM = {"type": "object", "required": ["objective"], "properties": {"objective": {
    "type": "string", "title": "Objective", "minLength": 1, "maxLength": 20_000}}}


def _with_forms(client: StdioClient, version: str = "2025-11-25") -> None:
    reply = client.request("initialize", {
        "protocolVersion": version, "capabilities": {"elicitation": {"form": {}}},
        "clientInfo": {"name": "test", "version": "1"}})
    assert reply["result"]["protocolVersion"] == version


def _call_with_form(client: StdioClient, answer: dict[str, Any],
                    project: Path | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Call the workflow tool without args; answer the form it asks with ``answer`` (a
    response's ``result`` or ``error``); the form request and the call's result."""
    arguments: dict[str, Any] = {"args": {}}
    if project is not None:
        arguments["project"] = str(project)
    client.send({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call",
                 "params": {"name": "user_fix-flaky", "arguments": arguments}})
    asked = client.receive()
    assert asked["method"] == "elicitation/create", asked
    client.send({"jsonrpc": "2.0", "id": asked["id"], **answer})
    reply = client.receive()
    assert reply["id"] == "call-1", reply
    result: dict[str, Any] = reply["result"]
    return asked, result


def test_a_launch_without_its_input_asks_the_person_in_a_form(
    client: StdioClient, daemon: StandInDaemon, project: Path
) -> None:
    _with_forms(client)
    asked, result = _call_with_form(
        client, {"result": {"action": "accept", "content": {"objective": "from the form"}}})
    assert asked["params"]["requestedSchema"] == FORM
    assert asked["params"]["message"] == (
        f"Launch user:fix-flaky on {project}: fix-flaky: describe what a run does.")
    assert result["isError"] is False, _text(result)
    [launch] = daemon.asked
    assert launch["args"] == {"objective": "from the form"}  # what the person entered
    assert launch["confirm"] == review_hash(SOURCE, "fix-flaky")


def test_the_form_shows_a_hostile_project_name_escaped(
    client: StdioClient, tmp_path: Path
) -> None:
    hostile = tmp_path / "app\x1b[2K\rLaunch builtin:safe"
    hostile.mkdir()
    _with_forms(client)
    asked, _result = _call_with_form(client, {"result": {"action": "decline"}}, hostile)
    message = asked["params"]["message"]
    assert "\x1b" not in message and "\r" not in message
    assert "app\\x1b[2K\\rLaunch builtin:safe" in message


def test_a_declined_or_unanswered_form_launches_nothing(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    _with_forms(client)
    for answer, said in (
        ({"result": {"action": "decline"}}, "the launch form was declined"),
        ({"result": {"action": "cancel"}}, "the launch form was cancelled"),
        ({"error": {"code": -32600, "message": "no"}}, "the client did not show the launch form"),
        ({"result": {"action": "maybe"}},
         "the launch form's answer is not one: action: Input should"),
    ):
        _asked, result = _call_with_form(client, answer)
        assert result["isError"] is True and _text(result).startswith(said), _text(result)
    # the harness cancels the call while the form is open: no answer, no launch
    client.send({"jsonrpc": "2.0", "id": "call-2", "method": "tools/call",
                 "params": {"name": "user_fix-flaky", "arguments": {"args": {}}}})
    assert client.receive()["method"] == "elicitation/create"
    client.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                 "params": {"requestId": "call-2"}})
    assert client.request("ping")["result"] == {}
    assert daemon.ops() == []
    # an answer to a request the server never made is dropped, and the session goes on
    client.send({"jsonrpc": "2.0", "id": "cairn-form-99", "result": {"action": "accept"}})
    assert client.request("ping")["result"] == {}


def test_no_form_when_the_input_is_given_or_the_client_shows_none(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    _with_forms(client)
    result = client.call("user_fix-flaky", {"args": {"objective": "given"}})
    assert result["isError"] is False
    client.initialize("2025-03-26")  # a revision before elicitation: never asked
    client.call("user_fix-flaky", {"args": {}})
    client.initialize("2025-11-25")  # capabilities without elicitation
    client.call("user_fix-flaky", {"args": {}})
    assert [r["args"] for r in daemon.asked] == [{"objective": "given"}, {}, {}]


def test_a_client_that_leaves_with_a_form_open_ends_the_server(
    daemon: StandInDaemon, project: Path
) -> None:
    session = StdioClient(cwd=project)
    _with_forms(session)
    session.send({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call",
                  "params": {"name": "user_fix-flaky", "arguments": {"args": {}}}})
    assert session.receive()["method"] == "elicitation/create"
    status, stderr = session.close()  # within REPLY_SECONDS, not the form's 900 s
    assert status == 0, stderr
    assert daemon.ops() == []


def test_a_form_nobody_answers_gives_up_and_launches_nothing(daemon: StandInDaemon) -> None:
    asked: list[Any] = []
    out = io.BytesIO()
    session = Session(request=lambda body, **_: asked.append(body), cwd=Path("/"),
                      clock=lambda: 0.0, pause=lambda seconds: None)
    server = Server(out, session, "test")
    server.form_seconds = 0.3  # the real one waits 15 minutes

    def lines() -> Iterator[bytes]:
        yield json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}}}}).encode()
        yield json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "user_fix-flaky", "arguments": {"args": {}}}}).encode()
        threading.Event().wait(1.5)  # the client stays, and says nothing

    server.serve(lines())
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [m.get("method") for m in written] == [None, "elicitation/create", None]
    result = written[-1]["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("nobody filled in the launch form")
    assert asked == []


def artifact_reply(content: bytes) -> dict[str, Any]:
    return {"run_id": RUN, "op_id": "root-1", "name": "report.md", "size": len(content),
            "sha256": hashlib.sha256(content).hexdigest(),
            "content_base64": base64.b64encode(content).decode()}


def test_an_artifact_reaches_the_model_as_text_and_a_binary_one_as_its_hash(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    daemon.answers["artifacts"] = artifact_reply("# Findings\nünïcode\n".encode())
    got = client.call("cairn_artifact", {"run": RUN, "op": "root-1", "name": "report.md"})
    assert got["structuredContent"]["text"] == "# Findings\nünïcode\n"
    assert (got["structuredContent"]["truncated"], got["structuredContent"]["binary"]) == (
        False, False)
    assert daemon.asked[-1] == {"op": "artifacts", "run_id": RUN, "op_id": "root-1",
                                "name": "report.md"}
    daemon.answers["artifacts"] = artifact_reply(b"\x89PNG\r\n\x1a\n\xff")
    got = client.call("cairn_artifact", {"run": RUN, "op": "root-1", "name": "report.md"})
    assert got["structuredContent"]["text"] is None and got["structuredContent"]["binary"]
    damaged = {**artifact_reply(b"abc"), "sha256": "0" * 64}
    daemon.answers["artifacts"] = damaged
    got = client.call("cairn_artifact", {"run": RUN, "op": "root-1", "name": "report.md"})
    assert got["isError"] is True and "arrived damaged" in got["content"][0]["text"]
    asked = len(daemon.asked)
    for bad in ({"run": RUN, "op": "Root 1", "name": "x"}, {"run": RUN, "op": "root-1"},
                {"run": RUN, "op": "root-1", "name": ""}):
        assert client.call("cairn_artifact", bad)["isError"] is True
    assert len(daemon.asked) == asked  # bad arguments never reach cairnd


def test_a_long_artifact_is_cut_to_what_a_model_reads(
    client: StdioClient, daemon: StandInDaemon
) -> None:
    client.initialize()
    daemon.answers["artifacts"] = artifact_reply(b"x" * (MAX_ARTIFACT_TEXT + 10))
    got = client.call("cairn_artifact", {"run": RUN, "op": "root-1", "name": "report.md"})
    assert len(got["structuredContent"]["text"]) == MAX_ARTIFACT_TEXT
    assert got["structuredContent"]["truncated"] is True
