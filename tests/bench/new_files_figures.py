"""One agent adds many new files (200,000 empty ones by default): how long from the agent's
finish until the run is settled, in a booted test machine (the package installed, a loop
Btrfs pool). Run as root, alone: ``.venv/bin/python tests/bench/new_files_figures.py``
(``--files N``, ``--content line`` for one line each; ``CAIRN_DEB=…`` to skip the build).

The phases come from the journal's own timestamps inside the machine: the agent's
``op-finished`` event, the broker's ``settle-candidate`` receipt (P frozen, C built, the
patch for ``cairn diff`` written) and ``start-apply.1`` (applied to the live project), and
``run-succeeded``. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "system"))

from machine import Machine  # noqa: E402

from cairn.proc import run  # noqa: E402

MAKE = """import os, sys
n, line = int(sys.argv[1]), sys.argv[2] == "line"
for i in range(n):
    d = f"gen/{i // 1000:04d}"
    if i % 1000 == 0:
        os.makedirs(d)
    with open(f"{d}/{i:06d}.txt", "w") as fh:
        if line:
            fh.write(f"file {i}\\n")
"""

TIMES = """import json, sqlite3, sys
db = sqlite3.connect("file:/var/lib/cairn/journal/journal.db?mode=ro", uri=True)
run_id = sys.argv[1]
events = dict(db.execute("SELECT event, min(at) FROM events WHERE run_id=? GROUP BY event",
                         (run_id,)).fetchall())
receipts = dict(db.execute("SELECT intent_id, at FROM receipts WHERE run_id=?",
                           (run_id,)).fetchall())
print(json.dumps({"agent_finished": events["op-finished"],
                  "candidate": receipts["settle-candidate"],
                  "applied": receipts["start-apply.1"],
                  "succeeded": events["run-succeeded"]}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--content", choices=("empty", "line"), default="empty")
    parser.add_argument("--journal", type=Path,
                        help="write the machine's journal of the settlement (broker, coordinator, "
                        "candidate and apply units) here, with monotonic times")
    args = parser.parse_args(argv)
    deb = os.environ.get("CAIRN_DEB") or run(
        [REPO / "packaging" / "build-deb.sh"], timeout=900).stdout.decode().strip().splitlines()[-1]
    with Machine(Path(deb), with_pool=True) as machine:
        project = "/home/alice/many"
        machine.exec(["mkdir", "-p", project], user="alice")
        machine.exec(["tee", f"{project}/README"], user="alice", input=b"many files\n")
        # inline: the agent's sandbox sees its workspace, not /home
        script = {"steps": [{"action": "run", "argv": ["python3", "-c", MAKE,
                                                       str(args.files), args.content]}],
                  "output": {"summary": "made"}, "handoff": "made"}
        machine.exec(["tee", "/home/alice/many.json"], user="alice",
                     input=json.dumps(script).encode())
        out = machine.exec(["cairn", "launch", "builtin:implement", "--project", project,
                            "--args", '{"objective": "many files"}',
                            "--scripted", "builtin:implementer=/home/alice/many.json"],
                           user="alice", timeout=120).stdout.decode()
        run_id = out.strip().splitlines()[-1]
        deadline = time.monotonic() + 1800
        while True:
            shown = json.loads(machine.exec(["cairn", "show", run_id, "--json"], user="alice",
                                            timeout=120).stdout)
            if shown["run"]["state"] in ("succeeded", "failed", "cancelled"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{run_id} did not finish in 30 minutes")
            time.sleep(1)
        if shown["run"]["state"] != "succeeded":
            logs = machine.exec(["cairn", "logs", run_id], user="alice", check=False).stdout
            raise SystemExit(f"{run_id} {shown['run']['state']}: {shown['run']['error']}\n"
                             + logs.decode(errors="replace")[-4000:])
        marks = json.loads(machine.exec(["python3", "-c", TIMES, run_id]).stdout)
        counted = machine.exec(["sh", "-c", f"find {project}/gen -type f | wc -l"]).stdout
        diff = machine.exec(["cairn", "diff", run_id, "--patch"], user="alice",
                            timeout=120).stdout.decode(errors="replace")
        if args.journal is not None:
            units = ["cairn-broker.service", f"cairn-coordinator@{run_id}.service",
                     f"cairn-candidate-{run_id}.service", f"cairn-apply-{run_id}-1.service"]
            args.journal.write_bytes(machine.exec(
                ["journalctl", "--no-pager", "-o", "short-monotonic",
                 *(f"--unit={u}" for u in units)], timeout=120, check=False).stdout)
    start = marks["agent_finished"]
    print(json.dumps({
        "files": args.files, "content": args.content, "applied_files": int(counted),
        "finish_to_candidate_s": round(marks["candidate"] - start, 1),
        "candidate_to_applied_s": round(marks["applied"] - marks["candidate"], 1),
        "finish_to_settled_s": round(marks["succeeded"] - start, 1),
        "diff_bytes": len(diff), "diff_new_files_shown": diff.count("\nnew file mode "),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
