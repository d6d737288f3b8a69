"""When a run's proposal reaches the live project, and how it is taken back, in a booted
machine: `cairn launch --apply ask|never`, `cairn apply`, `cairn diff --patch` and
`cairn revert` (three-way, as the project's owner)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn, finished
from test_escapes import fresh_project, run_script, tree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        yield machine


STEPS: list[dict[str, Any]] = [
    {"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"},
    {"action": "write", "path": "src/added.py", "content": "added\n"},
]


def test_revert_restores_the_project_as_it_was_before_the_run(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    before = tree(booted, project)
    _, run_id, data = run_script(booted, STEPS, "undo me", project=project)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert tree(booted, project) != before

    out = json.loads(cairn(booted, "revert", "--yes", run_id, "--json"))
    assert out["status"] == "applied"
    assert sorted(out["applied"]) == ["CHANGELOG.md", "src/added.py"]
    assert out["unit"] == f"cairn-revert-{run_id}-1.service"
    assert tree(booted, project) == before

    shown = json.loads(cairn(booted, "show", run_id, "--json"))
    assert shown["settlement"]["revert"]["status"] == "applied"
    assert shown["settlement_summary"]["label"] == "applied, reverted"
    assert any(e["event"] == "reverted" for e in shown["events"])
    again = cairn(booted, "revert", "--yes", run_id)
    assert "already reverted" in again
    assert tree(booted, project) == before


def test_revert_after_a_persons_edit_is_a_named_conflict_and_writes_nothing(
    booted: Machine,
) -> None:
    project = fresh_project(booted, "alice")
    _, run_id, data = run_script(booted, STEPS, "keep me", project=project)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    booted.exec(["tee", "-a", f"{project}/src/added.py"], user="alice", input=b"mine\n")
    edited = tree(booted, project)

    proc = booted.exec(["cairn", "revert", "--yes", run_id], user="alice", check=False)
    assert proc.returncode == 1
    assert "not reverted, nothing written" in proc.stdout.decode()
    assert "conflict: src/added.py" in proc.stdout.decode()
    assert tree(booted, project) == edited


def test_another_user_cannot_revert_a_run(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    _, run_id, _ = run_script(booted, STEPS, "alice's", project=project)
    applied = tree(booted, project)
    proc = booted.exec(["cairn", "revert", "--yes", run_id], user="bob", check=False)
    assert proc.returncode != 0
    assert f"no run {run_id}" in proc.stderr.decode()
    assert tree(booted, project) == applied


def launch_held(machine: Machine, project: str, mode: str) -> str:
    script = {"steps": STEPS, "output": {"summary": "{prompt}"}, "handoff": "done"}
    path = f"/home/alice/agent-{secrets.token_hex(4)}.json"
    machine.exec(["tee", path], user="alice", input=json.dumps(script).encode())
    out = cairn(
        machine, "launch", "builtin:implement", "--project", project, "--apply", mode,
        "--args", json.dumps({"objective": f"held {mode}"}),
        "--scripted", f"builtin:implementer={path}",
    )
    return out.strip().splitlines()[-1]


def wait_until(machine: Machine, run_id: str, states: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while True:
        data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json"))
        if data["run"]["state"] in states:
            return data
        if time.monotonic() > deadline or finished(data):
            pytest.fail(f"{run_id} is {data['run']['state']}, not {states}: {data['run']['error']}")
        time.sleep(0.5)


def test_apply_ask_waits_with_nothing_running_and_applies_on_cairn_apply(
    booted: Machine,
) -> None:
    project = fresh_project(booted, "alice")
    before = tree(booted, project)
    run_id = launch_held(booted, project, "ask")
    waiting = wait_until(booted, run_id, ("waiting",))
    assert waiting["settlement_summary"]["label"] == "waiting for 'cairn apply', 2 paths"
    assert tree(booted, project) == before
    # the coordinator records the wait, then exits: nothing runs while the run waits
    deadline = time.monotonic() + 30
    while (active := booted.exec(
        ["systemctl", "is-active", f"cairn-coordinator@{run_id}.service"], check=False
    ).stdout.decode().strip()) not in ("inactive", "failed"):
        assert time.monotonic() < deadline, active
        time.sleep(0.2)
    inbox = cairn(booted, "inbox")
    assert f"{run_id} proposal waits to be applied: 2 path(s)" in inbox
    assert f"cairn apply {run_id}" in inbox
    assert "+- held ask" in cairn(booted, "diff", run_id, "--patch")

    assert "proposal approved" in cairn(booted, "apply", run_id)
    data = wait_until(booted, run_id, ("succeeded", "failed"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["settlement"]["status"] == "applied"
    assert "- held ask" in booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout.decode()
    assert cairn(booted, "inbox").strip() in ("", "nothing waits for you")


def test_apply_never_keeps_the_proposal_for_a_patch(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    before = tree(booted, project)
    run_id = launch_held(booted, project, "never")
    data = wait_until(booted, run_id, ("succeeded", "failed"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["settlement"]["status"] == "held"
    assert data["settlement_summary"]["label"] == "held, 2 paths not applied"
    assert tree(booted, project) == before
    patch = cairn(booted, "diff", run_id, "--patch")
    assert patch.startswith("diff --git a/")
    assert "+++ b/src/added.py" in patch and "+- held never" in patch
    proc = booted.exec(["cairn", "apply", run_id], user="alice", check=False)
    assert proc.returncode != 0 and "no proposal waiting" in proc.stderr.decode()


def test_declared_write_paths_keep_every_other_path_out(booted: Machine) -> None:
    """A workflow that declares write_paths=["src/**"]: its agent's change to CHANGELOG.md
    is refused by name in the settlement and never reaches the project."""
    source = (REPO / "cairn" / "builtin" / "workflows" / "implement.py").read_text()
    source = source.replace("@workflow(", '@workflow(write_paths=["src/**"], ', 1)
    path = "/home/alice/src_only.py"
    booted.exec(["tee", path], user="alice", input=source.encode())
    review = cairn(booted, "workflow", "review", path)
    assert "write paths   src/**" in review
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = fresh_project(booted, "alice")
    script = {"steps": STEPS, "output": {"summary": "{prompt}"}, "handoff": "done"}
    booted.exec(["tee", "/home/alice/src-only.json"], user="alice",
                input=json.dumps(script).encode())
    out = cairn(booted, "launch", path, "--confirm", review_hash, "--project", project,
                "--args", json.dumps({"objective": "src only"}),
                "--scripted", "builtin:implementer=/home/alice/src-only.json")
    run_id = out.strip().splitlines()[-1]
    data = wait_until(booted, run_id, ("succeeded", "failed"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    refused = data["settlement"]["candidate"]["refused"]
    assert refused == [{"path": "CHANGELOG.md", "reason": "outside the write paths"}]
    assert data["settlement"]["apply"]["applied"] == ["src/added.py"]
    assert booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout == b"# Changelog\n"


CHECK = """\
argv = ["/bin/sh", "-c", "id -u; touch made-by-check; if grep -q forbidden CHANGELOG.md; \
then echo found forbidden; printf '\\\\033]0;pwned\\\\007\\\\377\\\\376\\\\n'; exit 3; fi; \
echo all good"]
timeout_sec = 60
[match]
projects = ["{project}"]
"""


RECEIPT_BODY = """import sqlite3, sys
db = sqlite3.connect("file:/var/lib/cairn/broker/receipts.db?mode=ro", uri=True)
print(db.execute("SELECT body FROM receipts WHERE run_id=? AND kind='verify-proposal'",
                 (sys.argv[1],)).fetchone()[0])"""


def verified_run(booted: Machine, words: str) -> tuple[str, str, dict[str, Any]]:
    project = fresh_project(booted, "alice")
    booted.exec(["mkdir", "-p", "/etc/cairn/verifiers.d"])
    booted.exec(["tee", "/etc/cairn/verifiers.d/tests.toml"],
                input=CHECK.format(project=project).encode())
    try:
        steps = [{"action": "append", "path": "CHANGELOG.md", "content": "- {prompt}\n"}]
        _, run_id, data = run_script(booted, steps, words, project=project)
    finally:
        booted.exec(["rm", "-f", "/etc/cairn/verifiers.d/tests.toml"])
    return project, run_id, data


def test_a_failing_check_stops_the_settlement_and_the_project_stays_as_it_was(
    booted: Machine,
) -> None:
    project, run_id, data = verified_run(booted, "forbidden words")
    assert data["run"]["state"] == "failed", data["settlement"]["verification"]
    assert "check tests failed (exit-code, exit status 3)" in data["run"]["error"]
    settlement = data["settlement"]
    assert settlement["status"] == "verification-failed"
    assert data["settlement_summary"]["label"] == "check tests failed, none applied"
    (check,) = settlement["verification"]["checks"]
    assert check["passed"] is False and check["exit_status"] == 3
    assert "found forbidden" in check["output"]
    assert check["unit"] == f"cairn-check-{run_id}-tests-1.service"
    # root recorded what the owner's check printed as bytes, never decoding them; the
    # coordinator checked their hash and decoded them into the settlement
    body = json.loads(booted.exec(["python3", "-c", RECEIPT_BODY, run_id]).stdout)
    (recorded,) = body["data"]["checks"]
    raw = base64.b64decode(recorded["output_raw"]["b64"])
    assert hashlib.sha256(raw).hexdigest() == recorded["output_raw"]["sha256"]
    assert recorded["output"] == "" and b"found forbidden" in raw
    assert check["output"] == raw.decode("utf-8", "replace")
    assert booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout == b"# Changelog\n"
    assert booted.exec(["test", "-e", f"{project}/made-by-check"], check=False).returncode != 0


def test_a_passing_check_runs_as_the_owner_on_a_copy_and_the_change_is_applied(
    booted: Machine,
) -> None:
    project, _, data = verified_run(booted, "harmless words")
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    (check,) = data["settlement"]["verification"]["checks"]
    assert check["passed"] is True and "all good" in check["output"]
    alice = booted.exec(["id", "-u", "alice"]).stdout.decode().strip()
    assert check["output"].splitlines()[0] == alice
    assert b"- harmless words" in booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout
    assert booted.exec(["test", "-e", f"{project}/made-by-check"], check=False).returncode != 0


def test_doctor_tells_which_applied_paths_were_changed_since(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    _, run_id, data = run_script(booted, STEPS, "check me", project=project)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]

    def checked() -> dict[str, Any]:
        proc = booted.exec(["cairn", "doctor", run_id, "--json"], user="alice", check=False)
        (run,) = json.loads(proc.stdout)["runs"]
        assert proc.returncode == 0 and run["problems"] == [], run
        return dict(run)

    clean = checked()
    assert clean["applied"] == {"as_applied": 2, "reverted": 0, "changed": 0}
    assert clean["warnings"] == [] and clean["notes"] == []

    # A person edits an applied file: a warning with the path, not a problem.
    booted.exec(["tee", "-a", f"{project}/src/added.py"], user="alice", input=b"mine\n")
    edited = tree(booted, project)
    text = cairn(booted, "doctor", run_id)
    assert "warning: src/added.py in the live project is neither" in text
    assert "2 path(s) as applied" not in text and "1 changed since" in text
    assert tree(booted, project) == edited  # the check writes nothing

    # Back to the run's content, reverted: every path holds Q's again.
    booted.exec(["tee", f"{project}/src/added.py"], user="alice", input=b"added\n")
    assert json.loads(cairn(booted, "revert", "--yes", run_id, "--json"))["status"] == "applied"
    assert checked()["applied"] == {"as_applied": 0, "reverted": 2, "changed": 0}

    # Once the storage is deleted there is nothing to compare with: a note.
    cairn(booted, "rm", "--yes", run_id)
    gone = checked()
    assert "applied" not in gone
    assert gone["notes"] == ["the live project was not checked: the run's storage was deleted"]


def test_a_hard_link_the_agent_made_reaches_the_project_as_one_file(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    steps: list[dict[str, Any]] = [
        {"action": "write", "path": "src/shared.py", "content": "{prompt}\n"},
        {"action": "run", "argv": ["ln", "src/shared.py", "src/alias.py"]},
    ]
    _, run_id, data = run_script(booted, steps, "one file, two names", project=project)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    apply = data["settlement"]["apply"]
    assert sorted(apply["applied"]) == ["src/alias.py", "src/shared.py"]
    assert "links_not_kept" not in apply
    shown = booted.exec(["stat", "-c", "%i %h", f"{project}/src/shared.py",
                         f"{project}/src/alias.py"]).stdout.decode().split("\n")
    assert shown[0] == shown[1] and shown[0].endswith(" 2"), shown
