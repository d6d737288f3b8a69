"""Experiments in a booted machine (ARCHITECTURE §4.1): a host evaluator whose metric the
test controls (the number in score.txt), a baseline, one accepted and one rejected trial.
After the rejection W equals the best accepted checkpoint file by file, the live project
ends with the accepted change only, and every measurement ran its units once, also when
the coordinator is killed at the failpoints inside measurement and disposition."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine
from test_end_to_end import cairn
from test_escapes import fresh_project, tree
from test_recovery import EXPERIMENT_FAILPOINTS, assert_fired, failpoint_enabled, wait_finished

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = (REPO / "tests" / "system" / "data" / "experiment.py").read_text()
EVALUATOR = """\
argv = ["/bin/sh", "-c", "echo warming; printf '{\\"cairn_metrics\\": {\\"score\\": %s}}\\\\n' \
\\"$(cat score.txt)\\""]
timeout_sec = 60
warmups = 1
samples = 3
network = false
"""
READ_RECEIPT = (
    "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
    "'SELECT body FROM receipts WHERE run_id=? AND intent_id=?', sys.argv[2:]).fetchone()[0])"
)
SUBVOLUME = (
    "import btrfsutil, sys; i = btrfsutil.subvolume_info(sys.argv[1]); "
    "print(bytes(i.uuid).hex(), bytes(i.parent_uuid).hex())"
)
READ_RESULT = (
    "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
    "'SELECT result FROM operations WHERE run_id=? AND op_id=?', sys.argv[2:]).fetchone()[0])"
)


@pytest.fixture(scope="module")
def booted(deb: Path) -> Iterator[Machine]:
    with Machine(deb, with_pool=True) as machine:
        machine.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
        machine.exec(["tee", "/etc/cairn/evaluators.d/score.toml"], input=EVALUATOR.encode())
        yield machine


def agent_script(score: str, name: str) -> dict[str, Any]:
    return {
        "steps": [
            {"action": "write", "path": "score.txt", "content": f"{score}\n"},
            {"action": "write", "path": f"{name}.txt", "content": "{prompt}\n"},
        ],
        "output": {"summary": name},
        "handoff": f"{name} set the score to {score}",
    }


def launch(machine: Machine) -> tuple[str, str]:
    project = fresh_project(machine, "alice")
    machine.exec(["tee", f"{project}/score.txt"], user="alice", input=b"3\n")
    machine.exec(["tee", "/home/alice/experiment.py"], user="alice", input=WORKFLOW.encode())
    args = []
    for name, score in (("good", "1"), ("bad", "5")):
        path = f"/home/alice/{name}.json"
        machine.exec(["tee", path], user="alice",
                     input=json.dumps(agent_script(score, name)).encode())
        args += ["--scripted", f"test:{name}={path}"]
    review = cairn(machine, "workflow", "review", "/home/alice/experiment.py")
    assert "evaluator:score" in review
    review_hash = review.strip().splitlines()[-1].split()[-1]
    out = cairn(machine, "launch", "/home/alice/experiment.py", "--confirm", review_hash,
                "--project", project, "--args", '{"goal": "faster"}', *args)
    return project, out.strip().splitlines()[-1]


def measure_units(machine: Machine, run_id: str) -> dict[str, int]:
    """unit name -> how often systemd started it."""
    text = machine.exec(["journalctl", "--no-pager", "-o", "cat", "_PID=1"]).stdout.decode()
    starts: dict[str, int] = {}
    for unit in re.findall(rf"Started (cairn-measure-{run_id}-[a-z0-9-]+\.service)", text):
        starts[unit] = starts.get(unit, 0) + 1
    return starts


def check_experiment(machine: Machine, project: str, run_id: str) -> dict[str, Any]:
    data = wait_finished(machine, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "best root-4, rejected root-7"}
    ops = {o["op_id"]: o for o in data["operations"]}
    assert [ops[f"root-{n}"]["kind"] for n in range(1, 9)] == [
        "measure_proposal", "settle_experiment", "agent", "measure_proposal",
        "settle_experiment", "agent", "measure_proposal", "settle_experiment",
    ]
    assert all(o["state"] == "committed" for o in ops.values())
    # the experiment facet: baseline, best, gain and the rejected candidate
    (facet,) = data["experiments"]
    assert (facet["scope"], facet["metric"]) == ("root", "score")
    assert facet["baseline"] == {"measurement": "root-1", "value": 3.0}
    assert facet["best"] == {"measurement": "root-4", "value": 1.0}
    assert facet["latest"] == {"measurement": "root-7", "value": 5.0}
    assert facet["gain"] == pytest.approx(2 / 3)
    assert [(c["measurement"], c["value"], c["disposition"]) for c in facet["candidates"]] == [
        ("root-1", 3.0, "accepted"), ("root-4", 1.0, "accepted"), ("root-7", 5.0, "rejected"),
    ]
    # the measurements' raw samples and environment, as the journal keeps them
    kernel = machine.exec(["uname", "-r"]).stdout.decode().strip()
    for n in (1, 4, 7):
        measured = json.loads(machine.exec(
            ["python3", "-c", READ_RESULT, "/var/lib/cairn/journal/journal.db", run_id,
             f"root-{n}"],
        ).stdout)
        assert len(measured["samples"]) == 3
        assert measured["environment"]["evaluator"] == "score"
        assert measured["environment"]["kernel"] == kernel
        assert measured["checkpoint"] == {1: None, 4: "root-3", 7: "root-6"}[n]
    # after the rejection W is the best accepted checkpoint, file by file
    pool = f"/var/lib/cairn/pool/runs/{run_id}"
    assert tree(machine, f"{pool}/scopes/root/W.2") == tree(machine, f"{pool}/checkpoints/root-3")
    assert machine.exec(["test", "-e", f"{pool}/scopes/root/W.1"], check=False).returncode != 0
    assert machine.exec(["test", "-e", f"{pool}/measure"], check=False).returncode != 0
    check_hot_spare(machine, run_id, pool)
    # the live project has the accepted change only
    assert machine.exec(["cat", f"{project}/score.txt"]).stdout == b"1\n"
    assert machine.exec(["cat", f"{project}/good.txt"]).stdout == b"faster\n"
    assert machine.exec(["test", "-e", f"{project}/bad.txt"], check=False).returncode != 0
    # each measurement: one warm-up and three samples, each unit started once
    units = measure_units(machine, run_id)
    assert sorted(units) == sorted(
        f"cairn-measure-{run_id}-root-{n}-1-{i}.service" for n in (1, 4, 7) for i in range(4)
    )
    assert set(units.values()) == {1}
    return data


def check_hot_spare(machine: Machine, run_id: str, pool: str) -> None:
    """The accept of root-3 (root-5) made the scope's hot spare of it; the reject (root-8)
    took it by rename as W.2 and made the next spare of the same checkpoint."""
    def w_receipt(intent_id: str) -> dict[str, Any]:
        body = machine.exec(["python3", "-c", READ_RECEIPT, "/var/lib/cairn/broker/receipts.db",
                             run_id, intent_id]).stdout
        return json.loads(body)["data"]["w"]  # type: ignore[no-any-return]

    def subvolume(path: str) -> list[str]:
        return machine.exec(["python3", "-c", SUBVOLUME, path]).stdout.decode().split()

    spare, created = w_receipt("spare.root-5"), w_receipt("create-w.root.2")
    checkpoint_uuid = subvolume(f"{pool}/checkpoints/root-3")[0]
    assert spare["path"] == f"{pool}/scopes/root/spare.root-5"
    assert created["uuid"] == spare["uuid"] == subvolume(f"{pool}/scopes/root/W.2")[0]
    assert machine.exec(["test", "-e", spare["path"]], check=False).returncode != 0
    assert subvolume(f"{pool}/scopes/root/spare.root-8")[1] == checkpoint_uuid
    assert w_receipt("spare.root-8")["read_only"] is False
    # the attack: the run's owner (whose agent the next reject hands W) or anyone else
    # writing into the spare, or reading it; only root reaches it
    for user in ("alice", "bob"):
        for argv in (["touch", f"{pool}/scopes/root/spare.root-8/planted"],
                     ["ls", f"{pool}/scopes/root/spare.root-8"]):
            assert machine.exec(argv, user=user, check=False).returncode != 0, (user, argv)


def test_one_accepted_and_one_rejected_trial(booted: Machine) -> None:
    project, run_id = launch(booted)
    check_experiment(booted, project, run_id)


GAMER = {
    "steps": [
        {"action": "write", "path": "score.txt", "content": "1\n"},  # the metric, outside src/
        {"action": "write", "path": "src/fast.py", "content": "fast = True\n"},
        {"action": "write", "path": "clear\u001b[2J.txt", "content": "x\n"},
    ],
    "output": {"summary": "faster"},
    "handoff": "made it faster",
}


def test_a_trial_that_changed_paths_outside_the_write_paths_is_never_accepted(
    booted: Machine,
) -> None:
    """write_paths=["src/**"]: the agent improves the score by editing score.txt, which
    the evaluator reads, beside src/. The measurement records what the settlement would
    refuse (the owner's trial-check unit judged it), the accept is refused naming the
    paths, escaped, the reject restores W, and the project stays as it was."""
    project = fresh_project(booted, "alice")
    booted.exec(["tee", f"{project}/score.txt"], user="alice", input=b"3\n")
    before = tree(booted, project)
    source = (REPO / "tests" / "system" / "data" / "experiment_paths.py").read_bytes()
    booted.exec(["tee", "/home/alice/experiment_paths.py"], user="alice", input=source)
    booted.exec(["tee", "/home/alice/gamer.json"], user="alice",
                input=json.dumps(GAMER).encode())
    review = cairn(booted, "workflow", "review", "/home/alice/experiment_paths.py")
    assert "write paths   src/**" in review
    review_hash = review.strip().splitlines()[-1].split()[-1]
    out = cairn(booted, "launch", "/home/alice/experiment_paths.py", "--confirm", review_hash,
                "--project", project, "--args", '{"goal": "faster"}',
                "--scripted", "test:gamer=/home/alice/gamer.json")
    run_id = out.strip().splitlines()[-1]
    data = wait_finished(booted, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {
        "summary": "rejected root-4: 2 changes the settlement refuses"}
    measured = json.loads(booted.exec(
        ["python3", "-c", READ_RESULT, "/var/lib/cairn/journal/journal.db", run_id, "root-4"],
    ).stdout)
    assert measured["values"] == {"score": 1.0}
    assert measured["refused"] == [
        {"path": "clear\x1b[2J.txt", "reason": "outside the write paths"},
        {"path": "score.txt", "reason": "outside the write paths"},
    ]
    (facet,) = data["experiments"]
    assert [(c["measurement"], c["disposition"]) for c in facet["candidates"]] == [
        ("root-1", "accepted"), ("root-4", "refused"), ("root-4", "rejected")]
    shown = cairn(booted, "show", run_id)
    assert "\x1b" not in shown
    assert "! root-4 1 refused — cannot accept: root-4 changed what the settlement " \
        "refuses: clear\\x1b[2J.txt (outside the write paths), score.txt (outside the " \
        "write paths); reject it" in shown, shown
    # one check per measurement, each unit started once; nothing of it left
    text = booted.exec(["journalctl", "--no-pager", "-o", "cat", "_PID=1"]).stdout.decode()
    started = re.findall(rf"Started (cairn-trial-{run_id}-[a-z0-9-]+\.service)", text)
    assert sorted(started) == [f"cairn-trial-{run_id}-root-1-1.service",
                               f"cairn-trial-{run_id}-root-4-1.service"]
    pool = f"/var/lib/cairn/pool/runs/{run_id}"
    assert booted.exec(["test", "-e", f"{pool}/trial"], check=False).returncode != 0
    assert tree(booted, project) == before



@pytest.mark.parametrize("name", sorted(EXPERIMENT_FAILPOINTS))
def test_recovers_from_a_crash_inside_measurement_or_disposition(
    booted: Machine, name: str
) -> None:
    with failpoint_enabled(booted, name):
        project, run_id = launch(booted)
        data = check_experiment(booted, project, run_id)
    assert_fired(booted, run_id, name)
    restarts = sum(1 for e in data["events"] if e["event"] == "lease-acquired") - 1
    assert restarts >= 1 or name.startswith("broker-")  # a broker's crash fails one call


def test_an_evaluator_the_host_does_not_configure_refuses_the_launch(booted: Machine) -> None:
    source = WORKFLOW.replace('"score", metrics', '"missing", metrics')
    booted.exec(["tee", "/home/alice/unknown.py"], user="alice", input=source.encode())
    review = cairn(booted, "workflow", "review", "/home/alice/unknown.py")
    review_hash = review.strip().splitlines()[-1].split()[-1]
    project = fresh_project(booted, "alice")
    proc = booted.exec(["cairn", "launch", "/home/alice/unknown.py", "--confirm", review_hash,
                        "--project", project, "--args", '{"goal": "g"}',
                        "--scripted", "test:good=/home/alice/good.json",
                        "--scripted", "test:bad=/home/alice/bad.json"],
                       user="alice", check=False)
    assert proc.returncode != 0
    assert "evaluator 'missing', which is not configured" in proc.stderr.decode()


BENCH = """\
argv = ["/bin/sh", "-c", "printf '{\\"cairn_metrics\\": {\\"lines\\": %s}}\\\\n' \
\\"$(wc -l < notes.txt)\\""]
timeout_sec = 60
samples = 2
"""


def test_builtin_optimize_rejects_every_trial_that_loses(booted: Machine) -> None:
    """builtin:optimize with a scripted implementer that appends a line to notes.txt and
    the host's ``bench`` counting them (fewer is better): each trial loses, its accept is
    refused, the workflow rejects it and W is restored; the project stays as it was."""
    booted.exec(["tee", "/etc/cairn/evaluators.d/bench.toml"], input=BENCH.encode())
    project = fresh_project(booted, "alice")
    booted.exec(["tee", f"{project}/notes.txt"], user="alice", input=b"one\n")
    before = tree(booted, project)
    script = {"steps": [{"action": "append", "path": "notes.txt", "content": "more\n"}],
              "output": {"summary": "appended"}, "handoff": "appended a line"}
    booted.exec(["tee", "/home/alice/append.json"], user="alice",
                input=json.dumps(script).encode())
    out = cairn(booted, "launch", "builtin:optimize", "--project", project, "--args",
                json.dumps({"objective": "fewer notes", "metric": "lines", "max_trials": 2}),
                "--scripted", "builtin:implementer=/home/alice/append.json")
    run_id = out.strip().splitlines()[-1]
    data = wait_finished(booted, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {
        "summary": "0 of 2 trials accepted; lines went from 1.0 to 1.0",
        "trials": 2, "accepted": 0, "target_reached": False,
    }
    (facet,) = data["experiments"]
    assert [c["disposition"] for c in facet["candidates"]] == [
        "accepted", "refused", "rejected", "refused", "rejected"]
    assert facet["best"]["measurement"] == "root-1"
    assert tree(booted, project) == before


def test_builtin_optimize_measures_with_the_evaluator_its_argument_names(
    booted: Machine,
) -> None:
    """builtin:optimize launched with ``"evaluator": "score"`` (not its default ``bench``):
    the launch freezes ``score``, every measurement names it and reads its metric, and the
    accepted trial settles. Its first trial reaches the target, so of three trials allowed
    only one is made; ``cairn show`` prints the target and the trial's report."""
    project = fresh_project(booted, "alice")
    booted.exec(["tee", f"{project}/score.txt"], user="alice", input=b"3\n")
    booted.exec(["tee", "/home/alice/lower.json"], user="alice",
                input=json.dumps(agent_script("1", "good")).encode())
    out = cairn(booted, "launch", "builtin:optimize", "--project", project, "--args",
                json.dumps({"objective": "lower score", "evaluator": "score",
                            "metric": "score", "max_trials": 3, "target": 1}),
                "--scripted", "builtin:implementer=/home/alice/lower.json")
    run_id = out.strip().splitlines()[-1]
    data = wait_finished(booted, run_id)
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    output = data["run"]["output"]
    assert (output["trials"], output["accepted"], output["target_reached"]) == (1, 1, True)
    measures = [o for o in data["operations"] if o["kind"] == "measure_proposal"]
    assert [o["op_id"] for o in measures] == ["root-1", "root-4"]
    assert {o["request"]["evaluator"] for o in measures} == {"score"}
    for op in measures:
        measured = json.loads(booted.exec(
            ["python3", "-c", READ_RESULT, "/var/lib/cairn/journal/journal.db", run_id,
             op["op_id"]],
        ).stdout)
        assert measured["evaluator"] == "score"
        assert measured["environment"]["evaluator"] == "score"
        assert len(measured["samples"]) == 3  # score.toml's samples, not bench.toml's
    (facet,) = data["experiments"]
    assert (facet["metric"], facet["baseline"]["value"], facet["best"]["value"]) == (
        "score", 3.0, 1.0)
    assert facet["target"] == {"value": 1.0, "reached": True}
    assert facet["candidates"][1]["report"] == {
        "hypothesis": "trial 1: a change can make score lower", "intervention": "good",
        "conclusion": "score measured 1.0 against the best 3.0"}
    shown = cairn(booted, "show", run_id)
    assert "· target 1 reached" in shown and "      intervention: good" in shown
    assert booted.exec(["cat", f"{project}/score.txt"]).stdout == b"1\n"


def test_a_launch_argument_naming_an_unconfigured_evaluator_is_refused(
    booted: Machine,
) -> None:
    """Refused before the run exists: no run is added."""
    project = fresh_project(booted, "alice")
    before = json.loads(cairn(booted, "list", "--json"))
    proc = booted.exec(["cairn", "launch", "builtin:optimize", "--project", project,
                        "--args", json.dumps({"objective": "o", "evaluator": "nope"})],
                       user="alice", check=False)
    assert proc.returncode != 0
    err = proc.stderr.decode()
    assert "the launch argument 'evaluator' names evaluator 'nope', which is not configured" \
        in err
    assert "launch with evaluator set to one of:" in err and "score" in err
    assert json.loads(cairn(booted, "list", "--json")) == before


NETBENCH = """\
argv = ["/usr/bin/python3", "-c", '''
import json, socket, urllib.request
def fetched(url):
    try:
        return int(urllib.request.urlopen(url, timeout=10).read() == b"hello\\n")
    except Exception:
        return 0
def direct():
    try:
        socket.create_connection(("127.0.0.1", 80), timeout=3)
        return 1
    except OSError:
        return 0
print(json.dumps({"cairn_metrics": {"allowed": fetched("http://allowed.test/hello.txt"),
                                    "denied": fetched("http://denied.test/hello.txt"),
                                    "direct": direct()}}))
''']
timeout_sec = 60
samples = 1
network = "allowlist"
allowlist = ["allowed.test"]
"""


def test_an_evaluator_its_host_allows_a_domain_reaches_it_and_nothing_else(
    booted: Machine,
) -> None:
    """network = "allowlist" in the evaluator's file: its runs reach allowed.test through
    the run's proxy, are refused denied.test by it, and cannot connect anywhere directly;
    cairn show names the domains on the experiment's line."""
    booted.exec(["tee", "/etc/cairn/evaluators.d/netbench.toml"], input=NETBENCH.encode())
    booted.exec(["mkdir", "-p", "/srv/www"])
    booted.exec(["tee", "/srv/www/hello.txt"], input=b"hello\n")
    booted.exec(["tee", "-a", "/etc/hosts"], input=b"127.0.0.1 allowed.test denied.test\n")
    booted.exec(["systemd-run", "--unit=web", "--collect", "python3", "-m", "http.server",
                 "80", "--bind", "127.0.0.1", "--directory", "/srv/www"])
    try:
        project = fresh_project(booted, "alice")
        source = (REPO / "tests" / "system" / "data" / "measure_network.py").read_bytes()
        booted.exec(["tee", "/home/alice/measure_network.py"], user="alice", input=source)
        review = cairn(booted, "workflow", "review", "/home/alice/measure_network.py")
        review_hash = review.strip().splitlines()[-1].split()[-1]
        out = cairn(booted, "launch", "/home/alice/measure_network.py", "--confirm",
                    review_hash, "--project", project, "--args", '{"goal": "reach"}')
        run_id = out.strip().splitlines()[-1]
        data = wait_finished(booted, run_id)
        assert data["run"]["state"] == "succeeded", data["run"]["error"]
        proxy_log = booted.journal(unit=f"cairn-proxy-{run_id}.service")
        assert data["run"]["output"] == {"allowed": 1.0, "denied": 0.0, "direct": 0.0}, \
            proxy_log
        assert "allowlist proxy refused denied.test:80" in proxy_log
        (facet,) = data["experiments"]
        assert facet["network"] == ["allowed.test"]
        assert "· evaluator network allowed.test" in cairn(booted, "show", run_id)
    finally:
        booted.exec(["systemctl", "stop", "web"], check=False)
        booted.exec(["rm", "-f", "/etc/cairn/evaluators.d/netbench.toml"])
