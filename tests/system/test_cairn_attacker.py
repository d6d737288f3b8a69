"""The ``cairn`` service user as the attacker (ARCHITECTURE §7): code running as cairn —
what a bug in cairnd, a coordinator's relay or agent socket would give an agent — rewrites
the journal it owns and calls the root broker directly. Root must refuse every attempt,
and nothing may run, be read or be written as any other user, checked from outside (PID
1's units, the pool, the broker's own pins).

One booted machine for the module: alice's runs are real launches through the CLI; every
forgery is undone before the next case.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import TEST_USERS, Machine
from test_end_to_end import SCRIPT, cairn, finished, launch, make_project, wait_for, write_script

ATTACKER = "/usr/local/lib/cairn-attacker.py"
SOURCE = Path(__file__).parent / "data" / "cairn_attacker.py"
SLOW_SCRIPT = {
    "steps": [
        {"action": "write", "path": "CHANGELOG.md", "content": "# Changelog\n\n- slow\n"},
        {"action": "sleep", "seconds": 120},
    ],
    "output": {"summary": "slow"},
}


@pytest.fixture(scope="module")
def host(deb: Path) -> Iterator[dict[str, Any]]:
    """A machine where alice has one finished run (pinned on her attestation) and bob a
    private file; the attacker's script installed for cairn to run."""
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["tee", ATTACKER], input=SOURCE.read_bytes())
        machine.exec(["chmod", "0755", ATTACKER])
        machine.exec(["tee", "/home/bob/secret"], user="bob", input=b"bob's private key\n")
        machine.exec(["chmod", "0600", "/home/bob/secret"], user="bob")
        project = make_project(machine)
        run_id = launch(machine, project, write_script(machine, SCRIPT), "pinned")
        wait_for(machine, run_id, finished)
        yield {"machine": machine, "run": run_id, "project": project, "forged": []}


@pytest.fixture(autouse=True)
def forged_runs_end(host: dict[str, Any]) -> Iterator[None]:
    """A forged run is left pending for its case, then ended: pending runs hold slots of
    the machine's admission, and alice's runs of later cases must start."""
    yield
    if host["forged"]:
        attack(host["machine"], "sql", "UPDATE runs SET state='failed' WHERE run_id IN "
               f"({','.join('?' * len(host['forged']))})", json.dumps(host["forged"]))


def attack(machine: Machine, *args: str) -> dict[str, Any]:
    proc = machine.exec(["python3", ATTACKER, *args], user="cairn", check=False, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.decode().splitlines()[-1])
    return result


def refused(reply: dict[str, Any], pattern: str) -> None:
    assert reply["ok"] is False, reply
    assert pattern in reply["error"], reply
    assert reply["code"] != "internal", reply


def new_run() -> str:
    return "flow_" + secrets.token_hex(16)


def forge(host: dict[str, Any], owner: str, home: str) -> str:
    run_id = new_run()
    attack(host["machine"], "forge", run_id, host["run"], owner, home)
    host["forged"].append(run_id)
    return run_id


def pinned(machine: Machine, run_id: str) -> bool:
    out = machine.exec(["python3", "-c", (
        "import sqlite3,sys; db=sqlite3.connect('file:/var/lib/cairn/broker/receipts.db"
        "?mode=ro', uri=True); print(db.execute('SELECT count(*) FROM pins WHERE run_id=?',"
        " (sys.argv[1],)).fetchone()[0])"), run_id]).stdout.decode()
    return out.strip() == "1"


# --- a run nobody attested ------------------------------------------------------------


@pytest.mark.parametrize("verb", ["storage-v1", "launch-v1"])
def test_a_run_cairn_forged_for_another_user_gets_nothing_from_root(
    host: dict[str, Any], verb: str
) -> None:
    machine = host["machine"]
    run_id = forge(host, "bob", "/home/bob")
    refused(attack(machine, "broker", verb, run_id), "was never attested by its owner")
    assert not pinned(machine, run_id)


def test_a_run_cairn_forged_on_the_owners_own_secrets_is_refused_too(
    host: dict[str, Any],
) -> None:
    machine = host["machine"]
    machine.exec(["mkdir", "-p", "/home/alice/.ssh"], user="alice")
    run_id = forge(host, "alice", "/home/alice/.ssh")
    refused(attack(machine, "broker", "storage-v1", run_id), "was never attested by its owner")


def test_cairn_cannot_attest_a_run_itself(host: dict[str, Any]) -> None:
    machine = host["machine"]
    run_id = forge(host, "bob", "/home/bob")
    launch_hash = attack(machine, "hash", run_id)["hash"]
    reply = attack(machine, "broker", "launch-v1", run_id, f"own-channel:{launch_hash}")
    refused(reply, "is attested by the run's owner, not by uid")
    assert not pinned(machine, run_id)


@pytest.mark.parametrize(
    ("fds", "verb", "pattern"),
    [
        ("dir", "launch-v1", "the attestation channel is not a socket"),
        ("pipe", "launch-v1", "the attestation channel is not a socket"),
        ("two", "launch-v1", "expected '<launch-v1|storage-v1|delete-v1>"),
        ("dir", "storage-v1", "expected '<launch-v1|storage-v1|delete-v1>"),
    ],
)
def test_a_descriptor_that_is_not_an_owners_channel_is_refused(
    host: dict[str, Any], fds: str, verb: str, pattern: str
) -> None:
    machine = host["machine"]
    run_id = forge(host, "bob", "/home/bob")
    refused(attack(machine, "broker", verb, run_id, fds), pattern)
    assert not pinned(machine, run_id)


# --- a pinned run's description, rewritten ------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("$.owner_uid", str(TEST_USERS["bob"])),
        ("$.project.root", '"/home/bob"'),
        ("$.profiles", '{"builtin:implementer": {"name": "builtin:implementer", '
                       '"kind": "command", "argv": ["/bin/sh", "-c", "id"]}}'),
        ("$.profiles", '{"builtin:implementer": {"name": "builtin:implementer", '
                       '"kind": "command", "argv": ["/usr/bin/true"], '
                       '"env": {"LD_PRELOAD": "/tmp/evil.so"}}}'),
        ("$.policy.write_paths", '["../**"]'),
        ("$.source", '"print(1)"'),
        ("$.verifiers", '[{"name": "evil", "argv": ["/bin/sh"], "timeout_sec": 5, '
                        '"config_sha256": "x"}]'),
        ("$.limits.memory_max", "1099511627776"),
        ("$.capsule_hash", '"sha256:0000"'),
    ],
)
def test_a_rewritten_description_of_a_pinned_run_is_refused_by_every_verb(
    host: dict[str, Any], path: str, value: str
) -> None:
    machine, run_id = host["machine"], host["run"]
    attack(machine, "set", run_id, path, value)
    try:
        for verb in ("storage-v1", "launch-v1", "delete-v1"):
            refused(attack(machine, "broker", verb, run_id), "is not the one its owner attested")
    finally:
        attack(machine, "restore", run_id)
    assert attack(machine, "broker", "storage-v1", run_id)["ok"] is True


def test_a_row_carrying_another_runs_description_is_refused(host: dict[str, Any]) -> None:
    machine, run_id = host["machine"], host["run"]
    other = forge(host, "bob", "/home/bob")
    attack(machine, "set", run_id, "$.run_id", json.dumps(other))
    try:
        refused(attack(machine, "broker", "storage-v1", run_id),
                f"the journal's description of {run_id} names {other}")
    finally:
        attack(machine, "restore", run_id)


def test_an_upgrade_cairn_made_alone_is_not_re_pinned(host: dict[str, Any]) -> None:
    machine, run_id = host["machine"], host["run"]
    attack(machine, "set", run_id, "$.source", '"print(2)"')
    try:
        refused(attack(machine, "broker", "launch-v1", run_id), "is not the one its owner attested")
        launch_hash = attack(machine, "hash", run_id)["hash"]
        refused(attack(machine, "broker", "launch-v1", run_id, f"own-channel:{launch_hash}"),
                "not by uid")
    finally:
        attack(machine, "restore", run_id)


# --- intents and receipts -------------------------------------------------------------------


def test_another_runs_intent_in_this_runs_queue_is_refused(host: dict[str, Any]) -> None:
    machine, run_id = host["machine"], host["run"]
    other = forge(host, "bob", "/home/bob")
    body = {"intent_id": "verify-storage.evil", "run_id": other, "kind": "verify-storage"}
    attack(machine, "intent", run_id, json.dumps(body))
    try:
        refused(attack(machine, "broker", "storage-v1", run_id),
                "intent verify-storage.evil does not belong to storage-v1")
    finally:
        attack(machine, "sql", "DELETE FROM intents WHERE run_id=? AND intent_id=?",
               json.dumps([run_id, "verify-storage.evil"]))


def test_a_replayed_intent_of_an_ended_run_is_left_undone(host: dict[str, Any]) -> None:
    machine, run_id = host["machine"], host["run"]
    body = {"intent_id": "create-w.root.9", "run_id": run_id, "kind": "create-w",
            "generation": 9}
    attack(machine, "intent", run_id, json.dumps(body))
    reply = attack(machine, "broker", "storage-v1", run_id)
    assert reply["ok"] is True
    assert "create-w.root.9" not in {r["intent_id"] for r in reply["receipts"]}
    listed = machine.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"]).stdout.decode()
    assert "root.9" not in listed


def test_cairn_cannot_write_roots_receipts_or_pins(host: dict[str, Any]) -> None:
    proc = host["machine"].exec(
        ["python3", "-c", "import sqlite3; db=sqlite3.connect('/var/lib/cairn/broker/receipts.db');"
         " db.execute(\"DELETE FROM pins\"); db.commit()"], user="cairn", check=False)
    assert proc.returncode != 0
    assert "readonly" in proc.stderr.decode() or "unable to open" in proc.stderr.decode()
    assert pinned(host["machine"], host["run"])


# --- the journal file itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("create", "drop"),
    [
        ("CREATE VIEW evil AS SELECT * FROM runs", "DROP VIEW evil"),
        ("CREATE TRIGGER evil AFTER INSERT ON events BEGIN SELECT 1; END", "DROP TRIGGER evil"),
        ("CREATE INDEX evil ON runs(state)", "DROP INDEX evil"),
    ],
)
def test_a_journal_whose_schema_cairn_altered_is_refused(
    host: dict[str, Any], create: str, drop: str
) -> None:
    machine, run_id = host["machine"], host["run"]
    attack(machine, "sql", create)
    try:
        refused(attack(machine, "broker", "storage-v1", run_id),
                "has a schema its migrations did not make")
    finally:
        attack(machine, "sql", drop)
    assert attack(machine, "broker", "storage-v1", run_id)["ok"] is True


@pytest.mark.parametrize(
    "launch",
    [
        "json_object('pad', printf('%.*c', 100000000, 'x'))",  # a 100 MB row
        "printf('%.*c%.*c', 100000, '[', 100000, ']')",  # nested 100,000 deep
        "'not json at all'",
    ],
    ids=["100MB", "deep", "garbage"],
)
def test_a_row_root_cannot_read_safely_is_refused_not_a_crash(
    host: dict[str, Any], launch: str
) -> None:
    machine = host["machine"]
    run_id = forge(host, "bob", "/home/bob")
    attack(machine, "sql", f"UPDATE runs SET launch={launch} WHERE run_id=?", json.dumps([run_id]))
    started = time.monotonic()
    refused(attack(machine, "broker", "storage-v1", run_id), "cannot be read safely")
    assert time.monotonic() - started < 60


# --- the journal's word that a run ended ----------------------------------------------------


def test_cairn_cannot_delete_a_running_runs_storage_by_saying_it_ended(
    host: dict[str, Any],
) -> None:
    machine = host["machine"]
    run_id = launch(machine, host["project"], write_script(machine, SLOW_SCRIPT), "slow")
    wait_for(machine, run_id, lambda d: any(o["state"] == "started" for o in d["operations"]))
    attack(machine, "sql", "UPDATE runs SET state='succeeded', settlement='{}' WHERE run_id=?",
           json.dumps([run_id]))
    body = {"intent_id": "delete-run", "run_id": run_id, "kind": "delete-run"}
    attack(machine, "intent", run_id, json.dumps(body))
    try:
        refused(attack(machine, "broker", "delete-v1", run_id), "has not ended; nothing is deleted")
        listed = machine.exec(["btrfs", "subvolume", "list", "/var/lib/cairn/pool"])
        assert run_id in listed.stdout.decode()
    finally:
        attack(machine, "sql", "DELETE FROM intents WHERE run_id=? AND intent_id='delete-run'",
               json.dumps([run_id]))
        attack(machine, "sql", "UPDATE runs SET state='running', settlement=NULL WHERE run_id=?",
               json.dumps([run_id]))
        cairn(machine, "cancel", "--yes", run_id, check=False)


# --- a schedule cairnd keeps -------------------------------------------------------------


def test_a_schedule_cairn_rewrote_launches_nothing_its_owner_did_not_confirm(
    host: dict[str, Any],
) -> None:
    """cairnd stores the schedule; alice's own CLI keeps what she confirmed. A rewrite of
    the stored revision (arguments, project, scripted agent) is refused when her timer or
    run-now asks for a run: her CLI never attests it, so root starts nothing."""
    machine = host["machine"]
    machine.enable_user_manager("alice")
    other = "/home/alice/other-project"
    machine.exec(["mkdir", "-p", other], user="alice")
    created = json.loads(cairn(
        machine, "schedule", "create", "attacked", "builtin:implement",
        "--project", host["project"], "--args", json.dumps({"objective": "as confirmed"}),
        "--calendar", "2099-01-01 03:00:00", "--timezone", "UTC", "--catch-up", "none",
        "--max-runs", "5", "--valid-until", "2099-12-31T00:00:00Z",
        "--scripted", f"builtin:implementer={write_script(machine, SCRIPT)}", "--json",
    ))  # fmt: skip
    schedule_id = created["schedule_id"]
    cairn(machine, "schedule", "confirm", created["action"], created["challenge"])
    cairn(machine, "schedule", "resume", schedule_id)
    stored = attack(machine, "schedule-sql", "SELECT spec FROM revisions WHERE schedule_id=?",
                    json.dumps([schedule_id]))["rows"][0][0]
    for path, value, why in (
        ("$.args.objective", json.dumps("forged"), "the arguments objective are not the ones sent"),
        ("$.project", json.dumps(other), f"the project is {other!r}"),
        ("$.profiles.\"builtin:implementer\".output", json.dumps({"summary": "forged"}),
         "the scripted profiles are not the ones sent"),
    ):
        attack(machine, "schedule-sql", "UPDATE revisions SET spec=json_set(spec, ?, json(?))"
               " WHERE schedule_id=?", json.dumps([path, value, schedule_id]))
        try:
            refused_run = machine.exec(["cairn", "schedule", "run-now", schedule_id],
                                       user="alice", check=False, timeout=120)
        finally:
            attack(machine, "schedule-sql", "UPDATE revisions SET spec=? WHERE schedule_id=?",
                   json.dumps([stored, schedule_id]))
        err = refused_run.stderr.decode()
        assert refused_run.returncode != 0 and "not attesting" in err and why in err, err
    # read in Python: earlier cases left rows whose launch is no JSON SQLite reads
    rows = attack(machine, "sql", "SELECT run_id, launch FROM runs WHERE instr(launch, ?) > 0",
                  json.dumps([schedule_id]))["rows"]
    launched = [{"run": run} for run, launch in rows
                if json.loads(launch).get("schedule", {}).get("id") == schedule_id]
    assert len(launched) == 3, rows  # one refused launch per rewrite
    # nothing root pinned or started for the refused runs: each is failed, never pinned
    assert all(not pinned(machine, r["run"]) for r in launched), launched
    assert not any(name.startswith("cairn-coordinator@") for name in units_of(machine, launched))

    # three launches failed: the schedule blocks and waits for alice, who resumes it as
    # she confirmed it, and it launches that
    view = json.loads(cairn(machine, "schedule", "show", schedule_id, "--json"))
    assert view["status"] == "blocked", view
    cairn(machine, "schedule", "resume", schedule_id)
    run_id = cairn(machine, "schedule", "run-now", schedule_id).strip().splitlines()[-1]
    done = wait_for(machine, run_id, finished)
    assert done["run"]["state"] == "succeeded", done["run"]
    assert attack(machine, "sql", "SELECT json_extract(launch, '$.args.objective') FROM runs"
                  " WHERE run_id=?", json.dumps([run_id]))["rows"] == [["as confirmed"]]
    cairn(machine, "schedule", "delete", "--yes", schedule_id)


def units_of(machine: Machine, runs: list[dict[str, Any]]) -> list[str]:
    """Every unit PID 1 knows of for these runs."""
    names = machine.exec(["systemctl", "list-units", "--all", "--plain", "--no-legend"]
                         ).stdout.decode().split()
    return [n for n in names if any(r["run"] in n for r in runs)]


# --- from outside: nothing ran, was read or written as anyone else -------------------------------


def test_nothing_ran_or_was_made_for_any_forged_run(host: dict[str, Any]) -> None:
    machine = host["machine"]
    assert host["forged"], "the cases above forged runs"
    units = machine.exec(["systemctl", "list-units", "--all", "--plain", "--no-legend",
                          "cairn-*"]).stdout.decode()
    runs = machine.exec(["ls", "-A", "/var/lib/cairn/pool/runs"], check=False).stdout.decode()
    for run_id in host["forged"]:
        assert run_id not in units
        assert run_id not in runs
        assert not pinned(machine, run_id)
    # no import, agent or apply unit of a forged run ever started (PID 1's own journal), so
    # nothing read bob's files as bob
    started = machine.exec(["journalctl", "--no-pager", "-o", "cat", "_PID=1"],
                           check=False).stdout.decode()
    for run_id in host["forged"]:
        assert run_id not in started
    broker = machine.journal(unit="cairn-broker.service")
    assert "crashed" not in broker
