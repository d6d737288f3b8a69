"""What ``cairn show`` claims, on an installed cairn: a run of more than 1,000 events shows
its true latest event and its replay divergence, a view over contradictory journal rows
reports an integrity issue, and review refuses a ``flow.*`` kind this release does not
carry out before anything runs."""

from __future__ import annotations

import json
from typing import Any

from machine import Machine
from test_recovery import wait_finished

JOURNAL = "/var/lib/cairn/journal/journal.db"
# The journal's own user: a root connection could leave root-owned -wal/-shm files behind.
AS_CAIRN = ["runuser", "-u", "cairn", "--"]
ITEMS = 600  # an unroll marker, one per item and a last one: two events each

MANY_MARKERS = '''
from typing import Any

from cairn.workflow import Field, Model, workflow


class Steps(Model):
    steps: list[str] = Field(min_length=1)


class Count(Model):
    count: int


@workflow(description="A long worklist without agents.", input=Steps, output=Count)
async def run(flow: Any, args: Steps) -> Count:
    done = await flow.unroll(args.steps, lambda step: step, title="Many")
    return Count(count=len(done))
'''

MEASURING = '''
from typing import Any

from cairn.workflow import Field, Model, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


@workflow(description="Measures.", input=Goal, output=Goal)
async def run(flow: Any, args: Goal) -> Goal:
    await flow.measure_proposal("bench", ["runtime"], {"samples": 3}, ["src/"])
    return args
'''

SIDE = {"kind": "unroll", "request": {"title": "Many"}, "location": "many.py:17:18",
        "predecessor": None}
DIVERGED = {"fields": ["request_hash"], "journal": SIDE, "replay": {**SIDE, "request": {}}}

# Run as cairn in the machine (argv: journal, run ID, the divergence as JSON): rows cairn
# never writes, the way a damaged journal or another writer would hold them.
WRITE_ROWS = """
import json, sqlite3, sys
path, run_id, diverged = sys.argv[1:]
db = sqlite3.connect(path, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute(
    "INSERT INTO operations (run_id, scope, seq, op_id, kind, request, request_hash,"
    " source_location, state, created_at, updated_at) VALUES"
    " (?, 'root', 900, 'root-900', 'item', ?, 'sha256:0', 'x.py:1:1', 'committed', 1, 2)",
    (run_id, json.dumps({"worklist": "Ghost", "index": 0, "label": "g"})),
)
db.execute(
    "INSERT INTO events (run_id, op_id, event, data, at)"
    " VALUES (?, 'root-1', 'replay-diverged', ?, 3)",
    (run_id, diverged),
)
db.executemany(
    "INSERT INTO events (run_id, event, data, at) VALUES (?, 'filler', '{}', 4)",
    [(run_id,)] * 200,
)
db.execute("COMMIT")
print(db.execute("SELECT max(cursor) FROM events WHERE run_id=?", (run_id,)).fetchone()[0])
"""


def review_hash(machine: Machine, path: str) -> str:
    out = machine.exec(["cairn", "workflow", "review", path], user="alice").stdout.decode()
    return out.strip().splitlines()[-1].split()[-1]


def show(machine: Machine, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        machine.exec(["cairn", "show", run_id, "--json"], user="alice").stdout
    )
    return data


def test_a_long_run_shows_its_latest_event_divergence_and_contradictions(
    machine: Machine,
) -> None:
    project = "/home/alice/long"
    machine.exec(["mkdir", "-p", project], user="alice")
    machine.exec(["tee", "/home/alice/many.py"], user="alice", input=MANY_MARKERS.encode())
    steps = [f"step {n}" for n in range(ITEMS)]
    out = machine.exec(
        ["cairn", "launch", "/home/alice/many.py", "--confirm",
         review_hash(machine, "/home/alice/many.py"), "--project", project,
         "--args", json.dumps({"steps": steps})],
        user="alice",
    )
    run_id = out.stdout.decode().strip().splitlines()[-1]
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"count": ITEMS}

    # More than a thousand events; the view lists a bounded window and says so, but its
    # latest event is the journal's latest.
    assert data["events_total"] > 1_200
    assert data["events_omitted"] == data["events_total"] - len(data["events"]) > 0
    assert data["events_shown"].endswith(f"of {data['events_total']} events; "
                                         f"{data['events_omitted']} omitted")
    newest = machine.exec(
        [*AS_CAIRN, "python3", "-I", "-c",
         "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
         "'SELECT max(cursor) FROM events WHERE run_id=?', (sys.argv[2],)).fetchone()[0])",
         JOURNAL, run_id],
    ).stdout.decode().strip()
    assert data["latest_event"]["cursor"] == int(newest)
    assert data["latest_event"]["event"] == "run-succeeded"
    assert data["events"][-1] == data["latest_event"]
    assert data["divergence"] is None
    assert data["integrity"] == {"ok": True, "issues": []}
    (worklist,) = data["worklists"]
    assert (worklist["title"], worklist["complete"], worklist["done"]) == ("Many", True, ITEMS)
    text = machine.exec(["cairn", "show", run_id], user="alice").stdout.decode()
    assert f"✓ Many r1 · {ITEMS}/{ITEMS} · done" in text
    assert f"latest #{newest} " in text

    # A divergence 200 events before the end, and an item of a worklist no unroll made.
    written = machine.exec(
        [*AS_CAIRN, "python3", "-I", "-c", WRITE_ROWS, JOURNAL, run_id, json.dumps(DIVERGED)]
    )
    data = show(machine, run_id)
    assert data["latest_event"]["cursor"] == int(written.stdout.decode().strip())
    assert data["divergence"] == {"op_id": "root-1", **DIVERGED}
    assert [e for e in data["events"] if e["event"] == "replay-diverged"] == []  # omitted
    assert data["integrity"]["ok"] is False
    assert [(i["code"], i["op_id"]) for i in data["integrity"]["issues"]] == [
        ("item-without-unroll", "root-900")]
    assert [w["title"] for w in data["worklists"]] == ["Many"]
    text = machine.exec(["cairn", "show", run_id], user="alice").stdout.decode()
    assert "integrity: 1 contradiction(s) in the journal" in text
    assert "replay diverged at root-1 (request_hash):" in text
