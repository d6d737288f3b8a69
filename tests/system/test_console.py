"""Cairn's Cockpit page in a real browser (issue 34): the ``cairn-cockpit`` package
installed with ``apt install ./cairn-cockpit_*.deb`` beside ``cairn`` and Debian's Cockpit
in a booted machine; headless Chromium logs in at Cockpit's login page as alice, finds
Cairn in the menu, reads the runs list, answers a run's question in the inbox, follows the
run to its applied diff and reverts it, retries a failed run from its checkpoint, reads a
run's lanes tree, worklist and experiment, and decides a blocked run's uncertain operation
(tests/system/console_browser.py drives it).

Everything the run shows was written by a hostile agent or workflow: payloads that would
run script or make elements if the page wrote them as markup, in a file name, file
content (the diff), the agent's summary (the run's output) and the question. The page
shows each as text and makes no element of any.

The screenshots of each page go to ``tests/system/artifacts/console/`` (the copies
``docs/console.md`` shows are in ``docs/console/``).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from machine import Machine

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "system" / "artifacts" / "console"
BROWSER = Path(__file__).with_name("console_browser.py")
# Cockpit as Debian 13 ships it, and the browser that drives it.
CONSOLE_PACKAGES = ("cockpit-ws", "cockpit-bridge", "cockpit-system", "chromium",
                    "chromium-driver", "python3-selenium")
PASSWORD = "correct horse battery staple"

# Each would run script, load something or make an element if written as markup.
PAYLOADS = [
    "<script>window.__xss=1</script>",
    "<img src=x onerror=window.__xss=2>",
    "<svg onload=window.__xss=3>",
    "'\"><img src=x onerror=window.__xss=4>",
    "<iframe src=javascript:parent.__xss=5></iframe>",
    "<a href=javascript:window.__xss=6>link</a>",
    "<details open ontoggle=window.__xss=7>",
    "<style>body{display:none}</style>",
    "{{constructor.constructor('window.__xss=9')()}}",
    "<body onload=window.__xss=10>",
    "<math><mtext><table><mglyph><style><img src=x onerror=window.__xss=11>",
    "<object data=javascript:window.__xss=12></object>",
]
NAME = "<img src=x onerror=window.__xss=13>.txt"

# A run with every facet the run page draws: a worklist, lanes and an experiment.
FACETS = '''"""A plan, two lanes and an accepted trial."""

from typing import Any

from cairn.workflow import Model, agent, workflow


class Nothing(Model):
    """No arguments."""


class Step(Model):
    summary: str


step = agent(profile="test:step", access="write", network="none", output=Step)
METRICS = {"score": {"unit": "points", "direction": "lower"}}
PLAN = "Plan <img src=x onerror=window.__xss=14><script>window.__xss=15</script>"


@workflow(description="Every facet of the run page.", input=Nothing, output=Step)
async def run(flow: Any, args: Nothing) -> Step:
    await flow.agent(step, prompt="first")

    async def carry_out(point: str) -> str:
        done = await flow.agent(step, prompt=point)
        return str(done.output.summary)

    planned = await flow.unroll(["one", "two"], carry_out, title=PLAN)
    lanes = await flow.map(["x", "y"], lambda key: flow.agent(step, prompt=key),
                           key=lambda key: key)
    await flow.measure_proposal("score", metrics=METRICS)
    await flow.agent(step, prompt="tuned")
    measured = await flow.measure_proposal("score", metrics=METRICS)
    await flow.settle_experiment(measured, "accept")
    return Step(summary=",".join([*planned, *sorted(lanes)]))
'''
STEP = {
    "steps": [{"action": "write", "path": "{prompt}.txt", "content": "from {prompt}\n"},
              {"action": "write", "path": "score.txt", "content": "2\n"}],
    "output": {"summary": "{prompt}"},
}
EVALUATOR = (REPO / "tests" / "system" / "data" / "score-evaluator.toml").read_text()
NETWORKED = (REPO / "tests" / "system" / "data" / "networked.py").read_text()
FETCH = {
    "steps": [{"action": "write", "path": "fetched.txt", "content": "{prompt}\n"}],
    "output": {"summary": "fetched {prompt}"},
}

WORKFLOW = '''"""A hostile agent's words become the question, the output and the diff."""

from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Goal(Model):
    goal: str = Field(min_length=1)


class Step(Model):
    summary: str = Field(min_length=1)


write = agent(profile="test:hostile", access="write", output=Step)


@workflow(description="Hostile text for the console.", input=Goal, output=Step)
async def run(flow: Any, args: Goal) -> Step:
    first = await flow.agent(write, prompt=args.goal)
    await flow.ask(f"Ship it? {first.output.summary}")
    await flow.approve(f"Apply {first.output.summary}", on_reject="fail")
    step: Step = first.output
    return step
'''

SCRIPT = {
    "steps": [{"action": "write", "path": NAME, "content": "".join(p + "\n" for p in PAYLOADS)}],
    "output": {"summary": " | ".join(PAYLOADS)},
}


def cockpit_deb(deb: Path) -> Path:
    version = deb.name.removeprefix("cairn_").removesuffix("_all.deb")
    path = deb.with_name(f"cairn-cockpit_{version}_all.deb")
    if not path.is_file():
        pytest.fail(f"{path} is missing: packaging/build-deb.sh builds it beside {deb.name}")
    return path


@pytest.fixture(scope="module")
def console(deb: Path) -> Iterator[Machine]:
    page = cockpit_deb(deb)
    with Machine(deb, with_pool=True, packages=CONSOLE_PACKAGES) as machine:
        # as a new user installs it: apt, from the file, next to what Debian's Cockpit is
        (machine.merged / "root" / page.name).write_bytes(page.read_bytes())
        installed = machine.exec(["apt", "install", "-y", f"/root/{page.name}"], check=False,
                                 timeout=300)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        machine.exec(["chpasswd"], input=f"alice:{PASSWORD}\n".encode())
        machine.exec(["systemctl", "start", "cockpit.socket"])
        machine.exec(["mkdir", "-p", "/etc/cairn/evaluators.d"])
        machine.exec(["tee", "/etc/cairn/evaluators.d/score.toml"], input=EVALUATOR.encode())
        for name, text in (("hostile.py", WORKFLOW), ("hostile.json", json.dumps(SCRIPT)),
                           ("facets.py", FACETS), ("step.json", json.dumps(STEP)),
                           ("networked.py", NETWORKED), ("fetch.json", json.dumps(FETCH))):
            machine.exec(["tee", f"/home/alice/{name}"], user="alice", input=text.encode())
        (machine.merged / "root" / BROWSER.name).write_bytes(BROWSER.read_bytes())
        yield machine


def cairn(machine: Machine, *argv: str) -> bytes:
    return bytes(machine.exec(["cairn", *argv], user="alice", timeout=120).stdout)


def launch(machine: Machine, project: str, definition: str = "hostile",
           args: str = '{"goal": "go"}', scripted: str = "test:hostile=hostile.json") -> str:
    machine.exec(["mkdir", "-p", project], user="alice")
    machine.exec(["tee", f"{project}/score.txt"], user="alice", input=b"3\n")
    path = f"/home/alice/{definition}.py"
    review = cairn(machine, "workflow", "review", path).decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    profile, script = scripted.split("=")
    return cairn(machine, "launch", path, "--confirm", review_hash, "--project", project,
                 "--args", args, "--scripted", f"{profile}=/home/alice/{script}",
                 ).decode().strip().splitlines()[-1]


def browse(machine: Machine, config: dict[str, Any]) -> dict[str, Any]:
    """What the person saw in the browser (console_browser.py), its screenshots copied to
    the artifacts."""
    shots = "/root/shots"
    out = machine.exec(["python3", f"/root/{BROWSER.name}", json.dumps(
        {"user": "alice", "password": PASSWORD, "shots": shots, **config})], timeout=600)
    seen: dict[str, Any] = json.loads(out.stdout.decode().splitlines()[-1])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for shot in (machine.merged / shots.lstrip("/")).glob("*.png"):
        shutil.copyfile(shot, ARTIFACTS / shot.name)
    assert "error" not in seen, json.dumps(seen, indent=1)[-4000:]
    return seen


def wait_state(machine: Machine, run_id: str, states: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while True:
        data: dict[str, Any] = json.loads(cairn(machine, "show", run_id, "--json"))
        if data["run"]["state"] in states:
            return data
        assert time.monotonic() < deadline, machine.journal(run_id=run_id)[-3000:]
        time.sleep(0.5)


def waiting_question(machine: Machine, run_id: str, kind: str = "question") -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while True:
        items = [i for i in json.loads(cairn(machine, "inbox", "--json"))
                 if i.get("run_id") == run_id and i["kind"] == kind]
        if items:
            return dict(items[0])
        assert time.monotonic() < deadline, machine.journal(run_id=run_id)[-3000:]
        time.sleep(0.5)


def test_a_person_answers_in_the_console_and_sees_the_applied_diff(console: Machine) -> None:
    machine = console
    other = launch(machine, "/home/alice/other")
    third = launch(machine, "/home/alice/third")
    doomed = launch(machine, "/home/alice/doomed")
    facets = launch(machine, "/home/alice/facets", "facets", "{}", "test:step=step.json")
    run_id = launch(machine, "/home/alice/project")
    question = waiting_question(machine, run_id)
    for waiting in (other, third, doomed):
        waiting_question(machine, waiting)
    # the doomed run's question answered here: its approval is rejected in the page
    cairn(machine, "answer", doomed, "--challenge",
          waiting_question(machine, doomed)["challenge"], "--", "no")
    waiting_question(machine, doomed, "approval")
    assert question["question"] == "Ship it? " + " | ".join(PAYLOADS)
    assert wait_state(machine, facets, ("succeeded", "failed"))["run"]["state"] == "succeeded"

    seen = browse(machine, {"run_id": run_id, "other": other, "third": third,
                            "doomed": doomed, "facets": facets, "answer": "yes <b>ship</b>"})

    # the page is in Cockpit's menu, and lists the runs 'cairn list' does
    assert any(href.endswith("/cairn") for href in seen["menu"]), seen["menu"]
    listed = [r["run_id"] for r in json.loads(cairn(machine, "list", "--json"))]
    assert sorted(seen["runs"]) == sorted([run_id, other, third, doomed, facets])
    assert sorted(listed) == sorted([*seen["runs"], seen["retried"]])
    refused = machine.exec(["cairn", "show", "flow_0000", "--json"], user="alice", check=False)
    assert refused.returncode != 0 and refused.stderr.startswith(b"cairn: ")
    assert seen["refused"] == refused.stderr.decode().strip(), seen["refused"]
    assert seen["inbox_count"] == "4"
    # the question reads as the workflow wrote it, every payload as text
    assert seen["question"] == question["question"]
    assert seen["answered"] == f"root-2 answered; {run_id} resumes", seen["answered"]
    # the approval that followed, with its fingerprint, approved in the page
    assert seen["approval"] == "Apply " + " | ".join(PAYLOADS)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", seen["fingerprint"]), seen["fingerprint"]
    assert seen["approved"].endswith(f"approved; {run_id} resumes"), seen["approved"]

    data = json.loads(cairn(machine, "show", run_id, "--json"))
    assert seen["state"] == "succeeded", seen
    assert NAME in data["settlement"]["apply"]["applied"]
    for payload in PAYLOADS:
        assert f"+{payload}" in seen["diff"].splitlines(), (payload, seen["diff"])
    assert NAME in seen["diff"]
    assert json.loads(seen["output"]) == data["run"]["output"]
    # the run's logs, as 'cairn logs' shows them (its first entries: more may follow)
    logs = cairn(machine, "logs", run_id, "-n", "100", "--no-pager").decode().splitlines()
    assert logs and seen["logs"].splitlines()[:3] == logs[:3], (seen["logs"][:500], logs[:3])
    # reverted from its page once the person confirmed: the file the run applied is gone
    assert seen["actions"]["Revert"] == f"{run_id}: reverted 1 path(s)", seen["actions"]
    assert data["settlement"]["revert"]["status"] == "applied", data["settlement"]
    assert machine.exec(["ls", "-A", "/home/alice/project"], user="alice").stdout == b"score.txt\n"
    assert seen["reverted"] == "what the run applied was put back"
    # nothing an agent or the workflow wrote became an element or ran
    assert seen["foreign"] == {"runs": [], "inbox": [], "approval": [], "run": [],
                               "failed": [], "facets": []}, seen["foreign"]
    assert seen["marks"] == [[None, None, None]] * 6, seen["marks"]
    assert seen["console"] == [], seen["console"]
    # the other run paused, resumed and cancelled from its page (the cancel once the
    # person confirmed, as the command line asks), then its storage deleted; the third
    # stopped
    actions = seen["actions"]
    assert actions["Pause"] == f"{other}: paused", actions
    assert actions["Resume"].startswith(f"{other}: resumed"), actions
    assert actions["Cancel"].startswith(f"{other}: cancel"), actions
    assert seen["cancelled"] == "cancelled", seen
    shown = json.loads(cairn(machine, "show", other, "--json"))
    assert shown["run"]["state"] == "cancelled" and shown["storage"]["deleted"] is True, \
        (actions, shown["storage"])
    assert other in actions["Delete storage"], actions
    assert actions["Stop"] == f"{third}: stopped" and seen["stopped"] == "stopped", actions
    assert json.loads(cairn(machine, "show", third, "--json"))["run"]["state"] == "stopped"

    # the doomed run's approval rejected in the page: it failed, and the inbox named the
    # checkpoint to retry from; the retry made a new run from it, which the page opened
    assert seen["rejected"].endswith(" rejected; the operation does not run"), seen["rejected"]
    failed = json.loads(cairn(machine, "show", doomed, "--json"))
    assert failed["run"]["state"] == "failed" and failed["replay_through"] == "root-1"
    assert seen["failed_error"] == failed["run"]["error"]
    assert seen["failed_command"] == f"cairn replay {doomed} --through root-1"
    retried = seen["retried"]
    assert re.fullmatch(r"flow_[0-9a-f]{32}", retried), seen["actions"]
    again = json.loads(cairn(machine, "show", retried, "--json"))
    assert again["replayed_from"] == {"run_id": doomed, "through": "root-1", "imported": 1}
    assert seen["replayed_from"] == f"{doomed} through root-1"
    assert doomed not in seen["failed_after_retry"], seen["failed_after_retry"]
    runs = {r["run_id"]: r for r in json.loads(cairn(machine, "list", "--json"))}
    assert runs[doomed]["replayed_by"] == [retried]

    # the facets run: its operations as a tree of lanes, its worklist and experiment, as
    # 'cairn show' has them
    view = json.loads(cairn(machine, "show", facets, "--json"))
    ops = {o["op_id"]: o for o in view["operations"]}
    fork = next(o for o in ops.values() if o["kind"] == "map")
    tree = seen["tree"]
    assert [row[1] for row in tree if row[0] == "lane"] == ["x", "y"], tree
    for lane in ("x", "y"):
        (lane_op,) = [o for o in ops.values() if o["scope"] == f"{fork['op_id']}-{lane}"]
        at = tree.index(["lane", lane, "1"])
        assert tree[at + 1] == ["op", lane_op["op_id"], "2"], tree
    assert [row[1] for row in tree if row[2] == "0"] == [o["op_id"] for o in sorted(
        (o for o in ops.values() if o["scope"] == "root"), key=lambda o: o["seq"])], tree
    assert seen["checkpoints"]["root-1"].startswith(ops["root-1"]["checkpoint"]["s"]["path"])
    (worklist,) = view["worklists"]
    assert seen["worklist"] == [[state, item] for item, state in
                                zip(worklist["items"], worklist["states"], strict=True)]
    assert [w[0] for w in seen["worklist"]] == ["done", "done"]
    # the workflow's markup in the worklist's title is text there too
    assert seen["worklist_title"] == worklist["title"] == \
        "Plan <img src=x onerror=window.__xss=14><script>window.__xss=15</script>"
    (experiment,) = view["experiments"]
    assert seen["dispositions"] == [c["disposition"] for c in experiment["candidates"]]
    assert "accepted" in seen["dispositions"]
    assert seen["phases"] and seen["phases"] == sorted(view["progress"]), seen["phases"]

    # the keyboard alone reaches a run from the list's heading: the filter and the box
    # come first, each with a visible focus ring, then the newest run's link, which Enter
    # opens
    stops = seen["tab_stops"]
    assert [s[0] for s in stops] == ["state-filter", "all-users", seen["runs"][0]], stops
    assert all(style != "none" for _, style in stops), stops
    assert seen["keyboard_opened"] == seen["runs"][0]
    # PatternFly, from Cockpit's own stylesheet, and Cockpit's dark style followed
    assert seen["pf_token"] and seen["pf_button"], seen
    assert seen["dark"] != seen["light"], (seen["light"], seen["dark"])
    # at a phone's width the runs list fits the screen: no sideways scrolling
    assert seen["phone_overflow"] <= 0, seen["phone_overflow"]
    for name in ("runs", "runs-phone", "inbox", "approval", "run", "failed", "lanes",
                 "run-dark"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name


def test_a_blocked_runs_operation_is_decided_in_the_inbox(console: Machine) -> None:
    """An operation that may have reached outside blocks its run (test_uncertain.py); the
    inbox offers cairn's choices for it: the person runs one run's again, and gives the
    other's real result."""
    machine = console
    units = ("cairn-coordinator@.service", "cairn-broker.service")
    try:
        for unit in units:
            machine.exec(["mkdir", "-p", f"/etc/systemd/system/{unit}.d"])
            machine.exec(["tee", f"/etc/systemd/system/{unit}.d/failpoint.conf"],
                         input=b"[Service]\nEnvironment=CAIRN_FAILPOINTS=agent-before-finish\n")
        machine.exec(["systemctl", "daemon-reload"])
        machine.exec(["systemctl", "stop", "cairn-broker.service"])
        decide_blocked_runs(machine)
    finally:  # the machine's next test gets cairn as installed
        machine.exec(["rm", "-f", *(f"/etc/systemd/system/{u}.d/failpoint.conf" for u in units)],
                     check=False)
        machine.exec(["systemctl", "daemon-reload"], check=False)
        machine.exec(["systemctl", "stop", "cairn-broker.service"], check=False)


def decide_blocked_runs(machine: Machine) -> None:
    run_id, by_hand = (launch(machine, f"/home/alice/{name}", "networked", '{"goal": "news"}',
                              "test:fetch=fetch.json") for name in ("net", "net2"))
    for blocked in (run_id, by_hand):
        data = wait_state(machine, blocked, ("blocked", "succeeded", "failed"))
        assert data["run"]["state"] == "blocked", data["run"]
    item = next(i for i in json.loads(cairn(machine, "inbox", "--json"))
                if i["run_id"] == run_id)

    seen = browse(machine, {"blocked": run_id, "by_hand": by_hand, "result": json.dumps(
        {"output": {"summary": "fetched by hand"}, "handoff": "checked"})})

    assert seen["commands"] == "\n".join(item["commands"])
    assert seen["choices"] == ["No effect", "Run again", "Record result"]
    assert seen["retried"] == f"root-1 will be retried on a W restored from Q (the project " \
        f"as launched); {run_id} resumes", seen["retried"]
    data = wait_state(machine, run_id, ("succeeded", "failed", "blocked"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["operations"][0]["attempt"] == 2
    assert seen["state"] == "succeeded"
    # the other's result, as it happened, typed into the page
    assert seen["decided"] == f"root-1 decided; {by_hand} resumes", seen["decided"]
    data = wait_state(machine, by_hand, ("succeeded", "failed", "blocked"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert data["run"]["output"] == {"summary": "fetched by hand"}
    assert data["operations"][0]["attempt"] == 1
    assert seen["foreign"] == [] and seen["marks"] == [None, None, None], seen
    assert (ARTIFACTS / "blocked.png").stat().st_size > 10_000
