"""The agent CLIs people already use, run for real as command profiles in a booted
machine: each shipped example profile exactly as documented, the CLI at its pinned version
(``agent_clis.py``), against the fake provider speaking the API that CLI uses, through the
relay. Each must change the file it was asked to change, settle only that, and end with
the typed output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from agent_clis import ensure_codex, ensure_opencode, install
from machine import Machine
from test_model_agents import PORT, PROJECT, configure, launch_reviewed, start_provider
from test_recovery import wait_finished

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs/examples/profiles.d"
ENTRY = "## Unreleased\n- the parser accepts empty files\n"


def use_example_profile(machine: Machine, name: str) -> None:
    """The shipped example, byte for byte, where an administrator puts it: its file and,
    if it has one, its directory of the CLI's own configuration."""
    machine.exec(["install", "-D", "-m", "0644", "/dev/stdin",
                  f"/etc/cairn/profiles.d/{name}.toml"],
                 input=(EXAMPLES / f"{name}.toml").read_bytes())
    files = EXAMPLES / f"{name}.d"
    for path in sorted(files.rglob("*")) if files.is_dir() else []:
        if path.is_file():
            machine.exec(["install", "-D", "-m", "0644", "/dev/stdin",
                          f"/etc/cairn/profiles.d/{name}.d/{path.relative_to(files)}"],
                         input=path.read_bytes())


def openai_provider(machine: Machine) -> None:
    """The examples name the provider ``openai``: here it is the fake one."""
    machine.exec(["tee", "/etc/cairn/providers.toml"], input=(
        'default = "openai"\n\n[providers.openai]\n'
        f'base_url = "http://127.0.0.1:{PORT}/v1"\nmodel = "fake-1"\n'
        'credential = "cairn-provider-fake"\n').encode())


def test_codex_exec_changes_the_file_it_was_asked_to(machine: Machine) -> None:
    version = install(machine, ensure_codex())
    key = configure(machine)
    openai_provider(machine)
    machine.exec(["tee", f"{PROJECT}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    edit = f"printf '{ENTRY}' >> CHANGELOG.md && echo appended"
    answer = ("I added the entry under Unreleased.\n\n"
              '```json\n{"summary": "added the entry for empty files"}\n```')
    start_provider(machine, [
        {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": edit}}], "tokens": 5},
        {"content": answer, "tokens": 9},
    ], key)
    use_example_profile(machine, "codex")
    started = time.monotonic()
    _review, run_id = launch_reviewed(machine, "command_codex.py",
                                      "Add a CHANGELOG entry: the parser accepts empty files")
    data = wait_finished(machine, run_id)
    took = time.monotonic() - started
    assert data["run"]["state"] == "succeeded", (data["run"]["error"],
                                                  machine.journal(run_id=run_id)[-4000:])
    assert data["run"]["output"] == {"summary": "added the entry for empty files"}
    changelog = machine.exec(["cat", f"{PROJECT}/CHANGELOG.md"]).stdout.decode()
    assert changelog == "# Changelog\n" + ENTRY.replace("\\n", "\n")
    assert data["settlement"]["candidate"]["accepted"] == ["CHANGELOG.md"]
    # Both calls went over HTTP through the relay: no WebSocket retries (the relay answers
    # an upgrade 426), the real key added by the relay, the model the route's.
    (op,) = data["operations"]
    boundary = f"/var/lib/cairn/runs/{run_id}/boundaries/{op['op_id']}"
    transcript = machine.exec(["cat", f"{boundary}/transcript.jsonl"]).stdout.decode()
    assert key not in transcript
    calls = [json.loads(line) for line in transcript.splitlines()]
    assert [c["path"] for c in calls] == ["/responses", "/responses"], calls
    assert all(c["status"] == 200 for c in calls)
    relay_log = machine.journal(unit=f"cairn-coordinator@{run_id}.service")
    assert relay_log.strip() and "asked for a WebSocket" not in relay_log  # not once
    print(f"{version}: launch to succeeded in {took:.1f} s")


def test_opencode_run_changes_the_file_it_was_asked_to(machine: Machine) -> None:
    version = install(machine, ensure_opencode())
    key = configure(machine)
    openai_provider(machine)
    machine.exec(["tee", f"{PROJECT}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    edit = f"printf '{ENTRY}' >> CHANGELOG.md"
    answer = ("I added the entry under Unreleased.\n\n"
              '```json\n{"summary": "added the entry for empty files"}\n```')
    start_provider(machine, {"untooled": "Changelog entry", "turns": [
        {"tool_calls": [{"name": "bash", "arguments": {
            "command": edit, "description": "Append the changelog entry"}}], "tokens": 5},
        {"content": answer, "tokens": 9},
    ]}, key)
    use_example_profile(machine, "opencode")
    started = time.monotonic()
    _review, run_id = launch_reviewed(machine, "command_opencode.py",
                                      "Add a CHANGELOG entry: the parser accepts empty files")
    data = wait_finished(machine, run_id)
    took = time.monotonic() - started
    assert data["run"]["state"] == "succeeded", (data["run"]["error"],
                                                  machine.journal(run_id=run_id)[-4000:])
    assert data["run"]["output"] == {"summary": "added the entry for empty files"}
    changelog = machine.exec(["cat", f"{PROJECT}/CHANGELOG.md"]).stdout.decode()
    assert changelog == "# Changelog\n" + ENTRY.replace("\\n", "\n")
    assert data["settlement"]["candidate"]["accepted"] == ["CHANGELOG.md"]
    # opencode found its configuration in the agent's home, copied from opencode.d, and
    # spoke only the OpenAI API through the relay
    (op,) = data["operations"]
    boundary = f"/var/lib/cairn/runs/{run_id}/boundaries/{op['op_id']}"
    transcript = machine.exec(["cat", f"{boundary}/transcript.jsonl"]).stdout.decode()
    assert key not in transcript
    calls = [json.loads(line) for line in transcript.splitlines()]
    assert {c["path"] for c in calls} == {"/chat/completions"}, calls
    assert all(c["status"] == 200 for c in calls)
    print(f"opencode {version}: launch to succeeded in {took:.1f} s")
