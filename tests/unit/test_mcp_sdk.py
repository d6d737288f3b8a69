"""``cairn mcp`` driven by the official MCP Python SDK's stdio client
(``tests/support/mcp_sdk_session.py``), against a stand-in cairnd on a real Unix socket.

The SDK needs a newer pydantic than Cairn pins, so it lives in a venv of its own:
``.venv-mcp`` beside ``.venv`` (``./dev`` makes both), or the interpreter named by
``CAIRN_MCP_SDK_PYTHON``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_standin import RUN, StandInDaemon, install_definitions

from cairn import paths

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "mcp_sdk_session.py"


def sdk_python() -> str:
    python = os.environ.get("CAIRN_MCP_SDK_PYTHON") or str(REPO / ".venv-mcp" / "bin" / "python")
    probe = subprocess.run([python, "-c", "import mcp"], capture_output=True, check=False) \
        if Path(python).exists() else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"the official MCP SDK is not installed for {python}: run ./dev test, "
                    "or make .venv-mcp with 'pip install mcp'")
    return python


def finished_watch() -> dict[str, Any]:
    events: list[dict[str, object]] = [
        {"event": e, "op_id": None, "at": 1.0, "data": {}, "cursor": i}
        for i, e in enumerate(["run-started", "run-succeeded"], 1)]
    return {"run_id": RUN, "state": "succeeded", "finished": True, "error": None,
            "output": {"summary": "done"}, "events": events, "cursor": 2, "more": False,
            "waiting": []}


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInDaemon]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path / "root"))
    install_definitions(tmp_path)
    paths.daemon_socket().parent.mkdir(parents=True)
    stand_in = StandInDaemon(paths.daemon_socket(), {
        "ps": [], "launch": {"run_id": RUN, "review_hash": "sha256:" + "a" * 64,
                                                "launch_hash": "sha256:" + "b" * 64,
                                                "state": "pending"}, "watch": finished_watch(),
    })
    yield stand_in
    stand_in.close()


def sdk_session(tmp_path: Path, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The official client's report of ``steps`` against ``cairn mcp`` run from a fresh
    project directory (``tmp_path/app``)."""
    python = sdk_python()
    project = tmp_path / "app"
    project.mkdir()
    file = tmp_path / "steps.json"
    file.write_text(json.dumps(steps))
    proc = subprocess.run(
        [python, str(SCRIPT), str(file), "--", sys.executable, "-m", "cairn.cli", "mcp"],
        cwd=project, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_the_official_client_lists_launches_follows_and_cannot_approve(
    daemon: StandInDaemon, tmp_path: Path
) -> None:
    report = sdk_session(tmp_path, [
        {"list": True},
        {"call": "cairn_runs"},
        {"call": "user_fix-flaky", "arguments": {"args": {"objective": "fix it"}}},
        {"follow": "$run", "timeout": 5, "rounds": 3},
        {"call": "cairn_approve", "arguments": {"run": "$run"}},
    ])
    assert report["protocol_version"] == "2025-11-25" and report["server"] == "cairn"
    listed, runs, launched, followed, approve = report["steps"]
    assert listed["tools"] == ["user_fix-flaky", "cairn_runs", "cairn_show", "cairn_artifact",
                               "cairn_watch", "cairn_inbox", "cairn_answer",
                               "cairn_workflow_draft"]
    assert runs == {"is_error": False, "structured": {"runs": []}, "text": ['{\n  "runs": []\n}']}
    assert launched["structured"]["run_id"] == RUN
    assert followed["progress"] == ["1 run-started", "2 run-succeeded"]
    assert followed["rounds"][-1]["structured"]["state"] == "succeeded"
    assert approve["error"]["code"] == -32602
    assert daemon.ops() == ["ps", "launch", "watch"]


def test_the_official_client_shows_the_launch_form_and_its_answer_is_launched(
    daemon: StandInDaemon, tmp_path: Path
) -> None:
    report = sdk_session(tmp_path, [
        {"call": "user_fix-flaky", "arguments": {"args": {}},
         "form": {"action": "accept", "content": {"objective": "typed by a person"}}},
        {"call": "user_fix-flaky", "arguments": {"args": {}}, "form": {"action": "decline"}},
    ])
    accepted, declined = report["steps"]
    assert accepted["is_error"] is False, accepted["text"]
    assert accepted["asked"]["schema"]["required"] == ["objective"]
    assert accepted["asked"]["message"].startswith(f"Launch user:fix-flaky on {tmp_path}/app")
    assert declined["is_error"] is True and "declined" in declined["text"][0]
    assert [r["args"] for r in daemon.asked] == [{"objective": "typed by a person"}]
