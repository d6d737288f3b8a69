"""Whatever an agent writes stays harmless (issue 28), tried in a booted machine as a
hostile agent would: a result of 200 MB, nested 200,000 levels, not UTF-8, or holding a
lone surrogate fails its operation once, as ``result-invalid: …`` in ``cairn show``, with
one attempt's files left; a process the agent leaves behind holding its stdout does not
hold the operation. Beside test_escapes.py, with one machine for all of its cases."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn, finished

from cairn.resultjson import DEPTH_LIMIT, RESULT_LIMIT

PROFILE = "/etc/cairn/profiles.d/builtin-implementer.toml"

# Each writes /outputs/result.json as a command agent would; the scripted agent's own
# output is then not used. argv[1] of the step is the launch's objective (unused).
WRITERS = {
    "size": (
        "f = open('/outputs/result.json', 'w')\n"
        "f.write('{\"output\": {\"summary\": \"')\n"
        "for _ in range(200): f.write('x' * (1 << 20))\n"
        "f.write('\"}}')\n"
    ),
    "depth": "open('/outputs/result.json', 'w').write('[' * 200000 + ']' * 200000)\n",
    "utf8": "open('/outputs/result.json', 'wb').write(b'{\"output\": {\"summary\": \"\\xff\"}}')\n",
    "surrogate": (
        "open('/outputs/result.json', 'w').write('{\"output\": {\"summary\": \"\\\\ud800\"}}')\n"
    ),
}
REASONS = {
    "size": f"size: /outputs/result.json is {(200 << 20) + 27} bytes; a result may have at "
    f"most {RESULT_LIMIT}",
    "depth": f"depth: /outputs/result.json nests deeper than {DEPTH_LIMIT} levels",
    "utf8": "encoding: /outputs/result.json is not UTF-8 (byte 0xff at offset 24)",
    "surrogate": "encoding: /outputs/result.json holds a lone surrogate \\ud800, which is "
    "not Unicode text",
}

# A command agent that leaves a child behind holding its stdout, its stderr and a file in
# W open, then answers and exits.
BACKGROUND = """\
kind = "command"
argv = ["/bin/sh", "-c", '''
exec 3>held.txt
echo held >&3
sleep 613 &
echo '{"output": {"summary": "answered"}, "handoff": "left a child"}'
''']
"""
# A command agent that sends finish_work itself, then runs on.
SELF_FINISH = """\
kind = "command"
argv = ["/usr/bin/python3", "-c", '''
import json, socket, time
s = socket.socket(socket.AF_UNIX)
s.connect("/run/cairn/agent/agent.sock")
finish = {"type": "finish_work", "output": {"summary": "sent by the agent"}}
s.sendall(json.dumps(finish).encode() + b"\\n")
s.makefile("rb").readline()
time.sleep(614)
''']
"""
# A command agent that prints the same invalid result every time.
REPEATED = """\
kind = "command"
argv = ["/usr/bin/python3", "-c", "print('[' * 200000)"]
"""


# A command agent whose CLI refuses its arguments (exit 2, as codex did with a removed
# flag), and one that fails for a reason another attempt may not meet (exit 1); each says
# why on stderr, with a control sequence in its words.
USAGE = """\
kind = "command"
argv = ["/bin/sh", "-c", '''
echo starting >&2
printf 'error: unexpected argument \\033[31m--full-auto\\033[0m found\\n' >&2
exit 2
''']
"""
TRANSIENT = """\
kind = "command"
argv = ["/bin/sh", "-c", "echo 'upstream said 503' >&2; exit 1"]
"""
# The CLI's line as the journal keeps it: its control characters escaped.
USAGE_ERROR = "exited 2: error: unexpected argument \\x1b[31m--full-auto\\x1b[0m found"

@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.enable_user_manager("alice")
        yield machine


def project(machine: Machine) -> str:
    path = f"/home/alice/p-{secrets.token_hex(4)}"
    machine.exec(["mkdir", "-p", path], user="alice")
    machine.exec(["tee", f"{path}/CHANGELOG.md"], user="alice", input=b"# Changelog\n")
    return path


def start(machine: Machine, path: str, scripted: dict[str, Any] | None = None) -> str:
    """Launch builtin:implement in ``path`` (a scripted agent if given, else the host's
    profile); the run's ID."""
    extra: list[str] = []
    if scripted is not None:
        script = f"/home/alice/agent-{secrets.token_hex(4)}.json"
        machine.exec(["tee", script], user="alice", input=json.dumps(scripted).encode())
        extra = ["--scripted", f"builtin:implementer={script}"]
    out = cairn(machine, "launch", "builtin:implement", "--project", path,
                "--args", json.dumps({"objective": "answer"}), *extra)
    return out.strip().splitlines()[-1]


def wait_all(machine: Machine, run_ids: list[str], timeout: float) -> dict[str, Any]:
    """Each run's ``cairn show --json`` once all ended, with ``seconds`` since the call."""
    started = time.monotonic()
    done: dict[str, Any] = {}
    while len(done) < len(run_ids):
        for run_id in run_ids:
            if run_id not in done:
                data = json.loads(cairn(machine, "show", run_id, "--json"))
                if finished(data):
                    done[run_id] = {**data, "seconds": time.monotonic() - started}
        if time.monotonic() - started > timeout:
            pending = [r for r in run_ids if r not in done]
            logs = "\n".join(machine.journal(run_id=r)[-3000:] for r in pending)
            pytest.fail(f"{pending} did not end within {timeout}s:\n{logs}")
        time.sleep(1)
    return done


def op_dir(run_id: str) -> str:
    return f"/var/lib/cairn/runs/{run_id}/ops/root-1"


def entries(machine: Machine, path: str) -> list[str]:
    return sorted(machine.exec(["ls", "-A", path]).stdout.decode().split())


@pytest.fixture(scope="module")
def hostile_runs(booted: Machine) -> dict[str, dict[str, Any]]:
    """The scripted cases launched at once (the machine runs them side by side), the
    command-profile cases one after another: root runs a command profile only as its file
    in /etc/cairn still says, so the file changes only between those runs."""
    runs: dict[str, str] = {}
    for case, code in WRITERS.items():
        steps = [{"action": "run", "argv": ["/usr/bin/python3", "-I", "-c", code, "{prompt}"]}]
        runs[case] = start(booted, project(booted),
                           {"steps": steps, "output": {"summary": "unused"}, "handoff": ""})
    booted.exec(["install", "-d", "/etc/cairn/profiles.d"])
    background_project = project(booted)
    ended: dict[str, dict[str, Any]] = {}
    for case, profile, where in (("repeated", REPEATED, project(booted)),
                                 ("background", BACKGROUND, background_project),
                                 ("self-finish", SELF_FINISH, project(booted)),
                                 ("usage", USAGE, project(booted)),
                                 ("transient", TRANSIENT, project(booted))):
        booted.exec(["tee", PROFILE], input=profile.encode())
        runs[case] = start(booted, where)
        ended.update(wait_all(booted, [runs[case]], timeout=400))
    ended.update(wait_all(booted, [runs[case] for case in WRITERS], timeout=400))
    out = {case: ended[run_id] for case, run_id in runs.items()}
    out["background"]["project"] = background_project
    return out


@pytest.mark.parametrize("case", list(WRITERS))
def test_an_invalid_result_fails_once_with_its_reason(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]], case: str
) -> None:
    data = hostile_runs[case]
    run_id = data["run"]["run_id"]
    (op,) = data["operations"]
    assert data["run"]["state"] == "failed", data["run"]["error"]
    assert op["state"] == "failed" and op["attempt"] == 1, op
    assert op["error"] == f"result-invalid: {REASONS[case]}"
    assert f"result-invalid: {REASONS[case]}" in data["run"]["error"]
    shown = cairn(booted, "show", run_id)
    assert "error: " in shown and f"result-invalid: {REASONS[case]}" in shown, shown
    assert "op-retry" not in {e["event"] for e in data["events"]}
    # one attempt's files, and no copy of the result beside it
    assert [e for e in entries(booted, op_dir(run_id)) if e.startswith("outputs.")] == \
        ["outputs.1"]
    outputs = entries(booted, f"{op_dir(run_id)}/outputs.1")
    assert "finish.json" not in outputs and "result-invalid.json" in outputs
    logs = cairn(booted, "logs", run_id)
    assert "Traceback" not in logs and f"result-invalid: {REASONS[case]}" in logs


def test_a_200_mb_result_leaves_one_copy_in_the_state_directory(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]]
) -> None:
    run_id = hostile_runs["size"]["run"]["run_id"]
    used = int(booted.exec(["du", "-sb", f"/var/lib/cairn/runs/{run_id}"]).stdout.split()[0])
    print(f"200 MB result: run state directory {used} bytes")
    assert (200 << 20) < used < (210 << 20)


def test_the_same_bytes_again_end_the_retries(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]]
) -> None:
    """A command agent may answer differently when run again, so it gets a second
    attempt; printing the same invalid result again ends the operation there."""
    data = hostile_runs["repeated"]
    run_id = data["run"]["run_id"]
    (op,) = data["operations"]
    assert op["state"] == "failed" and op["attempt"] == 2, op
    reason = f"depth: the last line of stdout nests deeper than {DEPTH_LIMIT} levels"
    assert op["error"] == f"result-invalid: {reason}"
    assert "the same result as the attempt before" in data["run"]["error"]
    assert [e for e in entries(booted, op_dir(run_id)) if e.startswith("outputs.")] == \
        ["outputs.2"]


def test_a_child_left_holding_stdout_does_not_hold_the_operation(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]]
) -> None:
    data = hostile_runs["background"]
    run_id = data["run"]["run_id"]
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    (op,) = data["operations"]
    assert op["attempt"] == 1 and op["output"] == {"summary": "answered"}
    assert op["handoff"] == "left a child"
    held = booted.exec(["cat", f"{data['project']}/held.txt"]).stdout
    assert held == b"held\n"
    # the child went with the unit's cgroup: nothing of it is left anywhere
    left = booted.exec(["pgrep", "-f", "sleep 613"], check=False)
    assert left.returncode == 1, left.stdout
    units = booted.exec(["systemctl", "list-units", "--all", "--no-legend",
                         f"cairn-agent-{run_id}-*"]).stdout.decode()
    assert "active" not in units.replace("inactive", ""), units
    at = {e["event"]: e["at"] for e in data["events"] if e.get("op_id") == "root-1"}
    took = at["op-finished"] - at["op-started"]
    print(f"background child: finish {took:.1f}s after the agent's start, committed "
          f"{at['op-committed'] - at['op-finished']:.1f}s after the finish")
    assert took < 60 and at["op-committed"] - at["op-finished"] < 30  # the child sleeps 613 s


def test_an_agent_that_finishes_and_runs_on_is_stopped_after_a_grace(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]]
) -> None:
    """The worker still waits for its command, which sent finish_work itself: the
    coordinator stops the unit through the broker once the grace is over."""
    data = hostile_runs["self-finish"]
    run_id = data["run"]["run_id"]
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    (op,) = data["operations"]
    assert op["attempt"] == 1 and op["output"] == {"summary": "sent by the agent"}
    at = {e["event"]: e["at"] for e in data["events"] if e.get("op_id") == "root-1"}
    quiesced = at["op-committed"] - at["op-finished"]
    print(f"agent that finished itself: committed {quiesced:.1f}s after its finish")
    assert 10 <= quiesced < 60
    assert "agent-stopped-after-finish" in booted.journal(run_id=run_id)
    assert booted.exec(["pgrep", "-f", "sleep.614"], check=False).returncode == 1


def test_a_clis_usage_error_fails_once_with_its_own_message(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]]
) -> None:
    """Exit 2 is a usage error: another attempt would only repeat it (and its model
    calls). The operation fails at its first attempt, with the CLI's last stderr line,
    its control sequences escaped."""
    data = hostile_runs["usage"]
    run_id = data["run"]["run_id"]
    (op,) = data["operations"]
    assert data["run"]["state"] == "failed"
    assert op["state"] == "failed" and op["attempt"] == 1, op
    assert op["error"] == f"agent command {USAGE_ERROR}"
    assert "op-retry" not in {e["event"] for e in data["events"]}
    shown = cairn(booted, "show", run_id)
    assert USAGE_ERROR in shown and "\x1b" not in shown, shown
    assert "not retried" in data["run"]["error"] or "not retried" in shown
    # the CLI's stderr reached the run's logs as it came, escaped there too
    logs = cairn(booted, "logs", run_id)
    assert "starting" in logs and "\x1b" not in logs


def test_a_cli_that_may_succeed_next_time_is_retried_and_says_why_it_failed(
    booted: Machine, hostile_runs: dict[str, dict[str, Any]]
) -> None:
    data = hostile_runs["transient"]
    (op,) = data["operations"]
    assert data["run"]["state"] == "failed"
    assert op["state"] == "failed" and op["attempt"] == 3, op
    assert "exited 1: upstream said 503" in op["error"]
    assert "(last: exited 1: upstream said 503)" in data["run"]["error"]
    assert sum(e["event"] == "op-retry" for e in data["events"]) == 2
