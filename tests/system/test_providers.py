"""From a host with no provider to a real model run, as docs/first-run.md tells a new user:
its "A local OpenAI-compatible server" commands run word for word against a scripted
chat-completions server on llama-server's port; then a provider with a key, stored
encrypted by ``cairn provider add`` and imported by the probe's unit, answers its test,
a wrong key is the provider's 401 in one line, and ``cairn provider rm`` takes both away.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import Machine
from test_model_agents import call, start_provider
from test_recovery import wait_finished

REPO = Path(__file__).resolve().parents[2]
LOCAL_PORT = 8080
KEYED_PORT = 18081
DEMO = "/home/alice/src/demo"


def doc_commands(heading: str) -> list[str]:
    """The command lines of the first code block under ``heading`` in first-run.md."""
    text = (REPO / "docs/first-run.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    block = re.search(r"\n```\n(.*?)\n```\n", section, re.S)
    assert block is not None, f"no code block under {heading}"
    return block.group(1).splitlines()


def run_as_the_doc_says(machine: Machine, line: str, **kw: object) -> str:
    """One documented command line: ``sudo …`` as root, anything else as alice, through
    a shell as she would type it (``~`` and quotes)."""
    if line.startswith("sudo "):
        argv, user = ["bash", "-c", line.removeprefix("sudo ")], None
    else:
        argv, user = ["bash", "-c", line], "alice"
    out = machine.exec(argv, user=user, timeout=300, **kw)  # type: ignore[arg-type]
    return out.stdout.decode()


@pytest.fixture
def fresh_host(machine: Machine) -> Iterator[Machine]:
    """No providers.toml and no provider key, as after the install; put back after."""
    clean = ("rm -f /etc/cairn/providers.toml /etc/credstore.encrypted/cairn-provider-* "
             "/etc/credstore/cairn-provider-*")
    machine.exec(["bash", "-c", clean])
    try:
        yield machine
    finally:
        machine.exec(["bash", "-c", clean])
        for unit in ("llama-server", "keyed-provider"):
            machine.exec(["systemctl", "stop", f"{unit}.service"], check=False)


def test_first_run_docs_local_server_commands_give_a_real_model_run(fresh_host: Machine) -> None:
    machine = fresh_host
    machine.exec(["mkdir", "-p", DEMO], user="alice")
    machine.exec(["tee", f"{DEMO}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    start_provider(machine, {"untooled": "ready", "turns": [
        call("bash", command="printf -- '- add a CHANGELOG entry\\n' >> CHANGELOG.md"),
        call("finish_work", output={"summary": "CHANGELOG entry added"}, handoff=""),
    ]}, None, port=LOCAL_PORT, unit="llama-server")
    add, test, launch = doc_commands("### A local OpenAI-compatible server")

    added = run_as_the_doc_says(machine, add)
    assert "provider local: qwen2.5-coder at http://127.0.0.1:8080/v1 (openai API)" in added
    assert "local is the default provider" in added
    tested = run_as_the_doc_says(machine, test)
    assert re.fullmatch(
        r"provider local \(qwen2\.5-coder at http://127\.0\.0\.1:8080/v1\) answered in "
        r"[0-9.]+ s, \d+ tokens: ready\n", tested), tested
    listed = machine.exec(["cairn", "provider", "list"], user="alice").stdout.decode()
    assert re.search(r"^\* local +openai +qwen2\.5-coder +http://127\.0\.0\.1:8080/v1 +none$",
                     listed, re.M), listed

    watched = run_as_the_doc_says(machine, launch)
    run_id = re.search(r"flow_[0-9a-f]{32}", watched)
    assert run_id is not None, watched
    data = wait_finished(machine, run_id.group())
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "CHANGELOG entry added"}
    changelog = machine.exec(["cat", f"{DEMO}/CHANGELOG.md"]).stdout
    assert changelog == b"# Changelog\n- add a CHANGELOG entry\n"


def test_a_keyed_provider_is_stored_encrypted_tested_and_removed(fresh_host: Machine) -> None:
    machine = fresh_host
    key = "sk-test-keyed-0123456789"
    start_provider(machine, {"untooled": "ready", "turns": []}, key,
                   port=KEYED_PORT, unit="keyed-provider")

    def add(name: str, secret: str) -> None:
        machine.exec(["cairn", "provider", "add", name, "--base-url",
                      f"http://127.0.0.1:{KEYED_PORT}/v1", "--model", "m-1",
                      "--key-from-stdin"], input=f"{secret}\n".encode())

    add("hosted", key)
    add("wrong", "sk-test-not-the-key")
    stored = machine.exec(["stat", "-c", "%a %U", "/etc/credstore.encrypted/cairn-provider-hosted"])
    assert stored.stdout.decode().split() == ["600", "root"]
    encrypted = machine.exec(["cat", "/etc/credstore.encrypted/cairn-provider-hosted"]).stdout
    assert key.encode() not in encrypted
    toml = machine.exec(["cat", "/etc/cairn/providers.toml"]).stdout.decode()
    assert key not in toml
    assert 'default = "hosted"' in toml  # the first one added

    ok = machine.exec(["cairn", "provider", "test", "hosted"])
    assert ok.stdout.decode().endswith(": ready\n"), ok.stdout
    bad = machine.exec(["cairn", "provider", "test", "wrong"], check=False)
    assert bad.returncode == 1
    assert bad.stdout.decode() == (
        f"provider wrong (m-1 at http://127.0.0.1:{KEYED_PORT}/v1) answered 401: bad key\n")
    listed = machine.exec(["cairn", "provider", "list"]).stdout.decode()
    assert re.search(r"^\* hosted .* encrypted$", listed, re.M), listed
    doctor = machine.exec(["cairn", "doctor", "--providers"], check=False)
    assert doctor.returncode == 1
    lines = doctor.stdout.decode().splitlines()
    assert any(re.fullmatch(r"ok    answer of hosted: provider hosted .* answered in .*: ready",
                            line) for line in lines), lines
    assert (f"fail  answer of wrong: provider wrong (m-1 at http://127.0.0.1:{KEYED_PORT}/v1) "
            "answered 401: bad key; fix: see cairn-providers.toml(5); then sudo cairn provider "
            "test wrong") in lines
    as_alice = machine.exec(["cairn", "doctor", "--providers"], user="alice", check=False)
    assert ("warn  provider answers: not asked: only root may use the providers' keys; fix: "
            "sudo cairn doctor --providers") in as_alice.stdout.decode().splitlines()

    # Not root: refused in one line, nothing changed.
    denied = machine.exec(["cairn", "provider", "test", "hosted"], user="alice", check=False)
    assert denied.returncode == 2
    assert denied.stderr.decode().startswith("cairn: provider test needs root")
    denied = machine.exec(shlex.split("cairn provider rm hosted --yes"), user="alice",
                          check=False)
    assert denied.returncode == 2

    # a script must say --yes; --dry-run says what would go and keeps it
    unasked = machine.exec(["cairn", "provider", "rm", "hosted"], check=False)
    assert unasked.returncode == 2 and b"no terminal to ask" in unasked.stderr
    would = machine.exec(["cairn", "provider", "rm", "hosted", "--dry-run"]).stdout.decode()
    assert would == ("would remove provider hosted from /etc/cairn/providers.toml and its key "
                     "cairn-provider-hosted; nothing was changed (--dry-run)\n")
    kept = machine.exec(["cat", "/etc/cairn/providers.toml"]).stdout.decode()
    assert "[providers.hosted]" in kept
    machine.exec(["cairn", "provider", "rm", "hosted", "--yes"])
    gone = machine.exec(["test", "-e", "/etc/credstore.encrypted/cairn-provider-hosted"],
                        check=False)
    assert gone.returncode == 1
    toml = machine.exec(["cat", "/etc/cairn/providers.toml"]).stdout.decode()
    assert "hosted" not in toml
    assert "[providers.wrong]" in toml
    missing = machine.exec(["cairn", "provider", "test", "hosted"], check=False)
    assert missing.returncode == 1
    assert "model provider 'hosted' is not configured" in missing.stdout.decode()


PROBE = "/usr/lib/python3/dist-packages/cairn/coordinator/probe.py"
# What a process of user cairn (the probe's unit) could print to the root command that
# started it: terminal controls, then far more than one line.
HOSTILE_PROBES = {
    "controls": "import sys\nprint('\\x1b]0;owned\\x07\\x1b[2J answered')\n",
    "flood": "import sys\nwhile True:\n    sys.stdout.write('\\x1b[2J' + 'A' * 65536)\n",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_PROBES))
def test_root_reads_at_most_one_escaped_line_of_what_the_probe_prints(
    fresh_host: Machine, kind: str
) -> None:
    machine = fresh_host
    machine.exec(shlex.split("cairn provider add quiet --base-url http://127.0.0.1:9/v1 "
                             "--model m --no-key"))
    real = machine.exec(["cat", PROBE]).stdout
    machine.exec(["tee", PROBE], input=HOSTILE_PROBES[kind].encode())
    try:
        shown = machine.exec(["cairn", "provider", "test", "quiet"], check=False, timeout=120)
    finally:
        machine.exec(["tee", PROBE], input=real)
    out = shown.stdout
    assert b"\x1b" not in out and b"\x07" not in out
    assert out.count(b"\n") == 1, out[:300]
    if kind == "controls":
        assert shown.returncode == 0
        assert out == b"\\x1b]0;owned\\x07\\x1b[2J answered\n"
    else:
        assert shown.returncode == 1
        assert out.startswith(b"provider quiet: the test printed more than 65536 bytes")
