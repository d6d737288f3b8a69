"""Journal figures: the settle+commit rate beside raw SQLite, and replay to the frontier.

Replay runs the real coordinator (``Coordinator.replay_once``) over a journal whose run
has N committed operations: it spawns the control worker and answers every call from the
journal with the manifest and identity checks (kind, request hash, location,
predecessor) it makes after a crash.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from measure import Cell, Stopwatch, collect

from cairn.canonical import canonical_json
from cairn.journal.readwrite import Journal
from cairn.proc import make_env
from cairn.protocol.control import (
    CallRequest,
    CallResult,
    StartWorkflow,
    WorkflowReturn,
    parse_worker_message,
)
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.launch import LaunchDescription, ProjectSpec
from cairn.workflow import runtime
from cairn.workflow.review import review_source

log = logging.getLogger(__name__)

REPLAY_SIZES = (100, 1000, 10_000)

LOOP_WORKFLOW = '''\
from cairn.workflow import Field, Model, agent, workflow


class Count(Model):
    n: int = Field(ge=1)


class Note(Model):
    text: str


step = agent(profile="builtin:planner", output=Note)


@workflow(description="one agent call per step", input=Count, output=Note)
async def run(flow, args: Count) -> Note:
    last = Note(text="start")
    for i in range(args.n):
        result = await flow.agent(step, prompt=f"step {i} after {last.text}")
        last = result.output
    return last
'''


def _description(run_id: str, review: dict[str, Any], n: int) -> LaunchDescription:
    return LaunchDescription(
        run_id=run_id, owner_uid=1001, owner_gid=1001, owner_name="bench",
        definition="bench:loop", source=LOOP_WORKFLOW, source_filename="loop.py",
        review_hash=str(review["review_hash"]), review=review, args={"n": n},
        project=ProjectSpec(root="/srv/bench", owner_uid=1001, on_pool_fs=False),
        profiles={}, cairn_version="bench", created_at=time.time(),
    )


def _result(op_id: str) -> dict[str, Any]:
    return {"output": {"text": f"out {op_id}"}, "handoff": f"handoff of {op_id}",
            "op_id": op_id}


# --- commit rate ---------------------------------------------------------------------


def commit_rate(workdir: Path, *, pairs: int, rounds: int, cells: list[Cell]) -> None:
    """settle+commit pairs per second through ``Journal.update_op`` beside raw SQLite
    (two insert+commit transactions per pair) with the journal's pragmas, same directory."""
    run_id = "flow_" + "c0" * 16
    journal = Journal(workdir / "rate-journal.db", create=True)
    journal.create_run(_description(run_id, {"review_hash": "sha256:0"}, 1), intents=[])
    token = journal.acquire_lease(run_id, "bench", ttl=3600)
    raw = sqlite3.connect(workdir / "rate-raw.db", isolation_level=None, timeout=30.0)
    for pragma in ("foreign_keys=ON", "busy_timeout=30000", "journal_mode=WAL",
                   "synchronous=FULL"):
        raw.execute(f"PRAGMA {pragma}")
    raw.execute("CREATE TABLE ops (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL,"
                " op_id TEXT NOT NULL, state TEXT NOT NULL, body TEXT, at REAL NOT NULL)")
    checkpoint: JSONObject = {"s": {
        "path": "/var/lib/cairn/pool/runs/x/checkpoints/y", "subvol_id": 300,
        "uuid": "ab" * 16, "fsid": "cd" * 16, "read_only": True, "generation": 42}}
    cairn_rates: list[float] = []
    raw_rates: list[float] = []
    seq = 0
    try:
        for _ in range(rounds):
            ops: list[str] = []
            journal.db.execute("PRAGMA synchronous=OFF")  # untimed setup only
            for _ in range(pairs):
                seq += 1
                op_id = f"root-{seq}"
                call = CallRequest(scope="root", seq=seq, kind="agent",
                                   request={"descriptor": "step", "prompt": str(seq)},
                                   location="loop.py:21:24")
                journal.record_requested(call, run_id=run_id, op_id=op_id,
                                         predecessor=None, token=token)
                journal.update_op(run_id, op_id, token=token, state="started")
                ops.append(op_id)
            journal.db.execute("PRAGMA synchronous=FULL")
            with Stopwatch() as sw:
                for op_id in ops:
                    journal.update_op(run_id, op_id, token=token, state="settled",
                                      result=_result(op_id), checkpoint=checkpoint)
                    journal.update_op(run_id, op_id, token=token, state="committed")
            cairn_rates.append(pairs / sw.elapsed)
            with Stopwatch() as sw:
                for op_id in ops:
                    body = canonical_json({"result": _result(op_id), "checkpoint": checkpoint})
                    for state, payload in (("settled", body), ("committed", None)):
                        raw.execute("BEGIN IMMEDIATE")
                        raw.execute("INSERT INTO ops (run_id, op_id, state, body, at)"
                                    " VALUES (?,?,?,?,?)",
                                    (run_id, op_id, state, payload, time.time()))
                        raw.execute("COMMIT")
            raw_rates.append(pairs / sw.elapsed)
        done = journal.get_op(run_id, "root", seq)
        if done is None or done.state != "committed":
            raise AssertionError("the journal did not commit the last operation")
    finally:
        raw.close()
        journal.close()
    cells.append(Cell(figure="journal", size=None, variant=f"{pairs} pairs/round",
                      method="Journal.update_op settled+committed", cairn=True,
                      unit="per_s", samples=cairn_rates))
    cells.append(Cell(figure="journal", size=None, variant=f"{pairs} pairs/round",
                      method="raw SQLite 2x(insert+commit)", cairn=False,
                      unit="per_s", samples=raw_rates))


# --- replay --------------------------------------------------------------------------


def build_replay_journal(path: Path, n: int) -> str:
    """A journal with one run whose ``n`` agent operations are all committed, recorded by
    answering a real control worker call by call. Returns the run ID."""
    run_id = f"flow_{n:032x}"
    review = review_source(LOOP_WORKFLOW, filename="loop.py").model_dump(mode="json")
    journal = Journal(path, create=True)
    journal.db.execute("PRAGMA synchronous=OFF")  # setup only; replay reopens the file
    try:
        journal.create_run(_description(run_id, review, n), intents=[])
        token = journal.acquire_lease(run_id, "bench-setup", ttl=3600)
        predecessor: str | None = None

        def record(call: CallRequest) -> dict[str, Any]:
            nonlocal predecessor
            op_id = f"{call.scope}-{call.seq}"
            journal.record_requested(call, run_id=run_id, op_id=op_id,
                                     predecessor=predecessor, token=token)
            result = _result(op_id)
            journal.update_op(run_id, op_id, token=token, state="started")
            journal.update_op(run_id, op_id, token=token, state="settled", result=result,
                              checkpoint={"op_id": op_id})
            journal.update_op(run_id, op_id, token=token, state="committed")
            predecessor = op_id
            return result

        _drive_worker(journal.launch_description(run_id), record)
        journal.release_lease(run_id, token)
    finally:
        journal.close()
    return run_id


class ReplayDiverged(AssertionError):
    pass


def replay(root: Path, run_id: str, n: int) -> float:
    """Replay the run to its frontier with the real coordinator: from constructing
    ``Coordinator`` (opening the journal, loading the run) to the workflow's return."""
    from cairn.coordinator.core import Coordinator

    os.environ["CAIRN_ROOT"] = str(root)
    try:
        with Stopwatch() as sw:
            coordinator = Coordinator(run_id)
            output = coordinator.replayer.replay_once()
        coordinator.journal.close()
    finally:
        del os.environ["CAIRN_ROOT"]
    if output != {"text": f"out root-{n}"}:
        raise ReplayDiverged(f"replay of {n} ops returned {output}")
    return sw.elapsed


def first_call(desc: LaunchDescription) -> float:
    """Seconds from spawning a control worker (as the coordinator does) to its first call."""
    with Stopwatch() as sw:
        worker = runtime.spawn(make_env())
        assert worker.stdin is not None and worker.stdout is not None
        try:
            start = StartWorkflow(source=desc.source, filename=desc.source_filename,
                                  args=desc.args)
            worker.stdin.write(start.model_dump_json() + "\n")
            worker.stdin.flush()
            CallRequest.model_validate_json(worker.stdout.readline())
        finally:
            worker.kill()
            worker.wait()
    return sw.elapsed


def _drive_worker(desc: LaunchDescription, answer: Any) -> dict[str, Any]:
    """Run the control worker as the coordinator starts it and answer each call."""
    worker = subprocess.Popen(
        [sys.executable, "-I", "-m", "cairn.workflow.runtime"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, close_fds=True,
        env=make_env({"PYTHONHASHSEED": "0"}),
    )
    assert worker.stdin is not None and worker.stdout is not None
    try:
        start = StartWorkflow(source=desc.source, filename=desc.source_filename,
                              args=desc.args)
        worker.stdin.write(start.model_dump_json() + "\n")
        worker.stdin.flush()
        while True:
            line = worker.stdout.readline()
            if not line:
                raise AssertionError(f"control worker exited ({worker.wait()})")
            match parse_worker_message(line):
                case WorkflowReturn(output=output):
                    worker.stdin.close()
                    worker.wait(timeout=30)
                    return output
                case CallRequest() as call:
                    value = answer(call)
                case message:
                    raise AssertionError(f"workflow failed or forked: {message}")
            worker.stdin.write(CallResult(seq=call.seq, value=value).model_dump_json() + "\n")
            worker.stdin.flush()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def replay_figures(workdir: Path, sizes: tuple[int, ...], *, repeat: int, budget: float,
                   cells: list[Cell]) -> None:
    for n in sizes:
        root = workdir / f"replay-{n}"
        path = root / "var" / "lib" / "cairn" / "journal" / "journal.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        run_id = build_replay_journal(path, n)
        log.info("replay journal with %d committed ops built in %.1fs", n, time.monotonic() - t)
        with Journal(path) as journal:
            desc = journal.launch_description(run_id)
        samples = collect(functools.partial(replay, root, run_id, n),
                          repeat=repeat, budget=budget)
        starts = collect(functools.partial(first_call, desc), repeat=repeat, budget=budget)
        variant = f"{n:,} ops"
        cells.append(Cell(figure="replay", size=None, variant=variant,
                          method="coordinator replay (answers from the journal)", cairn=True,
                          samples=samples))
        cells.append(Cell(figure="replay", size=None, variant=variant,
                          method="of which: worker start to its first call", cairn=True,
                          samples=starts))
        log.info("replay %d: median %.3fs (first call after %.3fs)", n, cells[-2].median,
                 cells[-1].median)
