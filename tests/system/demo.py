"""The main job: a real workflow in a throwaway Debian 13 machine, start to finish.

Builds the package, boots a machine with it installed, makes a loop-image Btrfs pool with
``cairn storage init``, launches ``builtin:implement`` on a sample project as a normal
user with the scripted implementer, and prints ``cairn show`` and ``cairn diff``. The
machine is torn down at the end, whatever happens.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from machine import Machine  # noqa: E402

from cairn.proc import run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def step(title: str) -> None:
    print(f"\n==> {title}", flush=True)


def show(
    machine: Machine, argv: list[str], user: str | None = "alice", ok: tuple[int, ...] = (0,)
) -> str:
    prompt = "#" if user is None else "$"
    print(f"{user or 'root'}@machine{prompt} {' '.join(argv)}", flush=True)
    out = machine.exec(argv, user=user, check=False, timeout=120)
    text = out.stdout.decode() + out.stderr.decode()
    print(text, end="" if text.endswith("\n") else "\n", flush=True)
    if out.returncode not in ok:
        raise SystemExit(f"demo failed at: {' '.join(argv)}")
    return out.stdout.decode()


def main() -> None:
    step("building the package")
    deb = Path(run([REPO / "packaging" / "build-deb.sh"], timeout=900).stdout.decode()
               .strip().splitlines()[-1])
    print(deb)
    step("booting a throwaway Debian 13 machine with the package installed")
    with Machine(deb, bind_loop_devices=True) as machine:
        print(f"booted in {machine.timings.get('boot', 0):.1f}s")
        show(machine, ["systemctl", "is-active", "cairn.socket", "cairn-broker.socket"], None)
        show(machine, ["cairn", "storage", "init", "--loop", "2G"], None)
        step("a sample project owned by alice")
        machine.exec(["mkdir", "-p", "/home/alice/src/demo"], user="alice")
        machine.exec(["tee", "/home/alice/src/demo/CHANGELOG.md"], user="alice",
                     input=b"# Changelog\n\n")
        example = "/usr/share/doc/cairn/examples/changelog-agent.json"
        show(machine, ["cat", example])
        step("launch")
        run_id = show(machine, [
            "cairn", "launch", "builtin:implement", "--project", "/home/alice/src/demo",
            "--args", json.dumps({"objective": "add a CHANGELOG entry"}),
            "--scripted", f"builtin:implementer={example}",
        ]).strip()
        deadline = time.monotonic() + 300
        while True:
            state = json.loads(machine.exec(["cairn", "show", run_id, "--json"], user="alice")
                               .stdout)["run"]["state"]
            if state in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
                break
            time.sleep(1)
        step("watch")
        show(machine, ["cairn", "ps"])
        show(machine, ["cairn", "show", run_id])
        show(machine, ["systemctl", "status", "--no-pager", "--lines=0",
                       f"cairn-coordinator@{run_id}.service"], None, ok=(0, 3))
        show(machine, ["cairn", "diff", run_id])
        show(machine, ["cat", "/home/alice/src/demo/CHANGELOG.md"])
        if state != "succeeded":
            raise SystemExit(f"run ended {state}")
    step(f"done: {run_id} succeeded; the machine is gone")


if __name__ == "__main__":
    main()
