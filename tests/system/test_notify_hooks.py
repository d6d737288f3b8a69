"""Progress and notifications in a booted machine (issue 15): ``cairn watch`` follows the
import of a 100,000-file project at least once a second, and a hook in alice's
``~/.config/cairn/notify.d`` is run by her own user manager, as alice, with ``waiting``
for a run that asks (and ``succeeded`` once she answered), while an unsafe hook is not;
the hook is outside the notifier's sandbox: it writes under ``~/.local/state`` and talks to
a server on loopback, as a user's notification script does.

Needs a package that installs units/user/ (cairn-notify.path enabled for every user
manager).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

ASK = '''"""Ask a person, then paint with the answer."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Choice(Model):
    colour: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


paint = agent(profile="test:paint", access="write", output=Step)


@workflow(description="Ask, then paint.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    choice = await flow.ask(f"Which colour for the {args.goal}?", schema=Choice)
    result = await flow.agent(paint, prompt=f"paint the {args.goal} {choice.colour}")
    step: Step = result.output
    return step
'''
PAINT = {"steps": [{"action": "write", "path": "colour.txt", "content": "{prompt}\n"}],
         "output": {"summary": "did: {prompt}"}}
WRITE = {"steps": [{"action": "write", "path": "done.txt", "content": "{prompt}\n"}],
         "output": {"summary": "{prompt}"}, "handoff": "done"}
HOOKS = "/home/alice/.config/cairn/notify.d"
# Records the event, who ran it and under which unit; then what a notification script
# does, outside the notifier's sandbox: state in ~/.local/state, a message over loopback.
RECORD = """#!/bin/sh
set -eu
out=/home/alice/notified-$CAIRN_NOTIFY_EVENT-$CAIRN_RUN
cat > "$out.json"
{ id -u; cat /proc/self/cgroup; } > "$out.who"
mkdir -p /home/alice/.local/state/hooks
echo "$CAIRN_NOTIFY_EVENT $CAIRN_RUN" >> /home/alice/.local/state/hooks/seen
python3 -c 'import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10).sendall(sys.argv[2].encode())
' "$(cat /home/alice/listener-port)" "$CAIRN_NOTIFY_EVENT $CAIRN_RUN"
"""
# A server on loopback (alice's, outside her user manager) that keeps what it is sent.
LISTENER = """import os, socket
server = socket.create_server(("127.0.0.1", 0))
with open("/home/alice/listener-port.new", "w") as f:
    f.write(str(server.getsockname()[1]))
os.rename("/home/alice/listener-port.new", "/home/alice/listener-port")
while True:
    conn, _ = server.accept()
    with conn, open("/home/alice/listener-got", "ab") as got:
        got.write(conn.recv(4096) + b"\\n")
"""
UNSAFE = """#!/bin/sh
touch /home/alice/unsafe-hook-ran
"""
ALICE_UID = 1001


@pytest.fixture(scope="module")
def machine(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as booted:
        booted.enable_user_manager("alice")
        booted.exec(["tee", "/home/alice/ask.py"], user="alice", input=ASK.encode())
        for name, script in (("paint", PAINT), ("write", WRITE)):
            booted.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                        input=json.dumps(script).encode())
        yield booted


def cairn(machine: Machine, *argv: str, check: bool = True) -> str:
    return machine.exec(["cairn", *argv], user="alice", check=check, timeout=120).stdout.decode()


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    return dict(json.loads(cairn(machine, "show", run_id, "--json")))


def wait_until(
    what: str, probe: Callable[[], Any], timeout: float = 180,
    explain: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}" + (f"\n{explain()}" if explain else ""))
        time.sleep(0.5)


def notifier_state(machine: Machine, run_id: str) -> str:
    """What the run and alice's notifier did, for a failure message."""
    parts = [cairn(machine, "show", run_id, check=False)]
    for argv in (["journalctl", "--user", "--no-pager", "-n", "60", "-u", "cairn-notify*"],
                 ["systemctl", "--user", "--no-pager", "list-units", "--all", "cairn-notify*"]):
        parts.append(machine.exec(argv, user="alice", check=False).stdout.decode())
    return "\n".join(parts)


def read(machine: Machine, path: str) -> str | None:
    out = machine.exec(["cat", path], check=False)
    return out.stdout.decode() if out.returncode == 0 else None


def test_a_hook_receives_waiting_for_an_ask_as_the_user(machine: Machine) -> None:
    machine.exec(["systemd-run", "--unit=test-listener", "--uid=alice", "python3", "-c", LISTENER])
    wait_until("the loopback listener", lambda: read(machine, "/home/alice/listener-port"))
    machine.exec(["mkdir", "-p", HOOKS], user="alice")
    machine.exec(["tee", f"{HOOKS}/record"], user="alice", input=RECORD.encode())
    machine.exec(["chmod", "0755", f"{HOOKS}/record"], user="alice")
    machine.exec(["tee", f"{HOOKS}/unsafe"], user="alice", input=UNSAFE.encode())
    machine.exec(["chmod", "0777", f"{HOOKS}/unsafe"], user="alice")
    listed = cairn(machine, "notify", "list")
    assert f"runs     {HOOKS}/record" in listed
    assert f"refused  {HOOKS}/unsafe: writable by its group or others" in listed
    # the path unit starts the notifier once notify.d holds a hook; it takes its cursor
    wait_until("cairn-notify.service", lambda: machine.exec(
        ["systemctl", "--user", "is-active", "cairn-notify.service"], user="alice", check=False
    ).stdout.decode().strip() == "active")
    wait_until("the notifier's cursor", lambda: read(
        machine, "/home/alice/.local/state/cairn/notify-cursor"))

    review = cairn(machine, "workflow", "review", "/home/alice/ask.py")
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = f"/home/alice/p-ask-{time.monotonic_ns()}"
    machine.exec(["mkdir", "-p", project], user="alice")
    run_id = cairn(machine, "launch", "/home/alice/ask.py", "--confirm", review_hash,
                   "--project", project, "--args", json.dumps({"goal": "shed"}),
                   "--scripted", "test:paint=/home/alice/paint.json").strip().splitlines()[-1]

    raw = wait_until("the waiting notification",
                     lambda: read(machine, f"/home/alice/notified-waiting-{run_id}.json"),
                     explain=lambda: notifier_state(machine, run_id))
    event = json.loads(raw)
    assert event["version"] == 1 and event["event"] == "waiting"
    # "its state when notified" (cairn-notify(5)): the question is opened while the run
    # runs, and the run is marked waiting as its coordinator exits just after, so a
    # notifier that asks at once may see either
    assert event["run_id"] == run_id and event["state"] in ("running", "waiting")
    (item,) = event["waiting"]
    assert item["kind"] == "question" and item["question"] == "Which colour for the shed?"
    assert item["command"].startswith(f"cairn answer {run_id} --challenge sha256:")
    who = read(machine, f"/home/alice/notified-waiting-{run_id}.who")
    assert who is not None
    uid, cgroup = who.split("\n", 1)
    assert int(uid) == ALICE_UID  # never root, never another user
    assert f"/user@{ALICE_UID}.service/" in cgroup and "cairn-notify-" in cgroup

    # the hook kept state and reached the loopback server
    wait_until("the hook's state", lambda: f"waiting {run_id}" in (
        read(machine, "/home/alice/.local/state/hooks/seen") or ""))
    wait_until("the hook's message over loopback", lambda: f"waiting {run_id}" in (
        read(machine, "/home/alice/listener-got") or ""))

    challenge = item["command"].split("--challenge ")[1].split()[0]
    cairn(machine, "answer", run_id, "--challenge", challenge, '{"colour": "red"}')
    done = wait_until("the succeeded notification",
                      lambda: read(machine, f"/home/alice/notified-succeeded-{run_id}.json"),
                      explain=lambda: notifier_state(machine, run_id))
    assert json.loads(done)["event"] == "succeeded"
    assert read(machine, "/home/alice/unsafe-hook-ran") is None


def test_watch_prints_import_progress_at_least_once_a_second(machine: Machine) -> None:
    """The project is under /home (not the pool's filesystem), so it is imported."""
    project = "/home/alice/big"
    machine.exec(["python3", "-c", (
        "import os\n"
        "for d in range(100):\n"
        f"    os.makedirs(f'{project}/d{{d}}')\n"
        "    for f in range(1000):\n"
        f"        open(f'{project}/d{{d}}/f{{f}}', 'w').write('x' * (f % 64))\n"
    )], user="alice", timeout=600)
    run_id = cairn(machine, "launch", "builtin:implement", "--project", project,
                   "--args", json.dumps({"objective": "big"}),
                   "--scripted", "builtin:implementer=/home/alice/write.json"
                   ).strip().splitlines()[-1]
    # every line of `cairn watch` (piped: plain lines) stamped when it arrived
    stamped = machine.exec(["bash", "-c", (
        f"cairn watch {run_id} | while IFS= read -r line; do "
        "printf '%s %s\\n' \"$(date +%s.%N)\" \"$line\"; done"
    )], user="alice", check=False, timeout=900).stdout.decode()
    progress = [
        (float(line.split(" ", 1)[0]), line) for line in stamped.splitlines()
        if " progress import " in line
    ]
    assert len(progress) >= 3, stamped[-4000:]
    times = [at for at, _ in progress]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) <= 1.5, gaps
    assert statistics.median(gaps) <= 1.1, gaps
    assert "100100/100100 entries (100%)" in progress[-1][1]
    assert "\r" not in stamped  # no bar when piped
    data = show(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["progress"]["import"]["done"] == data["progress"]["import"]["total"] == 100100
    assert "progress: import 100100/100100 entries (100%)" in cairn(machine, "show", run_id)
