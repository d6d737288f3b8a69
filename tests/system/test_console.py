"""Cairn's Cockpit page in a real browser (issue 34): the ``cairn-cockpit`` package
installed beside ``cairn`` and Debian's Cockpit in a booted machine; headless Chromium logs
in at Cockpit's login page as alice, finds Cairn in the menu, reads the runs list, answers
a run's question in the inbox and follows the run to its applied diff
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
    with Machine(deb, with_pool=True, packages=CONSOLE_PACKAGES,
                 debs=[cockpit_deb(deb)]) as machine:
        machine.exec(["chpasswd"], input=f"alice:{PASSWORD}\n".encode())
        machine.exec(["systemctl", "start", "cockpit.socket"])
        machine.exec(["tee", "/home/alice/hostile.py"], user="alice", input=WORKFLOW.encode())
        machine.exec(["tee", "/home/alice/hostile.json"], user="alice",
                     input=json.dumps(SCRIPT).encode())
        (machine.merged / "root" / BROWSER.name).write_bytes(BROWSER.read_bytes())
        yield machine


def cairn(machine: Machine, *argv: str) -> bytes:
    return bytes(machine.exec(["cairn", *argv], user="alice", timeout=120).stdout)


def launch(machine: Machine, project: str) -> str:
    machine.exec(["mkdir", "-p", project], user="alice")
    review = cairn(machine, "workflow", "review", "/home/alice/hostile.py").decode()
    review_hash = review.strip().splitlines()[-1].split()[-1]
    return cairn(machine, "launch", "/home/alice/hostile.py", "--confirm", review_hash,
                 "--project", project, "--args", json.dumps({"goal": "go"}),
                 "--scripted", "test:hostile=/home/alice/hostile.json",
                 ).decode().strip().splitlines()[-1]


def waiting_question(machine: Machine, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while True:
        items = [i for i in json.loads(cairn(machine, "inbox", "--json"))
                 if i.get("run_id") == run_id and i["kind"] == "question"]
        if items:
            return dict(items[0])
        assert time.monotonic() < deadline, machine.journal(run_id=run_id)[-3000:]
        time.sleep(0.5)


def test_a_person_answers_in_the_console_and_sees_the_applied_diff(console: Machine) -> None:
    machine = console
    other = launch(machine, "/home/alice/other")
    third = launch(machine, "/home/alice/third")
    run_id = launch(machine, "/home/alice/project")
    question = waiting_question(machine, run_id)
    waiting_question(machine, other)
    waiting_question(machine, third)
    assert question["question"] == "Ship it? " + " | ".join(PAYLOADS)

    shots = "/root/shots"
    config = {"user": "alice", "password": PASSWORD, "run_id": run_id, "other": other,
              "third": third,
              "answer": "yes <b>ship</b>", "shots": shots}
    seen = json.loads(machine.exec(["python3", f"/root/{BROWSER.name}", json.dumps(config)],
                                   timeout=600).stdout.decode().splitlines()[-1])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for shot in (machine.merged / shots.lstrip("/")).glob("*.png"):
        shutil.copyfile(shot, ARTIFACTS / shot.name)
    assert "error" not in seen, json.dumps(seen, indent=1)[-4000:]

    # the page is in Cockpit's menu, and lists the runs 'cairn list' does
    assert any(href.endswith("/cairn") for href in seen["menu"]), seen["menu"]
    listed = [r["run_id"] for r in json.loads(cairn(machine, "list", "--json"))]
    assert sorted(seen["runs"]) == sorted(listed) == sorted([run_id, other, third])
    refused = machine.exec(["cairn", "show", "flow_0000", "--json"], user="alice", check=False)
    assert refused.returncode != 0 and refused.stderr.startswith(b"cairn: ")
    assert seen["refused"] == refused.stderr.decode().strip(), seen["refused"]
    assert seen["inbox_count"] == "3"
    # the question reads as the workflow wrote it, every payload as text
    assert seen["question"] == question["question"]
    assert seen["answered"] == f"root-2 answered; {run_id} resumes", seen["answered"]
    # the approval that followed, with its fingerprint, approved in the page
    assert seen["approval"] == "Apply " + " | ".join(PAYLOADS)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", seen["fingerprint"]), seen["fingerprint"]
    assert seen["approved"].endswith(f"approved; {run_id} resumes"), seen["approved"]

    data = json.loads(cairn(machine, "show", run_id, "--json"))
    assert data["run"]["state"] == "succeeded", data["run"]["error"]
    assert seen["state"] == "succeeded", seen
    assert NAME in data["settlement"]["apply"]["applied"]
    for payload in PAYLOADS:
        assert f"+{payload}" in seen["diff"].splitlines(), (payload, seen["diff"])
    assert NAME in seen["diff"]
    assert json.loads(seen["output"]) == data["run"]["output"]
    # the run's logs, as 'cairn logs' shows them (its first entries: more may follow)
    logs = cairn(machine, "logs", run_id, "-n", "100", "--no-pager").decode().splitlines()
    assert logs and seen["logs"].splitlines()[:3] == logs[:3], (seen["logs"][:500], logs[:3])
    # nothing an agent or the workflow wrote became an element or ran
    assert seen["foreign"] == {"runs": [], "inbox": [], "approval": [], "run": []}, \
        seen["foreign"]
    assert seen["marks"] == [[None, None, None]] * 4, seen["marks"]
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
    # at a phone's width the runs list fits the screen: no sideways scrolling
    assert seen["phone_overflow"] <= 0, seen["phone_overflow"]
    for name in ("runs", "runs-phone", "inbox", "approval", "run"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name
