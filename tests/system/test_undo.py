"""`cairn revert`: a finished run's apply undone in the live project, three-way, as the
project's owner, in a booted machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_escapes import cairn, fresh_project, run_script, tree


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

    out = json.loads(cairn(booted, "revert", run_id, "--json"))
    assert out["status"] == "applied"
    assert sorted(out["applied"]) == ["CHANGELOG.md", "src/added.py"]
    assert out["unit"] == f"cairn-revert-{run_id}-1.service"
    assert tree(booted, project) == before

    shown = json.loads(cairn(booted, "show", run_id, "--json"))
    assert shown["settlement"]["revert"]["status"] == "applied"
    assert shown["settlement_summary"]["label"] == "applied, reverted"
    assert any(e["event"] == "reverted" for e in shown["events"])
    again = cairn(booted, "revert", run_id)
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

    proc = booted.exec(["cairn", "revert", run_id], user="alice", check=False)
    assert proc.returncode == 1
    assert "not reverted, nothing written" in proc.stdout.decode()
    assert "conflict: src/added.py" in proc.stdout.decode()
    assert tree(booted, project) == edited


def test_another_user_cannot_revert_a_run(booted: Machine) -> None:
    project = fresh_project(booted, "alice")
    _, run_id, _ = run_script(booted, STEPS, "alice's", project=project)
    applied = tree(booted, project)
    proc = booted.exec(["cairn", "revert", run_id], user="bob", check=False)
    assert proc.returncode != 0
    assert f"no run {run_id}" in proc.stderr.decode()
    assert tree(booted, project) == applied
