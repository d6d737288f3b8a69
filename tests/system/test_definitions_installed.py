"""Definitions by name in a booted machine, as alice types them: install, list, show,
remove; a changed file needs a new confirmation; ``user:`` and trusted ``project:`` launches
run to the end; untrusted or changed project definitions and drafts are refused with one
line each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import Machine
from test_end_to_end import SCRIPT, cairn, finished, wait_for, write_script

REPO = Path(__file__).resolve().parents[2]
SOURCE = (REPO / "cairn" / "builtin" / "workflows" / "implement.py").read_text()
CHANGED = SOURCE.replace("max_length=4_000", "max_length=5_000")


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    """One machine for the module; each test uses its own names and projects."""
    with Machine(deb, with_pool=True) as machine:
        yield machine


def put(machine: Machine, path: str, text: str, user: str = "alice") -> str:
    machine.exec(["mkdir", "-p", str(Path(path).parent)], user=user)
    machine.exec(["tee", path], user=user, input=text.encode())
    return path


def new_project(machine: Machine, name: str) -> str:
    """A project of alice's own for one test, with a CHANGELOG the scripted agent appends to."""
    return put(machine, f"/home/alice/{name}/CHANGELOG.md", "# Changelog\n").rsplit("/", 1)[0]


def failing(machine: Machine, *argv: str, user: str = "alice") -> tuple[str, str]:
    """(first, second) line of stderr of a cairn command that must fail: the error and
    its hint."""
    proc = machine.exec(["cairn", *argv], user=user, check=False, timeout=120)
    assert proc.returncode != 0, proc.stdout.decode()
    lines = proc.stderr.decode().splitlines()
    return lines[0], lines[1] if len(lines) > 1 else ""


def reviewed_hash(machine: Machine, file: str, user: str = "alice") -> str:
    last = cairn(machine, "workflow", "review", file, user=user).strip().splitlines()[-1]
    assert last.startswith("review_hash: sha256:"), last
    return last.split()[1]


def trust_project(machine: Machine, project: str, user: str = "alice") -> str:
    """Trust the project's definitions as they are: read the printed hash, confirm it."""
    out = cairn(machine, "project", "trust", project, user=user)
    (line,) = [line for line in out.splitlines() if line.startswith("trust_hash: ")]
    confirmed = line.split()[1]
    cairn(machine, "project", "trust", project, "--confirm", confirmed, user=user)
    return confirmed


def launch_named(machine: Machine, definition: str, project: str, objective: str) -> str:
    script = write_script(machine, SCRIPT)
    out = cairn(
        machine, "launch", definition, "--project", project,
        "--args", json.dumps({"objective": objective}),
        "--scripted", f"builtin:implementer={script}",
    )
    return out.strip().splitlines()[-1]


def listed(machine: Machine) -> dict[str, dict[str, str]]:
    rows = json.loads(cairn(machine, "workflow", "list", "--json"))
    return {row["definition"]: row for row in rows}


def test_install_list_show_remove(booted: Machine) -> None:
    file = put(booted, "/home/alice/wf/listed.py", SOURCE)
    confirmed = reviewed_hash(booted, file)
    assert cairn(booted, "workflow", "install", file, "--confirm", confirmed).strip() == (
        f"installed user:listed  {confirmed}"
    )
    rows = listed(booted)
    assert rows["user:listed"]["review_hash"] == confirmed
    assert rows["user:listed"]["status"] == "installed"
    assert "builtin:implement" in rows
    shown = cairn(booted, "workflow", "show", "user:listed")
    assert "by alice" in shown and f"review_hash: {confirmed}" in shown
    assert "  async def run(flow: Any, args: Objective) -> Summary:" in shown
    bobs = json.loads(cairn(booted, "workflow", "list", "--json", user="bob"))
    assert "user:listed" not in {row["definition"] for row in bobs}
    cairn(booted, "workflow", "rm", "--yes", "user:listed")
    assert "user:listed" not in listed(booted)
    assert failing(booted, "workflow", "show", "user:listed")[0] == (
        "cairn: user:listed is not installed"
    )


def test_reinstall_with_a_changed_hash_needs_a_new_confirmation(booted: Machine) -> None:
    file = put(booted, "/home/alice/wf/again.py", SOURCE)
    old = reviewed_hash(booted, file)
    cairn(booted, "workflow", "install", file, "--confirm", old)
    put(booted, file, CHANGED)
    new = reviewed_hash(booted, file)
    error, hint = failing(booted, "workflow", "install", file, "--replace", "--confirm", old)
    assert error == f"cairn: {file} does not match the confirmed hash: its review hash is {new}"
    error, hint = failing(booted, "workflow", "install", file, "--confirm", new)
    assert error == f"cairn: user:again is already installed (review hash {old})"
    assert hint.endswith(f"then install with --replace --confirm {new}")
    assert listed(booted)["user:again"]["review_hash"] == old
    diff = cairn(booted, "workflow", "diff", "user:again", file)
    assert "+  summary: str  (min_length=1, max_length=5000)" in diff
    cairn(booted, "workflow", "install", file, "--replace", "--confirm", new)
    assert listed(booted)["user:again"]["review_hash"] == new


def test_a_user_definition_runs_and_is_frozen_at_launch(booted: Machine) -> None:
    project = new_project(booted, "user-app")
    file = put(booted, "/home/alice/wf/entry.py", SOURCE)
    confirmed = reviewed_hash(booted, file)
    cairn(booted, "workflow", "install", file, "--confirm", confirmed)
    run_id = launch_named(booted, "user:entry", project, "a user entry")
    cairn(booted, "workflow", "remove", "--yes", "user:entry")  # the run never reads it again
    data = wait_for(booted, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert (data["run"]["definition"], data["run"]["review_hash"]) == ("user:entry", confirmed)
    changelog = booted.exec(["cat", f"{project}/CHANGELOG.md"]).stdout.decode()
    assert changelog.endswith("- a user entry\n")


def test_project_definitions_run_only_while_trusted_as_they_are(booted: Machine) -> None:
    project = new_project(booted, "project-app")
    definition = put(booted, f"{project}/.cairn/workflows/tidy.py", SOURCE)
    error, hint = failing(booted, "launch", "project:tidy", "--project", project)
    assert error == f"cairn: project:tidy is not trusted: {project} has no trust decision"
    assert hint == (
        f"hint: read 'cairn project trust {project}', then trust it with --confirm sha256:…"
    )

    trust_project(booted, project)
    assert listed(booted)["project:tidy"]["status"] == "trusted"
    run_id = launch_named(booted, "project:tidy", project, "a project entry")
    data = wait_for(booted, run_id, finished)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["definition"] == "project:tidy"

    put(booted, definition, CHANGED)
    now = reviewed_hash(booted, definition)
    error, hint = failing(booted, "launch", "project:tidy", "--project", project)
    assert error == (
        f"cairn: project:tidy changed since {project} was trusted (review hash now {now})"
    )
    assert hint == f"hint: read 'cairn project trust {project}' again, then confirm its new hash"
    assert listed(booted)["project:tidy"]["status"] == "changed"


def test_a_draft_cannot_be_launched_or_exposed(booted: Machine) -> None:
    path = cairn(booted, "workflow", "draft", "sketch").strip()
    assert path == "/home/alice/.config/cairn/drafts/sketch.py"
    assert "user:sketch" not in listed(booted)
    for argv, what in (
        (["launch", "user:sketch", "--project", "/home/alice"], "launched"),
        (["launch", path, "--confirm", reviewed_hash(booted, path)], "launched"),
        (["workflow", "expose", "user:sketch"], "exposed"),
    ):
        error, _hint = failing(booted, *argv)
        assert error == f"cairn: user:sketch is a draft; drafts cannot be {what}"
    registry = booted.exec(["test", "-e", "/home/alice/.config/cairn/registry.json"], check=False)
    assert registry.returncode == 1  # nothing was exposed
