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
from typing import Any

from agent_clis import ensure_claude, ensure_codex, ensure_opencode, install, install_aider
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


def example_provider(machine: Machine, api: str) -> None:
    """The provider the examples name after its API (``openai``, ``anthropic``): here the
    fake one, with the Anthropic API's key header where it speaks that API."""
    auth = 'auth_header = "x-api-key"\nauth_scheme = ""\n' if api == "anthropic" else ""
    machine.exec(["tee", "/etc/cairn/providers.toml"], input=(
        f'default = "{api}"\n\n[providers.{api}]\napi = "{api}"\n'
        f'base_url = "http://127.0.0.1:{PORT}/v1"\nmodel = "fake-1"\n'
        f'credential = "cairn-provider-fake"\n{auth}').encode())


def run_cli(machine: Machine, name: str, script: list[dict[str, Any]] | dict[str, Any],
            api: str = "openai") -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """Launch a one-agent write workflow on the example profile ``name`` against the fake
    provider playing ``script``; check that the CLI changed CHANGELOG.md as asked, that
    only that was settled, that the output is typed and the key never reached the agent.
    Return the run, its model calls (the transcript) and the seconds to its end."""
    key = configure(machine)
    example_provider(machine, api)
    machine.exec(["tee", f"{PROJECT}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    start_provider(machine, script, key)
    use_example_profile(machine, name)
    workflow = (REPO / "tests/system/data/command_cli.py").read_text()
    started = time.monotonic()
    _review, run_id = launch_reviewed(
        machine, f"command_{name}.py", "Add a CHANGELOG entry: the parser accepts empty files",
        source=workflow.replace('profile="PROFILE"', f'profile="{name}"').encode())
    data = wait_finished(machine, run_id)
    took = time.monotonic() - started
    assert data["run"]["state"] == "succeeded", (data["run"]["error"],
                                                  machine.journal(run_id=run_id)[-4000:])
    assert data["run"]["output"] == {"summary": "added the entry for empty files"}
    changelog = machine.exec(["cat", f"{PROJECT}/CHANGELOG.md"]).stdout.decode()
    assert changelog == "# Changelog\n" + ENTRY.replace("\\n", "\n")
    assert data["settlement"]["candidate"]["accepted"] == ["CHANGELOG.md"]
    (op,) = data["operations"]
    boundary = f"/var/lib/cairn/runs/{run_id}/boundaries/{op['op_id']}"
    transcript = machine.exec(["cat", f"{boundary}/transcript.jsonl"]).stdout.decode()
    assert key not in transcript
    calls = [json.loads(line) for line in transcript.splitlines()]
    assert calls and all(c["status"] == 200 for c in calls)
    return data, calls, took


ANSWER = ("I added the entry under Unreleased.\n\n"
          '```json\n{"summary": "added the entry for empty files"}\n```')


def test_codex_exec_changes_the_file_it_was_asked_to(machine: Machine) -> None:
    version = install(machine, ensure_codex())
    edit = f"printf '{ENTRY}' >> CHANGELOG.md && echo appended"
    data, calls, took = run_cli(machine, "codex", [
        {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": edit}}], "tokens": 5},
        {"content": ANSWER, "tokens": 9},
    ])
    # Both calls went over HTTP (the Responses API) through the relay, and codex never
    # asked for a WebSocket, which the relay would have logged when it answered 426.
    assert [c["path"] for c in calls] == ["/responses", "/responses"], calls
    relay_log = machine.journal(unit=f"cairn-coordinator@{data['run']['run_id']}.service")
    assert relay_log.strip() and "asked for a WebSocket" not in relay_log
    print(f"{version}: launch to succeeded in {took:.1f} s")


def test_opencode_run_changes_the_file_it_was_asked_to(machine: Machine) -> None:
    version = install(machine, ensure_opencode())
    edit = f"printf '{ENTRY}' >> CHANGELOG.md"
    _data, calls, took = run_cli(machine, "opencode", {"untooled": "Changelog entry", "turns": [
        {"tool_calls": [{"name": "bash", "arguments": {
            "command": edit, "description": "Append the changelog entry"}}], "tokens": 5},
        {"content": ANSWER, "tokens": 9},
    ]})
    # opencode found its provider in the configuration copied from opencode.d into the
    # agent's home, and spoke only the OpenAI API through the relay
    assert {c["path"] for c in calls} == {"/chat/completions"}, calls
    print(f"opencode {version}: launch to succeeded in {took:.1f} s")


def test_claude_print_mode_changes_the_file_it_was_asked_to(machine: Machine) -> None:
    version = install(machine, ensure_claude())
    edit = f"printf '{ENTRY}' >> CHANGELOG.md"
    _data, calls, took = run_cli(machine, "claude", [
        {"tool_calls": [{"name": "Bash", "arguments": {
            "command": edit, "description": "Append the changelog entry"}}], "tokens": 5},
        {"content": ANSWER, "tokens": 9},
    ], api="anthropic")
    # Claude Code streamed the Messages API through the relay, which sent the key in the
    # Anthropic API's header (the fake answers 401 otherwise) and metered both calls
    assert [c["path"] for c in calls] == ["/messages", "/messages"], calls
    assert all(c["stream"] and c["usage"] for c in calls), calls
    print(f"claude {version}: launch to succeeded in {took:.1f} s")


def test_aider_message_changes_the_file_it_was_asked_to(machine: Machine) -> None:
    version = install_aider(machine)
    # aider's "whole" edit format (its default for a model it does not know): the path,
    # then the file's new text in a fence; the result on a line of its own after it
    whole = ("CHANGELOG.md\n```\n# Changelog\n" + ENTRY.replace("\\n", "\n") + "```\n\n"
             '{"summary": "added the entry for empty files"}')
    data, calls, took = run_cli(machine, "aider", [{"content": whole, "tokens": 9}])
    assert {c["path"] for c in calls} == {"/chat/completions"}, calls
    # aider's chat and input history were written beside the edit and settled out
    ignored = data["settlement"]["candidate"].get("ignored", [])
    assert ignored and all(path.startswith(".aider") for path in ignored), ignored
    listing = machine.exec(["ls", "-A", PROJECT]).stdout.decode().split()
    assert not [name for name in listing if name.startswith(".aider")], listing
    print(f"{version}: launch to succeeded in {took:.1f} s")
