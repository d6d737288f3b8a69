"""The CLI as a person at a shell uses it, in a booted machine with the package installed:
``cairn logs -f`` following a run, shell completion offering the caller's runs, old
command names still working beside the new ones, and a workflow of the language's newer
idioms reviewed and run."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import Machine
from test_end_to_end import cairn, finished, show, wait_for

LATE_SECONDS = 8


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        yield machine


def new_project(machine: Machine, user: str = "alice") -> str:
    project = f"/home/{user}/p-{secrets.token_hex(4)}"
    machine.exec(["mkdir", "-p", project], user=user)
    machine.exec(["tee", f"{project}/CHANGELOG.md"], user=user, input=b"# Changelog\n")
    return project


def launch_script(machine: Machine, steps: list[dict[str, object]], user: str = "alice") -> str:
    """Launch builtin:implement with a scripted agent doing ``steps``; its run ID."""
    path = f"/home/{user}/agent-{secrets.token_hex(4)}.json"
    script = {"steps": steps, "output": {"summary": "done"}, "handoff": ""}
    machine.exec(["tee", path], user=user, input=json.dumps(script).encode())
    out = cairn(
        machine, "launch", "builtin:implement", "--project", new_project(machine, user),
        "--arg", "objective=cli", "--scripted",
        f"builtin:implementer={path}", user=user,
    )
    return out.strip().splitlines()[-1]


def in_journal(machine: Machine, message: str) -> bool:
    out = machine.exec(["journalctl", "--no-pager", "-o", "cat", f"MESSAGE={message}"])
    return message in out.stdout.decode()


def wait_exited(machine: Machine, unit: str, timeout: float) -> str:
    """The SubState of a RemainAfterExit unit once its process has ended."""
    deadline = time.monotonic() + timeout
    while True:
        state = machine.exec(["systemctl", "show", "-p", "SubState", "--value", unit])
        sub = state.stdout.decode().strip()
        if sub in ("exited", "failed"):
            return sub
        assert time.monotonic() < deadline, f"{unit} still {sub}"
        time.sleep(0.5)


def test_logs_follow_sees_a_line_written_after_it_started(booted: Machine) -> None:
    token = secrets.token_hex(6)
    late = f"LATE-{token}"
    run_id = launch_script(booted, [
        {"action": "sleep", "seconds": LATE_SECONDS},
        {"action": "run", "argv": ["echo", late]},
    ])
    unit = f"logs-follow-{token}.service"
    out = f"/tmp/logs-follow-{token}.out"
    booted.exec([
        "systemd-run", f"--unit={unit}", "--uid=alice", "-p", "RemainAfterExit=yes",
        "-p", f"StandardOutput=file:{out}", "-p", f"StandardError=file:{out}.err",
        "cairn", "logs", "-f", "-o", "cat", run_id,
    ])
    # The follower runs, and the line it must see is not written yet.
    assert booted.exec(["systemctl", "is-active", unit]).stdout.strip() == b"active"
    assert not in_journal(booted, late)

    data = wait_for(booted, run_id, finished, timeout=240)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert in_journal(booted, late)
    # It ends by itself once the run has ended, with exit status 0.
    assert wait_exited(booted, unit, timeout=60) == "exited"
    status = booted.exec(["systemctl", "show", "-p", "ExecMainStatus", "--value", unit])
    assert status.stdout.strip() == b"0", booted.exec(["cat", f"{out}.err"]).stdout
    followed = booted.exec(["cat", out]).stdout.decode().splitlines()
    assert followed.count(late) == 1, followed
    # and every line it printed is one the run's units logged
    once = set(cairn(booted, "logs", "-o", "cat", "-n", "10000", run_id).splitlines())
    assert set(followed) <= once, set(followed) - once
    booted.exec(["systemctl", "stop", unit])


def test_logs_filters_by_priority_and_prints_journal_json(booted: Machine) -> None:
    run_id = launch_script(booted, [{"action": "run", "argv": ["/bin/false"]}])
    data = wait_for(booted, run_id, finished, timeout=240)
    assert data["run"]["state"] == "failed"
    errors = cairn(booted, "logs", "-p", "err", "-o", "json", run_id).splitlines()
    entries = [json.loads(line) for line in errors]
    assert entries and all(int(e["PRIORITY"]) <= 3 for e in entries)
    units = set(show(booted, run_id)["units"]) | {f"cairn-coordinator@{run_id}.service"}
    assert all(e.get("_SYSTEMD_UNIT") in units or e.get("_PID") == "1" for e in entries)
    bad = booted.exec(["cairn", "logs", "-p", "loud", run_id], user="alice", check=False)
    assert bad.returncode == 2 and b"not a syslog level" in bad.stderr
    since = booted.exec(["cairn", "logs", "--since", "not a time", run_id], user="alice",
                        check=False)
    assert since.returncode == 2
    assert b"is not a time journalctl can read" in since.stderr


SGR = re.compile(r"\x1b\[[0-9;]*m")


def test_logs_on_a_terminal_are_journalctls_lines_with_errors_in_red(booted: Machine) -> None:
    run_id = launch_script(booted, [{"action": "run", "argv": ["/bin/false"]}])
    wait_for(booted, run_id, finished, timeout=240)
    piped = cairn(booted, "logs", "-n", "10000", run_id)
    # on a pseudo-terminal, as a person at a shell sees it (script(1) makes the pty)
    command = f"cairn logs --no-pager -n 10000 {run_id}"
    on_tty = booted.exec(["env", "TERM=xterm", "script", "-qec", command, "/dev/null"],
                         user="alice").stdout.decode().replace("\r\n", "\n")
    assert SGR.sub("", on_tty) == piped  # cairn draws exactly journalctl's short-iso lines
    red = [line for line in on_tty.splitlines() if "\x1b[1;31m" in line]
    errors = cairn(booted, "logs", "-n", "10000", "-p", "err", "-o", "cat", run_id)
    assert red and len(red) == len(errors.splitlines())


def test_logs_narrows_to_an_operation_a_pattern_and_a_time_and_reverses(
    booted: Machine,
) -> None:
    run_id = launch_script(booted, [{"action": "append", "path": "CHANGELOG.md",
                                     "content": "- {prompt}\n"}])
    data = wait_for(booted, run_id, finished, timeout=240)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    # the objective launch_script gave with --arg objective=cli
    changelog = booted.exec(["cat", f"{data['run']['project']}/CHANGELOG.md"]).stdout
    assert changelog == b"# Changelog\n- cli\n"
    op_id = data["operations"][0]["op_id"]

    def entries(*args: str) -> list[dict[str, str]]:
        out = cairn(booted, "logs", "-o", "json", "-n", "10000", *args, run_id)
        return [json.loads(line) for line in out.splitlines()]

    every = entries()
    agent = f"cairn-agent-{run_id}-{op_id}-"
    only_op = entries("--op", op_id)
    assert only_op and len(only_op) < len(every)
    # the agent units' own entries, and PID 1's about them
    assert all(e.get("UNIT" if e.get("_PID") == "1" else "_SYSTEMD_UNIT", "").startswith(agent)
               for e in only_op), only_op
    newest_first = entries("-r")
    assert [e["__CURSOR"] for e in newest_first] == [e["__CURSOR"] for e in reversed(every)]
    word = "Deactivated"
    matched = entries("-g", word)
    assert matched and all(word in e["MESSAGE"] for e in matched)
    assert len(matched) < len(every)
    assert entries("--until", "2000-01-01") == []
    missing = booted.exec(["cairn", "logs", "--op", "root-99", run_id], user="alice",
                          check=False)
    assert missing.returncode == 2  # an object that does not exist (cairn(1), EXIT STATUS)
    assert b"operation root-99 of " in missing.stderr and b"started no agent unit" in missing.stderr


def test_launch_wait_returns_once_the_run_has_ended_with_its_outcome(booted: Machine) -> None:
    path = f"/home/alice/agent-{secrets.token_hex(4)}.json"
    script = {"steps": [], "output": {"summary": "waited"}, "handoff": ""}
    booted.exec(["tee", path], user="alice", input=json.dumps(script).encode())
    out = cairn(booted, "launch", "builtin:implement", "--project", new_project(booted),
                "--arg", "objective=wait", "--scripted", f"builtin:implementer={path}", "--wait")
    run_id, *between, last = out.splitlines()
    assert last == f'{run_id} succeeded: {{"summary": "waited"}}'
    assert between == []  # no events: that is --watch
    assert show(booted, run_id)["run"]["state"] == "succeeded"


def test_new_and_old_command_names_both_work(booted: Machine) -> None:
    run_id = launch_script(booted, [])
    wait_for(booted, run_id, finished, timeout=240)
    listed = json.loads(cairn(booted, "list", "--json"))
    assert run_id in [r["run_id"] for r in listed]
    assert json.loads(cairn(booted, "ps", "--json")) == listed
    # the listing's filters and forms, against cairnd's own answer
    succeeded = [r["run_id"] for r in listed if r["state"] == "succeeded"]
    assert cairn(booted, "list", "-q", "--state", "succeeded").splitlines() == succeeded
    assert cairn(booted, "list", "-q", "-n", "1").splitlines() == [listed[0]["run_id"]]
    assert cairn(booted, "list", "--format", "{run_id} {project}").splitlines() == [
        f"{r['run_id']} {r['project']}" for r in listed]
    table = cairn(booted, "list").splitlines()
    row = next(line for line in table if run_id.removeprefix("flow_").startswith(line.split()[0]))
    project = next(r["project"] for r in listed if r["run_id"] == run_id)
    assert row.split()[1:4] == [
        "succeeded", "builtin:implement", project.replace("/home/alice", "~", 1)], table
    # the short ID it shows names the run
    assert show(booted, row.split()[0])["run"]["run_id"] == run_id
    booted.enable_user_manager("alice")
    for old, new, args in (("inspect", "show", ["0123456789ab"]), ("reconcile", "repair", [])):
        now = booted.exec(["cairn", "schedule", new, *args], user="alice", check=False)
        before = booted.exec(["cairn", "schedule", old, *args], user="alice", check=False)
        assert (now.returncode, now.stdout) == (before.returncode, before.stdout), old
        assert f"'schedule {old}' is now 'schedule {new}'".encode() in before.stderr
        assert b"is now" not in now.stderr
    # the user manager's repair at start runs under the new name and succeeds
    unit = "cairn-schedule-reconcile.service"
    booted.exec(["systemctl", "--user", "-M", "alice@", "restart", unit])
    shown = booted.exec(["systemctl", "--user", "-M", "alice@", "show", "-p", "Result", unit])
    assert shown.stdout.decode().strip() == "Result=success"


# -- shell completion ------------------------------------------------------------------

COMPLETIONS = {
    "bash": "/usr/share/bash-completion/completions/cairn",
    "zsh": "/usr/share/zsh/vendor-completions/_cairn",
    "fish": "/usr/share/fish/vendor_completions.d/cairn.fish",
}


def bash_complete(machine: Machine, line: str, user: str = "alice") -> list[str]:
    """What the installed bash script offers for ``line`` (the cursor at its end)."""
    script = (
        f"source {COMPLETIONS['bash']}\n"
        f"COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; _cairn\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = machine.exec(["bash", "--norc", "-c", script], user=user)
    return out.stdout.decode().splitlines()


def test_the_package_ships_completion_for_three_shells(booted: Machine) -> None:
    for shell, path in COMPLETIONS.items():
        text = booted.exec(["cat", path]).stdout.decode()
        assert "cairn __complete --" in text, shell
        # what `cairn completion SHELL` prints for an install without the package
        assert booted.exec(["cairn", "completion", shell], user="alice").stdout.decode() == text


def test_completion_offers_the_callers_live_run_ids(booted: Machine) -> None:
    run_id = launch_script(booted, [{"action": "sleep", "seconds": 30}])
    short = run_id.removeprefix("flow_")[:8]
    offered = bash_complete(booted, "cairn show ")
    assert "@last" in offered
    assert any(run_id.removeprefix("flow_").startswith(o) and len(o) >= 8 for o in offered)
    assert [o for o in bash_complete(booted, f"cairn logs -f {short[:5]}")
            if run_id.removeprefix("flow_").startswith(o)]
    assert bash_complete(booted, f"cairn cancel {run_id[:10]}") == [run_id]
    # the short ID it offers names the run
    (offered_id,) = [o for o in offered if run_id.removeprefix("flow_").startswith(o)]
    assert show(booted, offered_id)["run"]["run_id"] == run_id
    # another user is never offered alice's run
    assert not [o for o in bash_complete(booted, "cairn show ", user="bob")
                if run_id.removeprefix("flow_").startswith(o)]
    # commands, options and definitions
    assert bash_complete(booted, "cairn sched") == ["schedule"]
    assert "--follow" in bash_complete(booted, "cairn logs --f")
    assert bash_complete(booted, "cairn launch builtin:imp") == ["implement"]
    cairn(booted, "cancel", "--yes", run_id)


METHOD_NAMED = '''"""A launch argument named like a str method, and a bounded while."""

from cairn.workflow import Field, Model, workflow


class Export(Model):
    format: str = Field(min_length=1)


class Done(Model):
    summary: str


@workflow(description="Export in the asked format.", input=Export, output=Done)
async def run(flow, args: Export) -> Done:
    passes = 0
    while passes < 3:
        passes += 1
    return Done(summary=f"exported as {args.format} in {passes} passes")
'''


def test_an_argument_named_format_and_a_bounded_while_pass_review_and_run(
    booted: Machine,
) -> None:
    path = f"/home/alice/export-{secrets.token_hex(4)}.py"
    booted.exec(["tee", path], user="alice", input=METHOD_NAMED.encode())
    review = cairn(booted, "workflow", "review", path)
    review_hash = review.strip().splitlines()[-1].split()[-1]
    run_id = cairn(booted, "launch", path, "--confirm", review_hash,
                   "--project", new_project(booted),
                   "--args", '{"format": "{0.__class__}"}').strip().splitlines()[-1]
    data = wait_for(booted, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "exported as {0.__class__} in 3 passes"}
    # the same read on a value the review cannot know is refused, and so is a while
    # whose counter does not start at a literal
    booted.exec(["tee", path], user="alice",
                input=METHOD_NAMED.replace("{args.format}", "{(x := args).format}").encode())
    again = booted.exec(["cairn", "workflow", "review", path], user="alice", check=False)
    assert again.returncode != 0
    assert "'.format()' is not allowed in a workflow" in again.stderr.decode()
    unbounded = METHOD_NAMED.replace("    passes = 0\n", "    passes = len(args.format)\n")
    booted.exec(["tee", path], user="alice", input=unbounded.encode())
    again = booted.exec(["cairn", "workflow", "review", path], user="alice", check=False)
    assert again.returncode != 0
    assert "'while' with a bound on 'passes' needs 'passes = <int>' right before it" in (
        again.stderr.decode())


def test_a_launch_repeated_with_its_run_key_prints_the_same_run(booted: Machine) -> None:
    """... and a launch with --watch follows its run to the end."""
    path = f"/home/alice/agent-{secrets.token_hex(4)}.json"
    script = {"steps": [{"action": "append", "path": "CHANGELOG.md", "content": "- keyed\n"}],
              "output": {"summary": "done"}, "handoff": ""}
    booted.exec(["tee", path], user="alice", input=json.dumps(script).encode())
    key = f"nightly-{secrets.token_hex(4)}"
    argv = ["cairn", "launch", "builtin:implement", "--project", new_project(booted),
            "--args", '{"objective": "keyed"}', "--scripted", f"builtin:implementer={path}",
            "--run-key", key]
    # --watch: the launch stays, follows the run and exits with its outcome
    first = booted.exec([*argv, "--watch"], user="alice", timeout=300)
    printed = first.stdout.decode().strip().splitlines()
    run_id = printed[0]
    assert printed[-1] == f'{run_id} succeeded: {{"summary": "done"}}', printed
    again = booted.exec(argv, user="alice")  # a retry: the same run, not a second one

    assert again.stdout.decode().strip().splitlines()[-1] == run_id
    assert f"run key {key} names run {run_id} (succeeded), launched before: not launched " \
        "again" in again.stderr.decode()
    data = wait_for(booted, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["run_key"] == key
    assert f"run key {key}" in cairn(booted, "show", run_id)
    listed = json.loads(cairn(booted, "list", "--json"))
    assert [r["run_id"] for r in listed if r.get("run_key") == key] == [run_id]
    # the same key with other arguments is a mistake, said in one line
    other = [*argv]
    other[other.index('{"objective": "keyed"}')] = '{"objective": "other"}'
    refused = booted.exec(other, user="alice", check=False)
    assert refused.returncode == 2
    assert refused.stderr.decode().splitlines()[0] == (
        f"cairn: run key {key} already names run {run_id}, launched with another arguments")
    # a key is a name
    bad = booted.exec([*argv[:-1], "no spaces"], user="alice", check=False)
    assert bad.returncode == 2
    assert "run key 'no spaces' is not a name" in bad.stderr.decode()
