"""Whatever an agent writes stays harmless on the person's terminal (issue 28), tried as an
attacker would in a booted machine with the package installed.

A hostile scripted agent puts terminal control sequences (an OSC title, OSC 52 that writes
the clipboard, a screen clear, a C1 CSI, a newline) in everything it controls: a file
name, its summary and handoff, a note, its log lines. The workflow builds a question and
an approval prompt from what it returned, as workflows do. Every human command a person
runs on that run is read piped and under a pty: no raw control byte comes out but line
ends (tabs in diff and log bodies, and the progress bar cairn draws itself), while
``--json`` keeps the exact strings. ``cairn mcp``'s lines are checked too.

One machine, one run: the waits (question, approval) are where inbox, watch and the MCP
server are read. A second test runs a scheduled user definition that fails with its
agent's words, for ``cairn schedule inbox``. The listings a run cannot cheaply reach are
covered on recorded replies in tests/unit/test_cli_hostile_text.py.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

# What the agent writes wherever it can: OSC title, OSC 52 (clipboard), clear screen, a
# C1 CSI, DEL, a newline.
EVIL = "\x1b]0;pwned\x07\x1b]52;c;aGk=\x07\x1b[2J\u009b31m\x7f\nX"
NAME = f"evil{EVIL}name.txt"
SHOWN = "\\x1b]0;pwned\\x07"  # how the OSC title reads once escaped

WORKFLOW = '''"""An agent's summary becomes a question and another agent's prompt."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


write = agent(profile="test:evil", access="write", output=Step)
fetch = agent(profile="test:fetch", access="write", network="host", output=Step)


@workflow(description="Hostile text everywhere.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    first = await flow.agent(write, prompt=args.goal)
    await flow.ask(f"Is this right? {first.output.summary} / {first.handoff}")
    second = await flow.agent(fetch, prompt=f"fetch {first.output.summary}")
    step: Step = second.output
    return step
'''

# Installed as alice's user:failing and scheduled: it fails quoting its agent.
FAILING = WORKFLOW.split("fetch = agent(", maxsplit=1)[0] + '''
@workflow(description="Fails in its agent's words.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    first = await flow.agent(write, prompt=args.goal)
    raise ValueError(f"the agent said {first.output.summary}")
'''

# Runs in the agent unit: log lines and a note carrying the sequences.
LOUD = r"""
import json, socket, sys
evil = sys.argv[1]
print("stdout " + evil, flush=True)
print("stderr " + evil, file=sys.stderr, flush=True)
print("<4>warning " + evil, flush=True)  # journald's level prefix: a line in colour
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/run/cairn/agent/agent.sock")
f = s.makefile("rwb")
f.write(json.dumps({"type": "note", "text": "note " + evil}).encode() + b"\n")
f.flush()
f.readline()
"""

SCRIPTS = {
    "evil": {
        "steps": [
            {"action": "write", "path": NAME, "content": f"line {EVIL}\n\tindented\n"},
            {"action": "run", "argv": ["/usr/bin/python3", "-I", "-c", LOUD, EVIL]},
        ],
        "output": {"summary": f"summary {EVIL}"},
        "handoff": f"handoff {EVIL}",
    },
    "fetch": {"steps": [{"action": "write", "path": "fetched.txt", "content": "ok\n"}],
              "output": {"summary": "fetched"}},
}


# What cairn itself writes on a terminal: the progress bar's redraw and the colours of
# cairn logs (cairn/cli/journalview.py). Anything an agent wrote arrives escaped.
CAIRNS_OWN = re.compile(rb"\r\x1b\[K|\x1b\[(?:1;31|1;33|1|38;5;245|0)m")


def raw_controls(out: bytes, *, tabs: bool) -> list[bytes]:
    """Control bytes in a command's output (UTF-8 C1 controls included) but line ends,
    tabs where allowed, and cairn's own sequences (:data:`CAIRNS_OWN`)."""
    text = CAIRNS_OWN.sub(b"", out).decode("utf-8", "backslashreplace")
    allowed = "\n\t" if tabs else "\n"
    return [c.encode("utf-8", "backslashreplace") for c in text
            if (ord(c) < 0x20 and c not in allowed) or 0x7F <= ord(c) < 0xA0]


def on_pty(machine: Machine, argv: list[str], timeout: float = 120) -> bytes:
    """What ``argv`` (run as alice) prints on a terminal: stdout and stderr a pty in raw
    mode (no newline translation), read until the command exits."""
    leader, follower = pty.openpty()
    tty.setraw(follower)
    proc = subprocess.Popen(machine.command(argv, user="alice"), stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: every holder of the follower closed it
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif proc.poll() is not None:
                break
        else:
            pytest.fail(f"{argv} did not finish on a pty within {timeout}s")
    finally:
        proc.wait(timeout=30)
        os.close(leader)
    return b"".join(chunks)


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/home/alice/hostile.py"], user="alice", input=WORKFLOW.encode())
        for name, script in SCRIPTS.items():
            machine.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                         input=json.dumps(script).encode())
        machine.exec(["mkdir", "-p", "/etc/cairn"])
        machine.exec(["tee", "/etc/cairn/policy.toml"],
                     input=b'[capabilities]\n"network:host" = "require_approval"\n')
        yield machine


def cairn(machine: Machine, *argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return machine.exec(["cairn", *argv], user="alice", check=check, timeout=120)


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    return dict(json.loads(cairn(machine, "show", run_id, "--json").stdout))


def wait_state(machine: Machine, run_id: str, states: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while True:
        data = show(machine, run_id)
        if data["run"]["state"] in states:
            return data
        if time.monotonic() > deadline:
            pytest.fail(f"{run_id} stuck at {data['run']['state']}:\n"
                        + machine.journal(run_id=run_id)[-4000:])
        time.sleep(0.5)


def inbox_item(machine: Machine, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        items = [i for i in json.loads(cairn(machine, "inbox", "--json").stdout)
                 if i["run_id"] == run_id]
        if items:
            return dict(items[0])
        if time.monotonic() > deadline:
            pytest.fail(f"nothing of {run_id} in the inbox")
        time.sleep(0.5)


def check_both_ways(machine: Machine, argv: list[str], *, tabs: bool = False,
                    expect_shown: bool = True, term: str | None = None) -> dict[str, bytes]:
    """Run ``cairn argv`` piped and on a pty (with ``TERM=term`` if given); neither lets
    a control byte through."""
    piped = machine.exec(["cairn", *argv], user="alice", check=False, timeout=120)
    tty_env = ["env", f"TERM={term}"] if term else []
    outputs = {"piped": piped.stdout + piped.stderr,
               "pty": on_pty(machine, [*tty_env, "cairn", *argv])}
    for how, out in outputs.items():
        assert raw_controls(out, tabs=tabs) == [], (argv, how, out[-3000:])
        if expect_shown:
            assert SHOWN.encode() in out, (argv, how, out[-3000:])
    return outputs


def watch_briefly(machine: Machine, run_id: str) -> None:
    """``cairn watch`` of a waiting run (it never ends by itself): read for a few seconds."""
    argv = ["timeout", "-s", "INT", "6", "cairn", "watch", run_id]
    piped = machine.exec(argv, user="alice", check=False, timeout=60)
    for how, out in (("piped", piped.stdout + piped.stderr), ("pty", on_pty(machine, argv))):
        assert raw_controls(out, tabs=False) == [], (how, out[-3000:])
        assert b"note root-1: note " + SHOWN.encode() in out, (how, out[-3000:])
        assert b"asks: Is this right? summary " + SHOWN.encode() in out or \
            b"needs approval" in out, (how, out[-3000:])


def mcp_lines(machine: Machine, run_id: str) -> list[dict[str, Any]]:
    calls = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "cairn_show", "arguments": {"run": run_id}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "cairn_inbox", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "cairn_watch", "arguments": {"run": run_id, "timeout": 1},
                    "_meta": {"progressToken": "w"}}},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
         "params": {"name": "cairn_answer",
                    "arguments": {"run": run_id, "challenge": "sha256:" + "0" * 64,
                                  "answer": EVIL}}},
    ]
    stdin = "".join(json.dumps(c) + "\n" for c in calls).encode()
    out = machine.exec(["cairn", "mcp"], user="alice", input=stdin, timeout=120).stdout
    # every line is JSON in ASCII: no byte a terminal would act on
    assert all(b == 0x0A or 0x20 <= b < 0x7F for b in out), out[-2000:]
    return [json.loads(line) for line in out.splitlines()]


def test_a_hostile_agents_text_never_reaches_the_terminal_raw(booted: Machine) -> None:
    machine = booted
    project = "/home/alice/hostile-project"
    machine.exec(["mkdir", "-p", project], user="alice")
    review = cairn(machine, "workflow", "review", "/home/alice/hostile.py").stdout.decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    run_id = cairn(
        machine, "launch", "/home/alice/hostile.py", "--confirm", review_hash, "--project",
        project, "--args", json.dumps({"goal": "go"}),
        "--scripted", "test:evil=/home/alice/evil.json",
        "--scripted", "test:fetch=/home/alice/fetch.json",
    ).stdout.decode().strip().splitlines()[-1]

    # -- waiting on a question built from the agent's summary and handoff
    wait_state(machine, run_id, ("waiting",))
    question = inbox_item(machine, run_id)
    assert question["question"] == f"Is this right? summary {EVIL} / handoff {EVIL}"  # exact
    check_both_ways(machine, ["inbox"])
    check_both_ways(machine, ["show", run_id])
    watch_briefly(machine, run_id)
    replies = mcp_lines(machine, run_id)
    texts = [c["text"] for r in replies for c in (r.get("result") or {}).get("content", [])]
    texts += [r["params"]["message"] for r in replies if r.get("method")]
    assert any("pwned" in t for t in texts), texts
    for text in texts:  # what a harness may print as it is
        assert raw_controls(text.encode(), tabs=False) == [], text
    inbox_reply = next(r for r in replies if r.get("id") == 3)
    asked = inbox_reply["result"]["structuredContent"]["items"][0]["question"]
    assert asked == question["question"]  # the data keeps the exact string

    # an error quoting what it was given is one escaped line
    wrong = cairn(machine, "show", f"flow_{EVIL}", check=False)
    assert wrong.returncode == 2 and len(wrong.stderr.splitlines()) == 2, wrong.stderr
    assert raw_controls(wrong.stdout + wrong.stderr, tabs=False) == [], wrong.stderr

    cairn(machine, "answer", run_id, "--challenge", question["challenge"], "yes")

    # -- waiting on an approval whose prompt is the agent's summary
    deadline = time.monotonic() + 120
    while (approval := inbox_item(machine, run_id))["kind"] != "approval":
        assert time.monotonic() < deadline, approval
        time.sleep(0.5)
    assert approval["prepared"]["prompt"] == f"fetch summary {EVIL}"
    check_both_ways(machine, ["inbox"])
    watch_briefly(machine, run_id)
    cairn(machine, "approve", run_id, approval["request_id"], "--fingerprint",
          approval["fingerprint"])

    data = wait_state(machine, run_id, ("succeeded", "failed"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    applied = data["settlement"]["apply"]["applied"]
    assert NAME in applied, applied  # the exact name, in --json
    shown_name = b"evil\\x1b]0;pwned\\x07\\x1b]52;c;aGk=\\x07\\x1b[2J\\x9b31m\\x7f\\nXname.txt"
    # a patch names it as git does, so 'git apply' reads it back
    label = '"b/evil\\033]0;pwned\\a\\033]52;c;aGk=\\a\\033[2J\\302\\23331m\\177\\nXname.txt"'

    # -- the finished run, through every command a person reads it with
    for argv, tabs in (
        (["show", run_id], False),
        (["diff", run_id], True),
        (["watch", run_id], False),
        (["list"], False),
        (["checkpoints", run_id], False),
    ):
        outputs = check_both_ways(machine, argv, tabs=tabs,
                                  expect_shown=argv[0] not in ("list", "checkpoints"))
        wanted = shown_name if argv[0] == "show" else f"+++ {label}\n".encode()
        if argv[0] in ("show", "diff"):
            assert all(wanted in out for out in outputs.values()), (argv, outputs)
    diff = check_both_ways(machine, ["diff", run_id], tabs=True)
    assert all(b"+\tindented\n" in out for out in diff.values())  # a tab stays a tab
    logs = check_both_ways(machine, ["logs", run_id], tabs=True, expect_shown=False,
                           term="xterm")
    # drawn by cairn, in colour: the agent's warning, its text escaped inside the colour
    assert b"\x1b[1;33mwarning " + SHOWN.encode() in logs["pty"], logs["pty"][-3000:]
    check_both_ways(machine, ["doctor", run_id], expect_shown=False)
    check_both_ways(machine, ["doctor"], expect_shown=False)
    # a patch for a terminal is escaped too; piped, it is the exact patch for 'git apply'
    patch_on_pty = on_pty(machine, ["cairn", "diff", run_id, "--patch"])
    assert raw_controls(patch_on_pty, tabs=True) == [] and label.encode() in patch_on_pty
    piped_patch = cairn(machine, "diff", run_id, "--patch").stdout
    added = "+line " + EVIL.replace("\n", "\n+") + "\n"  # the content, line by line
    assert added.encode() in piped_patch and label.encode() in piped_patch
    # --json keeps every string exactly
    assert added in json.loads(cairn(machine, "diff", run_id, "--json").stdout)["diff"]
    notes = [e for e in data["events"] if e["event"] == "agent-note"]
    assert any(e["data"]["text"] == f"note {EVIL}" for e in notes), notes


def test_a_scheduled_run_failing_in_its_agents_words_reaches_schedule_inbox_escaped(
    booted: Machine,
) -> None:
    machine = booted
    machine.enable_user_manager("alice")
    project = "/home/alice/scheduled-project"
    machine.exec(["mkdir", "-p", project, "/home/alice/wf"], user="alice")
    machine.exec(["tee", "/home/alice/wf/failing.py"], user="alice", input=FAILING.encode())
    review = cairn(machine, "workflow", "review", "/home/alice/wf/failing.py").stdout.decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    cairn(machine, "workflow", "install", "/home/alice/wf/failing.py", "--confirm", review_hash)
    created = json.loads(cairn(
        machine, "schedule", "create", "hostile-nightly", "user:failing", "--project", project,
        "--args", json.dumps({"goal": "go"}), "--calendar", "2099-01-01 03:00:00",
        "--timezone", "UTC", "--catch-up", "none", "--max-runs", "3",
        "--valid-until", "2099-12-31T00:00:00Z",
        "--scripted", "test:evil=/home/alice/evil.json", "--json",
    ).stdout)
    cairn(machine, "schedule", "confirm", created["action"], created["challenge"])
    schedule_id = created["schedule_id"]
    cairn(machine, "schedule", "resume", schedule_id)
    run_id = cairn(machine, "schedule", "run-now", schedule_id).stdout.decode().split()[-1]

    data = wait_state(machine, run_id, ("failed", "succeeded"))
    said = f"workflow raised ValueError: the agent said summary {EVIL}"
    assert data["run"]["state"] == "failed" and said in data["run"]["error"], data["run"]
    deadline = time.monotonic() + 60
    while not (items := json.loads(cairn(machine, "schedule", "inbox", "--json").stdout)):
        assert time.monotonic() < deadline, "the failed scheduled run never reached the inbox"
        time.sleep(1)
    assert items[0]["kind"] == "run-failed" and said in items[0]["message"]  # exact in --json
    check_both_ways(machine, ["schedule", "inbox"])
    check_both_ways(machine, ["show", run_id])
