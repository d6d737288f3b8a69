"""A broker that dies during a run's import (a crash of any run kills the whole broker,
and with it every verb in flight): the retried prepare-q stops the import unit if it
still runs, discards what the import left (a half-filled staging subvolume, the Q already
snapshotted from it) and imports again into an empty subvolume. Real journal, receipts
and Btrfs through the broker's own ``carry_out``; the import unit is the importer run in
this process with the unit's binds (the system tier's crash matrix runs the real unit)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn import importer, paths
from cairn.broker import units
from cairn.broker.receipts import ReceiptStore
from cairn.coordinator.core import Coordinator
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import QPrepared
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.storage import Pool, is_subvolume
from cairn.unitprops import HelperUnitSpec
from cairn.workflow.review import review_source

pytestmark = pytest.mark.btrfs

OWNER = 65534  # an account every host has
WORKFLOW = '''
from typing import Any

from cairn.workflow import Field, Model, agent, workflow


class Ask(Model):
    text: str = Field(min_length=1)


worker = agent(profile="test:x", access="write", network="none", output=Ask)


@workflow(description="one agent", input=Ask, output=Ask)
async def run(flow: Any, args: Ask) -> Ask:
    result = await flow.agent(worker, prompt=args.text)
    done: Ask = result.output
    return done
'''


@pytest.fixture
def project(broker_host: Pool, tmp_path: Path) -> Path:
    """The owner's project, off the pool's filesystem: its Q is an import."""
    root = tmp_path / "home" / "owner" / "project"
    (root / "src").mkdir(parents=True)
    (root / "notes.txt").write_text("the whole project\n")
    (root / "src" / "main.py").write_text("print('hi')\n")
    for path in (root.parent, root, root / "src", root / "notes.txt", root / "src/main.py"):
        os.chown(path, OWNER, OWNER)
    return root


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each import unit run, as the importer with the unit's binds; yields the unit names
    asked to end as leftovers (their order among the imports too)."""
    seen: list[str] = []

    def run_helper(spec: HelperUnitSpec, name: str, timeout: float) -> dict[str, Any]:
        where = {inside: Path(outside) for outside, inside in
                 [*spec.binds, *spec.read_only_binds]}
        stats = where["/result"] / "stats.json"
        status = importer.main([str(where["/source"]), str(where["/target"]),
                                "--stats", str(stats)])
        if status != 0:
            raise units.SystemdError(f"{name} failed (exit-code, status {status})")
        os.chown(stats, OWNER, OWNER)  # the unit runs as the owner
        seen.append(f"ran {name}")
        return {"unit": name, "invocation_id": "inv"}

    monkeypatch.setattr(units, "run_helper", run_helper)
    monkeypatch.setattr(units, "end_leftover", lambda name: seen.append(f"ended {name}"))
    yield seen


def new_run(project: Path, run_id: str) -> Coordinator:
    review = review_source(WORKFLOW, filename="wf.py")
    desc = LaunchDescription(
        run_id=run_id, owner_uid=OWNER, owner_gid=OWNER, owner_name="nobody",
        definition="/home/x/wf.py", source=WORKFLOW, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"text": "go"},
        project=ProjectSpec(root=str(project), owner_uid=OWNER, on_pool_fs=False),
        profiles={"test:x": ProfileSpec(name="test:x", kind="scripted")},
        cairn_version="0", created_at=1.0,
    )
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    coord = Coordinator(run_id)
    coord.token = coord.journal.acquire_lease(run_id, coord.holder)
    return coord


def interrupted(pool: Pool, run_id: str, project: Path, where: str) -> None:
    """What a broker that died at ``where`` in prepare-q's import left in the pool."""
    staging, q = pool.q_import_path(run_id), pool.q_path(run_id)
    pool.create_subvolume(staging)
    (staging / "notes.txt").write_text("the whole")  # half copied
    if where == "in the import":
        return
    (staging / "notes.txt").write_text("the whole project\n")
    pool.snapshot(staging, q, read_only=True)
    if where == "after the snapshot":
        return
    pool.delete(staging, pool.receipt(staging))  # "after the staging's deletion"


@pytest.mark.parametrize(
    "where", ["in the import", "after the snapshot", "after the staging's deletion"]
)
def test_a_retried_import_starts_over_from_an_empty_subvolume(
    broker_host: Pool, project: Path, imports: list[str], run_id: str, where: str
) -> None:
    pool = broker_host
    coord = new_run(project, run_id)
    interrupted(pool, run_id, project, where)
    coord.prepare_storage()
    coord.journal.close()
    unit = units.import_unit_name(run_id)
    assert imports == [f"ended {unit}", f"ran {unit}"]  # stopped first, then run again
    store = ReceiptStore()
    try:
        prepared = {r.intent_id: r for r in store.for_run(run_id)}["prepare-q"].body(QPrepared)
    finally:
        store.close()
    q = pool.q_path(run_id)
    assert prepared.imported and prepared.q.uuid == pool.receipt(q).uuid
    assert pool.receipt(q).read_only
    assert (q / "notes.txt").read_text() == "the whole project\n"
    assert (q / "src" / "main.py").read_text() == "print('hi')\n"
    assert not pool.q_import_path(run_id).exists()
    w = pool.w_path(run_id, "root", 1)
    assert is_subvolume(w) and (w / "notes.txt").read_text() == "the whole project\n"


def test_a_first_import_ends_no_leftover(
    broker_host: Pool, project: Path, imports: list[str], run_id: str
) -> None:
    coord = new_run(project, run_id)
    coord.prepare_storage()
    coord.journal.close()
    assert imports == [f"ran {units.import_unit_name(run_id)}"]
    assert (broker_host.q_path(run_id) / "notes.txt").read_text() == "the whole project\n"
