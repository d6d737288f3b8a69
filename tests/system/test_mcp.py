"""``cairn mcp`` in a booted machine, driven by the official MCP SDK's stdio client on the
host (``tests/support/mcp_sdk_session.py`` from ``.venv-mcp``, which ``./dev`` makes): the
server runs inside the machine as alice (or bob), in alice's project, and talks to the
real cairnd. A model lists only alice's exposed workflow, launches it on her project,
follows it to ``succeeded`` with progress notifications, and cannot approve or apply; bob's
server sees none of alice's runs."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_definitions_installed import new_project, put, reviewed_hash
from test_end_to_end import COMMAND_PROFILE, cairn, finished

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-mcp" / "bin" / "python"
SESSION = REPO / "tests" / "support" / "mcp_sdk_session.py"
SOURCE = (REPO / "cairn" / "builtin" / "workflows" / "implement.py").read_text()
FIXED = ["cairn_runs", "cairn_show", "cairn_artifact", "cairn_watch", "cairn_inbox",
         "cairn_answer", "cairn_workflow_draft"]


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    """One machine: alice has user:notes installed and exposed, user:hidden installed
    only, and a draft; the host's builtin:implementer is a command profile that writes
    NOTES.md, so a run launched without a scripted agent succeeds."""
    if not SDK_PYTHON.exists():
        pytest.fail(f"{SDK_PYTHON} is missing: './dev test' makes it (the official MCP SDK)")
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["mkdir", "-p", "/etc/cairn/profiles.d"])
        machine.exec(["tee", "/etc/cairn/profiles.d/builtin-implementer.toml"],
                     input=COMMAND_PROFILE.encode())
        for name in ("notes", "hidden"):
            file = put(machine, f"/home/alice/wf/{name}.py", SOURCE)
            cairn(machine, "workflow", "install", file, "--confirm", reviewed_hash(machine, file))
        cairn(machine, "workflow", "expose", "user:notes")
        cairn(machine, "workflow", "draft", "sketch")
        yield machine


def mcp_session(machine: Machine, user: str, cwd: str, steps: list[dict[str, Any]],
                tmp_path: Path) -> dict[str, Any]:
    """Run the official client against ``cairn mcp`` started as ``user`` in ``cwd``."""
    file = tmp_path / f"steps-{secrets.token_hex(4)}.json"
    file.write_text(json.dumps(steps))
    server = machine.command(["sh", "-c", f"cd '{cwd}' && exec cairn mcp"], user=user)
    proc = subprocess.run(
        [str(SDK_PYTHON), str(SESSION), str(file), "--", *server],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json"))
    return data


def wait_until_finished(machine: Machine, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while not finished(data := show(machine, run_id)):
        if time.monotonic() > deadline:
            pytest.fail(f"{run_id} is {data['run']['state']}: {data['run']['error']}")
        time.sleep(0.5)
    return data


def test_a_model_launches_an_exposed_workflow_and_follows_it_to_succeeded(
    booted: Machine, tmp_path: Path
) -> None:
    project = new_project(booted, "mcp-app")
    report = mcp_session(booted, "alice", project, [
        {"list": True},
        {"call": "user_notes", "arguments": {"args": {"objective": "take notes"}}},
        {"follow": "$run", "timeout": 60, "rounds": 10},
        {"call": "cairn_approve", "arguments": {"run": "$run"}},
        {"call": "user_hidden", "arguments": {"args": {"objective": "x"}}},
        {"call": "cairn_runs"},
    ], tmp_path)
    assert report["protocol_version"] == "2025-11-25"
    listed, launched, followed, approve, hidden, runs = report["steps"]
    # only the exposed workflow: not user:hidden, not the draft, not builtin:implement
    assert listed["tools"] == ["user_notes", *FIXED]
    assert launched["is_error"] is False, launched["text"]
    run_id = launched["structured"]["run_id"]
    assert launched["structured"]["project"] == project  # the server's directory
    last = followed["rounds"][-1]["structured"]
    assert (last["state"], last["finished"]) == ("succeeded", True), last["error"]
    assert followed["progress"], "no progress notification"
    assert any("run-succeeded" in line for line in followed["progress"]), followed["progress"]
    assert approve["error"]["code"] == -32602 and "no tool named" in approve["error"]["message"]
    assert hidden["error"]["code"] == -32602
    assert [r["run_id"] for r in runs["structured"]["runs"]] == [run_id]
    notes = booted.exec(["cat", f"{project}/NOTES.md"]).stdout.decode()
    assert notes == "objective: take notes\n"
    data = show(booted, run_id)
    assert data["run"]["definition"] == "user:notes"
    assert data["run"]["owner_uid"] == 1001


def test_a_model_cannot_approve_what_waits_for_a_person(
    booted: Machine, tmp_path: Path
) -> None:
    project = new_project(booted, "mcp-held")
    before = booted.exec(["ls", "-A", project]).stdout.decode()
    report = mcp_session(booted, "alice", project, [
        {"call": "user_notes",
         "arguments": {"args": {"objective": "held"}, "apply": "ask"}},
        {"follow": "$run", "timeout": 60, "rounds": 10, "until": "waiting"},
        {"call": "cairn_inbox"},
    ], tmp_path)
    launched, followed, inbox = report["steps"]
    run_id = launched["structured"]["run_id"]
    assert followed["rounds"][-1]["structured"]["state"] == "waiting"
    (item,) = [i for i in inbox["structured"]["items"] if i["run_id"] == run_id]
    assert item["kind"] == "approval" and "a person" in item["decided_by"]
    assert "fingerprint" not in item and "request_id" not in item

    # even holding the fingerprint (a person's inbox shows it), answering is not approving
    (held,) = [i for i in json.loads(cairn(booted, "inbox", "--json")) if i["run_id"] == run_id]
    report = mcp_session(booted, "alice", project, [
        {"call": "cairn_answer", "arguments": {"run": run_id, "challenge": held["fingerprint"],
                                               "answer": "yes"}},
        {"call": "cairn_show", "arguments": {"run": run_id}},
    ], tmp_path)
    answered, shown = report["steps"]
    assert answered["is_error"] is True, answered
    assert shown["structured"]["run"]["state"] == "waiting"
    assert booted.exec(["ls", "-A", project]).stdout.decode() == before  # nothing applied

    assert "proposal approved" in cairn(booted, "apply", run_id)  # the person's act
    assert wait_until_finished(booted, run_id)["run"]["state"] == "succeeded"


def test_another_users_server_sees_none_of_alices_runs(
    booted: Machine, tmp_path: Path
) -> None:
    runs = json.loads(cairn(booted, "list", "--json"))
    assert runs, "the tests above leave alice's runs"
    alices = runs[0]["run_id"]
    booted.exec(["mkdir", "-p", "/home/bob/work"], user="bob")
    report = mcp_session(booted, "bob", "/home/bob/work", [
        {"list": True},
        {"call": "cairn_runs"},
        {"call": "cairn_show", "arguments": {"run": alices}},
        {"call": "cairn_watch", "arguments": {"run": alices, "timeout": 1}},
        {"call": "cairn_artifact", "arguments": {"run": alices, "op": "root-1",
                                                 "name": "report.md"}},
        {"call": "cairn_inbox"},
    ], tmp_path)
    listed, bobs_runs, shown, watched, artifact, inbox = report["steps"]
    assert listed["tools"] == FIXED  # bob exposed nothing
    assert bobs_runs["structured"] == {"runs": []}
    for refused in (shown, watched, artifact):
        assert refused["is_error"] is True and f"no run {alices}" in refused["text"][0]
    assert inbox["structured"] == {"items": []}


def test_a_models_arguments_reach_no_further_than_alice(
    booted: Machine, tmp_path: Path
) -> None:
    """The attack is the model's: whatever it puts in a call, the server opens the project
    as alice and cairnd checks she owns it; no argument names a profile or a hash."""
    booted.exec(["mkdir", "-p", "/home/bob/open"], user="bob")
    booted.exec(["chmod", "755", "/home/bob", "/home/bob/open"])
    before = json.loads(cairn(booted, "list", "--json"))
    report = mcp_session(booted, "alice", "/home/alice", [
        {"call": "user_notes", "arguments": {"args": {"objective": "x"},
                                             "project": "/home/bob/open"}},
        {"call": "user_notes", "arguments": {"args": {"objective": "x"}, "project": "/root"}},
        {"call": "user_notes", "arguments": {"args": {"objective": "x"},
                                             "scripted": {"builtin:implementer": "/tmp/a"}}},
        {"call": "user_notes", "arguments": {"args": {"objective": "x"},
                                             "confirm": "sha256:" + "0" * 64}},
        {"call": "user_notes", "arguments": {"args": {"objective": ""}}},
    ], tmp_path)
    foreign, closed, scripted, confirm, invalid = report["steps"]
    for refused in report["steps"]:
        assert refused["is_error"] is True, refused
    assert "Permission denied" in closed["text"][0]
    assert scripted["text"][0].startswith("user_notes arguments: scripted: Extra inputs")
    assert confirm["text"][0].startswith("user_notes arguments: confirm: Extra inputs")
    assert "objective" in invalid["text"][0]
    assert foreign["text"][0]  # cairnd's one-line refusal: bob owns the directory
    assert json.loads(cairn(booted, "list", "--json")) == before  # no run was created


def test_a_models_draft_runs_only_after_alice_installs_it(
    booted: Machine, tmp_path: Path
) -> None:
    """The model writes user:drafted through the server; it stays a draft (no tool, no
    launch) until alice runs the install the tool's answer names; then it launches."""
    report = mcp_session(booted, "alice", "/home/alice", [
        {"call": "cairn_workflow_draft", "arguments": {"name": "drafted", "source": SOURCE}},
        {"list": True},
    ], tmp_path)
    drafted, listed = report["steps"]
    assert drafted["is_error"] is False, drafted["text"]
    answer = drafted["structured"]
    path = "/home/alice/.config/cairn/drafts/drafted.py"
    assert (answer["path"], answer["review"]["passed"]) == (path, True)
    assert booted.exec(["cat", path]).stdout.decode() == SOURCE
    assert booted.exec(["stat", "-c", "%U %a", path]).stdout.decode().split() == ["alice", "600"]
    assert listed["tools"] == ["user_notes", *FIXED]
    refused = booted.exec(["cairn", "launch", "user:drafted", "--arg", "objective=x"],
                          user="alice", check=False)
    assert refused.returncode == 2, refused.stderr
    assert b"user:drafted is a draft; drafts cannot be launched" in refused.stderr
    review_hash = answer["review"]["review_hash"]
    assert review_hash == reviewed_hash(booted, path)  # what alice's own review says
    cairn(booted, "workflow", "install", path, "--confirm", review_hash)
    project = new_project(booted, "mcp-drafted")
    run_id = cairn(booted, "launch", "user:drafted", "--project", project,
                   "--arg", "objective=drafted").strip().splitlines()[-1]
    assert wait_until_finished(booted, run_id)["run"]["state"] == "succeeded"


def test_a_launch_form_alice_fills_in_is_what_runs(booted: Machine, tmp_path: Path) -> None:
    """The model calls user_notes without its objective; the client shows alice the form
    (the official SDK's elicitation) and what she typed is the run's input."""
    project = new_project(booted, "mcp-form")
    report = mcp_session(booted, "alice", project, [
        {"call": "user_notes", "arguments": {"args": {}},
         "form": {"action": "accept", "content": {"objective": "typed in the form"}}},
        {"follow": "$run", "timeout": 60, "rounds": 10},
    ], tmp_path)
    launched, followed = report["steps"]
    assert launched["is_error"] is False, launched["text"]
    assert launched["asked"]["schema"]["required"] == ["objective"]
    last = followed["rounds"][-1]["structured"]
    assert (last["state"], last["finished"]) == ("succeeded", True), last["error"]
    notes = booted.exec(["cat", f"{project}/NOTES.md"]).stdout.decode()
    assert notes == "objective: typed in the form\n"
