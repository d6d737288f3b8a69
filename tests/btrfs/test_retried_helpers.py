"""A broker that dies during a run's import or candidate (a crash of any run kills the
whole broker, and with it every verb in flight): the retried prepare-q stops the import
unit if it still runs, discards what the import left (a half-filled staging subvolume,
the Q already snapshotted from it) and imports again into an empty subvolume; a retried
settle-candidate discards a half-built C and its F and builds from a fresh snapshot of Q.
Real journal, receipts and Btrfs through the broker's own ``carry_out``; the import unit
is the importer run in this process with the unit's binds (the system tier's crash
matrix runs the real units)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cairn import importer, paths
from cairn.broker import candidate, units, verbs
from cairn.broker.receipts import ReceiptStore
from cairn.coordinator.core import Coordinator
from cairn.errors import SystemdError
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import ProposalFrozen, QPrepared, SubvolumeReceipt
from cairn.protocol.launch import LaunchDescription, ProfileSpec, ProjectSpec
from cairn.protocol.settlement import CandidateResult
from cairn.settle.inventory import inventories_equal
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
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
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
            raise SystemdError(f"{name} failed (exit-code, status {status})")
        os.chown(stats, OWNER, OWNER)  # the unit runs as the owner
        seen.append(f"ran {name}")
        return {"unit": name, "invocation_id": "inv"}

    monkeypatch.setattr(units, "run_helper", run_helper)
    monkeypatch.setattr(units, "end_leftover", lambda name: seen.append(f"ended {name}"))
    return seen


def new_desc(run_id: str, project: Path = Path("/home/owner/project")) -> LaunchDescription:
    review = review_source(WORKFLOW, filename="wf.py")
    return LaunchDescription(
        run_id=run_id, owner_uid=OWNER, owner_gid=OWNER, owner_name="nobody",
        definition="/home/x/wf.py", source=WORKFLOW, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"text": "go"},
        project=ProjectSpec(root=str(project), owner_uid=OWNER, on_pool_fs=False),
        profiles={"test:x": ProfileSpec(name="test:x", kind="scripted")},
        cairn_version="0", created_at=1.0,
    )


def new_run(project: Path, run_id: str) -> Coordinator:
    desc = new_desc(run_id, project)
    with Journal(paths.journal_path(), create=True) as journal:
        journal.create_run(desc, intents=[])
    coord = Coordinator(run_id)
    coord.token = coord.journal.acquire_lease(run_id, coord.lease.holder)
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


# --- the candidate: C and F an earlier broker left -------------------------------------


class Candidate:
    """What ``settle_candidate`` asks of its verb's context, over a real pool: the run,
    its description and the frozen P's receipt (the journal and receipts are the
    import tests' above and the crash matrix's)."""

    def __init__(self, pool: Pool, desc: LaunchDescription, frozen: SubvolumeReceipt) -> None:
        self.run_id, self.desc, self._pool, self._frozen = desc.run_id, desc, pool, frozen

    def pool(self) -> Pool:
        return self._pool

    def receipt(self, intent_id: str, model: type[ProposalFrozen]) -> ProposalFrozen:
        assert intent_id == "freeze-proposal"
        return ProposalFrozen(p=self._frozen)

    def qgroup(self) -> None:
        return None

    def subpath(self) -> str:
        return ""


@pytest.mark.parametrize("where", ["in the candidate unit", "after F's snapshot"])
def test_a_retried_candidate_starts_from_a_fresh_snapshot_of_q(
    pool: Pool, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    project = pool.root / f"project-{run_id}"
    pool.create_subvolume(project)
    (project / "notes.txt").write_text("before\n")
    q = pool.snapshot(project, pool.q_path(run_id), read_only=True)
    w = pool.snapshot(Path(q.path), pool.w_path(run_id, "root", 1), read_only=False)
    (Path(w.path) / "notes.txt").write_text("after\n")
    p = pool.snapshot(Path(w.path), pool.settlement_path(run_id, "P"), read_only=True)
    c, f = pool.settlement_path(run_id, "C"), pool.settlement_path(run_id, "F")
    pool.snapshot(Path(q.path), c, read_only=False)
    (c / "notes.txt").write_text("half\n")  # what the interrupted unit got to
    (c / "stray.txt").write_text("from the first attempt\n")
    if where == "after F's snapshot":
        pool.snapshot(c, f, read_only=True)
    seen: list[str] = []

    def run_candidate(desc: LaunchDescription, q_: Path, p_: Path, c_: Path, subpath: str,
                      stream: bytes, work: Path) -> tuple[dict[str, Any], CandidateResult]:
        assert inventories_equal(c_, q_), "C is not a fresh snapshot of Q"
        (c_ / "notes.txt").write_text((p_ / "notes.txt").read_text())
        seen.append("built")
        return ({"unit": candidate.candidate_unit_name(desc.run_id), "invocation_id": "i"},
                CandidateResult(accepted=["notes.txt"], refused=[], bytes_accepted=6,
                                inventories_equal=False, diff=""))

    monkeypatch.setattr(candidate, "run_candidate", run_candidate)
    monkeypatch.setattr(units, "end_leftover", lambda name: seen.append(f"ended {name}"))
    desc = LaunchDescription.model_validate({**new_desc(run_id).model_dump(), "project": {
        "root": str(project), "owner_uid": OWNER, "on_pool_fs": True}})
    built = verbs.settle_candidate(Candidate(pool, desc, p))  # type: ignore[arg-type]
    assert seen == [f"ended {candidate.candidate_unit_name(run_id)}", "built"]
    assert sorted(os.listdir(f)) == ["notes.txt"] and (f / "notes.txt").read_text() == "after\n"
    assert built.f.uuid == pool.receipt(f).uuid and built.c.uuid == pool.receipt(c).uuid
    assert built.accepted == ["notes.txt"]
