"""Artifacts in a booted machine: the example of docs/writing-workflows.md, with a scripted
researcher that publishes a report and a table in /outputs/artifacts and, beside them,
what a hostile agent would leave there (links out of the sandbox, a FIFO, a name that
clears the screen, a file past the size limit). The report reaches the next agent
read-only under /evidence/incoming; `cairn show` and `cairn artifacts` name what was
kept and what was left behind, print no control byte, save an artifact to a file or a
pipe, and show nothing to another user."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn
from test_escapes import fresh_project
from test_recovery import wait_finished

REPO = Path(__file__).resolve().parents[2]
GUIDE = (REPO / "docs" / "writing-workflows.md").read_text()
(EXAMPLE,) = [b for b in re.findall(r"```python\n(.*?)```", GUIDE, re.DOTALL)
              if "/artifacts/" in b]
REPORT = "# Findings\nAdd NOTES.md that says where the plan lives.\n"
PUBLISH = r"""
set -e
A=/outputs/artifacts
mkdir -p $A/data
printf '%s' "$0" > $A/report.md
printf 'a,b\n1,2\n' > $A/data/table.csv
ln -s /etc/passwd $A/passwd
ln -s /workspace $A/project
mkfifo $A/pipe
printf x > "$A/$(printf 'clear\033[2J')"
head -c 17000000 /dev/zero > $A/huge.bin
mkdir $A/zz-many
for i in $(seq 1 120); do printf "$i" > $A/zz-many/f$(printf %03d $i); done
"""
RESEARCHER = {"steps": [{"action": "run", "argv": ["sh", "-c", PUBLISH, REPORT]}],
              "output": {"summary": "see report.md"}, "handoff": "the report is an artifact"}
WRITER = {"steps": [{"action": "run", "argv": [
    "sh", "-c", "cp /evidence/incoming/root-1/artifacts/report.md findings.md && "
    "ls -A /evidence/incoming/root-1/artifacts > listing.txt"]}],
    "output": {"summary": "did what the report says"}, "handoff": "findings.md"}
# Sorted by name: the report and the table come first, then 98 of zz-many's 120 files
# fill the count of 100; the rest are named as far as the boundary names refusals (20).
LEFT = {
    "clear\\x1b[2J": "a name with a control character",
    "huge.bin": "larger than 16777216 bytes",
    "passwd": "a symbolic link, not a regular file",
    "pipe": "a FIFO, not a regular file",
    "project": "a symbolic link, not a regular file",
    **{f"zz-many/f{i:03d}": "more than 100 files" for i in range(99, 114)},
}


@pytest.fixture(scope="module")
def finished(deb: Path) -> Iterator[tuple[Machine, str, str, dict[str, Any]]]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", "/home/alice/artifacts.py"], user="alice", input=EXAMPLE.encode())
        for name, script in (("researcher", RESEARCHER), ("writer", WRITER)):
            machine.exec(["tee", f"/home/alice/{name}.json"], user="alice",
                         input=json.dumps(script).encode())
        review = cairn(machine, "workflow", "review", "/home/alice/artifacts.py")
        review_hash = review.strip().splitlines()[-1].split()[-1]
        project = fresh_project(machine, "alice")
        out = cairn(machine, "launch", "/home/alice/artifacts.py", "--confirm", review_hash,
                    "--project", project, "--arg", "question=what does the plan need?",
                    "--scripted", "builtin:researcher=/home/alice/researcher.json",
                    "--scripted", "builtin:implementer=/home/alice/writer.json")
        run_id = out.strip().splitlines()[-1]
        data = wait_finished(machine, run_id)
        assert data["run"]["state"] == "succeeded", data["run"]["error"]
        yield machine, project, run_id, data


def test_the_next_agent_reads_only_what_was_collected(
    finished: tuple[Machine, str, str, dict[str, Any]],
) -> None:
    machine, project, run_id, _ = finished
    assert machine.exec(["cat", f"{project}/findings.md"]).stdout.decode() == REPORT
    assert machine.exec(["cat", f"{project}/listing.txt"]).stdout.decode() == (
        "data\nreport.md\nzz-many\n")
    boundary = json.loads(machine.exec(
        ["cat", f"/var/lib/cairn/runs/{run_id}/boundaries/root-1/boundary.json"]).stdout)
    files = {a["name"]: a for a in boundary["artifacts"]["files"]}
    assert files["report.md"]["sha256"] == hashlib.sha256(REPORT.encode()).hexdigest()
    assert files["data/table.csv"]["size"] == 8


def test_show_and_artifacts_name_what_was_kept_and_left_without_a_control_byte(
    finished: tuple[Machine, str, str, dict[str, Any]],
) -> None:
    machine, _, run_id, data = finished
    (op,) = [o for o in data["operations"] if o["op_id"] == "root-1"]
    assert [a["name"] for a in op["artifacts"]["files"]] == [
        "data/table.csv", "report.md", *(f"zz-many/f{i:03d}" for i in range(1, 99))]
    assert {r["name"]: r["reason"] for r in op["artifacts"]["refused"]} == LEFT
    assert op["artifacts"]["refused_total"] == 5 + 22
    shown = machine.exec(["cairn", "show", run_id], user="alice").stdout
    assert b"artifacts data/table.csv, report.md, zz-many/f001, zz-many/f002, " in shown
    assert b" and 95 more (100 files, " in shown
    assert f"27 left behind, see 'cairn artifacts {run_id} root-1'".encode() in shown
    listed = machine.exec(["cairn", "artifacts", run_id], user="alice").stdout
    assert re.search(rb"root-1\s+report\.md\s+\S+ B\s+" + hashlib.sha256(
        REPORT.encode()).hexdigest()[:12].encode(), listed), listed
    assert b"root-1: clear\\x1b[2J: a name with a control character" in listed
    assert b"root-1: and 7 more" in listed
    for text in (shown, listed):
        assert b"\x1b" not in text


def test_an_artifact_is_saved_to_a_pipe_or_a_new_file_and_hidden_from_others(
    finished: tuple[Machine, str, str, dict[str, Any]],
) -> None:
    machine, _, run_id, _ = finished
    piped = machine.exec(["cairn", "artifacts", run_id, "root-1", "report.md"], user="alice")
    assert piped.stdout.decode() == REPORT
    saved = machine.exec(["cairn", "artifacts", run_id, "root-1", "data/table.csv",
                          "-o", "/home/alice/table.csv"], user="alice")
    assert b"saved data/table.csv of root-1 as /home/alice/table.csv" in saved.stderr
    assert machine.exec(["cat", "/home/alice/table.csv"]).stdout == b"a,b\n1,2\n"
    again = machine.exec(["cairn", "artifacts", run_id, "root-1", "report.md",
                          "-o", "/home/alice/table.csv"], user="alice", check=False)
    assert again.returncode == 2 and b"exists; nothing was written" in again.stderr
    assert machine.exec(["cat", "/home/alice/table.csv"]).stdout == b"a,b\n1,2\n"
    refused = machine.exec(["cairn", "artifacts", run_id, "root-1", "passwd"], user="alice",
                           check=False)
    assert refused.returncode != 0 and b"published no artifact passwd" in refused.stderr
    other = machine.exec(["cairn", "artifacts", run_id], user="bob", check=False)
    assert other.returncode != 0 and f"no run {run_id}".encode() in other.stderr
