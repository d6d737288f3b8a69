"""The candidate step as the broker runs it, on real snapshots: root takes the kernel's
account of the changes (a tree search's record, or the send stream), and
``cairn.worker.candidate`` brings C up as the project's owner (an unprivileged UID here,
as in its unit). Its C and report match the ones root used to make
itself, moved directories, hard links and refusals included; it cannot touch what the
owner may not; and a C it cannot build ends in ``failure.json``, not a half report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from cairn.broker import units
from cairn.broker.candidate import build_c, change_source
from cairn.errors import StorageError, SystemdError
from cairn.protocol.launch import (
    LaunchDescription,
    ProfileSpec,
    ProjectSpec,
    SettlementPolicySpec,
)
from cairn.protocol.settlement import CandidateFailure, CandidateResult, TrialCheck
from cairn.settle.candidate import build_candidate
from cairn.settle.changes import changes
from cairn.settle.inventory import inventories_equal
from cairn.settle.paths import SettlementPolicy
from cairn.storage import Pool, metadata_stream
from cairn.treesearch import change_record
from cairn.unitprops import HelperUnitSpec
from cairn.workflow.review import review_source

pytestmark = pytest.mark.btrfs
OWNER = 4242
POLICY = SettlementPolicy(write_paths=["src/**", "notes/**", "moved/**", "links/**", "docs/**"])


def chown_tree(root: Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.lchown(Path(dirpath, name), uid, uid)
    os.lchown(root, uid, uid)


def agent(w: Path) -> None:
    proj = w / "proj"
    (proj / "src" / "app.py").write_text("app v2\n")
    (proj / "src" / "new.py").write_text("new\n")
    os.rename(proj / "notes", proj / "moved")
    with open(proj / "links" / "one", "r+") as f:  # in place: "two" is the same inode
        f.write("ONE\n")
    (proj / "secrets.env").write_text("TOKEN=1\n")  # outside write_paths: refused
    (proj / "docs" / "guide.md").unlink()
    for path in (proj / "src" / "new.py", proj / "secrets.env"):
        os.lchown(path, OWNER, OWNER)


class Settlement:
    def __init__(self, pool: Pool, run_id: str, also: Callable[[Path], None] = agent,
                 source: str = "stream") -> None:
        live = pool.root / "live"
        pool.create_subvolume(live)
        proj = live / "proj"
        for sub in ("src", "notes/deep", "links", "docs"):
            (proj / sub).mkdir(parents=True)
        (proj / "src" / "app.py").write_text("app\n")
        (proj / "notes" / "deep" / "n.md").write_text("note\n")
        (proj / "links" / "one").write_text("one\n")
        os.link(proj / "links" / "one", proj / "links" / "two")
        (proj / "docs" / "guide.md").write_text("guide\n")
        chown_tree(proj, OWNER)
        self.q = pool.q_path(run_id)
        pool.snapshot(live, self.q, read_only=True)
        w = pool.w_path(run_id, "root", 1)
        pool.snapshot(self.q, w, read_only=False)
        agent(w)
        if also is not agent:
            also(w / "proj")
        self.p = pool.settlement_path(run_id, "P")
        pool.snapshot(w, self.p, read_only=True)
        self.c = pool.settlement_path(run_id, "C")
        pool.snapshot(self.q, self.c, read_only=False)
        self.root_c = pool.settlement_path(run_id, "F")  # a writable C, made by root
        pool.snapshot(self.q, self.root_c, read_only=False)
        self.work = pool.run_dir(run_id) / "scratch" / "candidate"
        self.work.mkdir(parents=True)
        os.chown(self.work, OWNER, OWNER)
        if source == "record":
            record = change_record(self.q, self.p)
            assert record is not None
            (self.work / "record").write_bytes(record)
        else:
            (self.work / "stream").write_bytes(metadata_stream(self.q, self.p))
        (self.work / "policy.json").write_text(json.dumps(asdict(POLICY)))

    def run_as_owner(self, *, build: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [
            "setpriv", f"--reuid={OWNER}", f"--regid={OWNER}", "--clear-groups", "--",
            sys.executable, "-m", "cairn.worker.candidate", "--q", str(self.q),
            "--p", str(self.p), *(["--c", str(self.c)] if build else []), "--subpath", "proj",
            "--work", str(self.work),
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                              check=False)


@pytest.fixture(params=["stream", "record"])
def settlement(pool: Pool, run_id: str, request: pytest.FixtureRequest) -> Settlement:
    return Settlement(pool, run_id, source=request.param)


def test_the_owner_builds_the_candidate_root_would_have(settlement: Settlement) -> None:
    s = settlement
    done = s.run_as_owner()
    assert done.returncode == 0, done.stderr
    raw = (s.work / "result.json").read_bytes()
    result = CandidateResult.model_validate_json(raw, strict=True)  # as root reads it

    as_root = build_candidate(
        s.q / "proj", s.p / "proj", s.root_c / "proj", changes(s.q, s.p, subpath="proj"), POLICY
    )
    assert result.accepted == as_root.accepted
    assert [(r.path, r.reason) for r in result.refused] == [
        (r.path, r.reason) for r in as_root.refused]
    assert result.bytes_accepted == as_root.bytes_accepted
    assert inventories_equal(s.c, s.root_c, "proj")
    assert "moved/deep/n.md" in result.accepted and "notes/deep/n.md" in result.accepted
    assert {"links/one", "links/two"} <= set(result.accepted)  # "two" found by its inode
    assert [r.path for r in result.refused] == ["secrets.env"]
    assert (s.c / "proj" / "links" / "two").read_text() == "ONE\n"
    assert not (s.c / "proj" / "secrets.env").exists()
    assert "docs/guide.md" in result.accepted and not (s.c / "proj/docs/guide.md").exists()
    assert "+app v2" in result.diff and not result.inventories_equal


def test_a_candidate_the_owner_cannot_write_fails_whole(settlement: Settlement) -> None:
    s = settlement
    os.chown(s.c / "proj" / "src", 0, 0)  # root's in C: the owner may not replace app.py
    done = s.run_as_owner()
    assert done.returncode == 1
    assert not (s.work / "result.json").exists()
    failure = CandidateFailure.model_validate(json.loads((s.work / "failure.json").read_text()))
    assert "in the candidate" in failure.message and "Permission denied" in failure.message


def unreadable(proj: Path) -> None:
    """The agent takes the owner's read permission from a new file and a new directory."""
    (proj / "src" / "locked.py").write_text("x\n")
    (proj / "src" / "shut").mkdir()
    (proj / "src" / "shut" / "inner.py").write_text("y\n")
    for path in (proj / "src" / "locked.py", proj / "src" / "shut", proj / "src/shut/inner.py"):
        os.lchown(path, OWNER, OWNER)
    os.chmod(proj / "src" / "locked.py", 0o044)
    os.chmod(proj / "src" / "shut", 0o300)


@pytest.mark.parametrize("source", ["stream", "record"])
def test_an_entry_the_owner_cannot_read_is_refused_by_name(
    pool: Pool, run_id: str, source: str
) -> None:
    """Taking away its own read permission does not let an agent fail the owner's
    candidate unit: those entries are refused by name and the rest goes into C."""
    s = Settlement(pool, run_id, also=unreadable, source=source)
    done = s.run_as_owner()
    assert done.returncode == 0, done.stderr
    result = CandidateResult.model_validate_json((s.work / "result.json").read_bytes())
    refused = {r.path: r.reason for r in result.refused}
    assert refused["src/locked.py"] == "not readable by its owner (mode 0044)"
    assert refused["src/shut"] == "not readable by its owner (mode 0300)"
    assert "src/shut/inner.py" in refused
    assert "src/app.py" in result.accepted and "src/new.py" in result.accepted
    assert not (s.c / "proj" / "src" / "locked.py").exists()


def shut_after_deleting(proj: Path) -> None:
    """Having deleted docs/guide.md (``agent``), the agent takes the owner's read
    permission from docs: the record cannot say the file went without listing it."""
    os.chmod(proj / "docs", 0o300)


def test_a_record_the_owner_cannot_read_asks_root_for_the_send_stream(
    pool: Pool, run_id: str
) -> None:
    s = Settlement(pool, run_id, also=shut_after_deleting, source="record")
    done = s.run_as_owner(build=False)
    assert done.returncode == 1
    failure = CandidateFailure.model_validate(json.loads((s.work / "failure.json").read_text()))
    assert failure.send_stream and "may not read" in failure.message, failure
    (s.work / "record").unlink()  # what root does then: the same unit, the send stream
    (s.work / "stream").write_bytes(metadata_stream(s.q, s.p))
    (s.work / "failure.json").unlink()
    done = s.run_as_owner(build=False)
    assert done.returncode == 0, done.stderr
    check = TrialCheck.model_validate_json((s.work / "result.json").read_bytes())
    assert check.refused_count >= 1


def not_utf8(proj: Path) -> None:
    """The agent leaves a file whose name is not UTF-8, and one such file that a
    profile's settle_ignore leaves out."""
    for name in (b"src/bad\xff.py", b"src/.cache\xfe"):
        path = os.fsencode(proj) + b"/" + name
        with open(path, "wb") as fh:
            fh.write(b"x\n")
        os.lchown(path, OWNER, OWNER)


def test_a_name_that_is_not_utf8_is_refused_and_reported_as_text(
    pool: Pool, run_id: str
) -> None:
    s = Settlement(pool, run_id, also=not_utf8)
    policy = SettlementPolicy(write_paths=POLICY.write_paths, ignore=["src/.cache*"])
    (s.work / "policy.json").write_text(json.dumps(asdict(policy)))
    done = s.run_as_owner()
    assert done.returncode == 0, done.stderr
    result = CandidateResult.model_validate_json((s.work / "result.json").read_bytes(),
                                                 strict=True)  # as root reads it
    refused = {r.path: r.reason for r in result.refused}
    assert refused["src/bad\\xff.py"] == "file name is not valid UTF-8"
    assert result.ignored == ["src/.cache\\xfe"]
    assert "src/app.py" in result.accepted
    assert not os.path.lexists(os.fsencode(s.c / "proj") + b"/src/bad\xff.py")


def many_outside(proj: Path) -> None:
    """Besides secrets.env, 30 more files outside the write paths, one with an escape
    sequence in its name, and a FIFO inside them."""
    for n in range(30):
        (proj / f"bench-{n:02}.txt").write_text("gamed\n")
    (proj / "\x1b[2Jclear").write_text("x\n")
    os.mkfifo(proj / "src" / "pipe")
    for path in [*proj.glob("bench-*"), proj / "\x1b[2Jclear", proj / "src" / "pipe"]:
        os.lchown(path, OWNER, OWNER)


def test_a_trials_check_judges_as_the_settlement_and_builds_nothing(
    pool: Pool, run_id: str
) -> None:
    """Without --c the unit is a trial's check: the same judgement as the candidate, the
    first 20 refusals named and all counted, C left as it was."""
    s = Settlement(pool, run_id, also=many_outside)
    before = sorted(os.listdir(s.c / "proj"))
    done = s.run_as_owner(build=False)
    assert done.returncode == 0, done.stderr
    checked = TrialCheck.model_validate_json((s.work / "result.json").read_bytes(), strict=True)
    as_candidate = build_candidate(
        s.q / "proj", s.p / "proj", s.root_c / "proj", changes(s.q, s.p, subpath="proj"), POLICY
    )
    assert checked.refused_count == len(as_candidate.refused) == 33
    assert [(r.path, r.reason) for r in checked.refused] == [
        (r.path, r.reason) for r in as_candidate.refused][:20]
    reasons = {r.path: r.reason for r in as_candidate.refused}
    assert reasons["\x1b[2Jclear"] == "outside the write paths"  # escaped where shown
    assert reasons["secrets.env"] == "outside the write paths"
    assert reasons["src/pipe"] == "fifo"
    assert sorted(os.listdir(s.c / "proj")) == before  # nothing built


def test_root_makes_c_afresh_for_the_send_stream_a_unit_asks_for(
    pool: Pool, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_c`` as the broker runs it, the unit as the owner: handed the record over a
    shut directory, the unit asks for the send stream; root deletes the C it had made,
    snapshots Q again and runs the unit with the stream, which builds C."""
    s = Settlement(pool, run_id, also=shut_after_deleting, source="record")
    ran: list[str] = []

    def run_helper(spec: HelperUnitSpec, name: str, timeout: float) -> dict[str, Any]:
        binds = {dst: src for src, dst in [*spec.binds, *spec.read_only_binds]}
        argv = [binds.get(arg, arg) for arg in spec.exec_argv[1:]]
        ran.append("record" if (s.work / "record").exists() else "stream")
        done = subprocess.run(
            ["setpriv", f"--reuid={spec.uid}", f"--regid={spec.gid}", "--clear-groups", "--",
             sys.executable, *argv], capture_output=True, text=True, check=False, timeout=120,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})
        if done.returncode:
            raise SystemdError(f"{name} failed (exit-code, status {done.returncode})")
        return {"unit": name, "invocation_id": "i"}

    monkeypatch.setattr(units, "run_helper", run_helper)
    for top in (pool.root / "runs", pool.run_dir(run_id), pool.run_dir(run_id) / "scratch"):
        top.chmod(0o711)  # what the unit's binds make reachable, reachable here
    pool.delete(s.c, pool.receipt(s.c))  # build_c makes its own
    desc = launch_description(run_id, POLICY)
    source = change_source(s.q, s.p)
    assert source[0] == "record"
    _unit, result, made = build_c(desc, pool, (s.q, s.p, s.c), None, "proj", source, s.work)
    assert ran == ["record", "stream"]
    assert made.uuid == pool.receipt(s.c).uuid  # the second C, the one root keeps
    refused = {r.path: r.reason for r in result.refused}
    assert refused["docs"] == "not readable by its owner (mode 0300)"
    assert "src/app.py" in result.accepted and (s.c / "proj/src/app.py").read_text() == "app v2\n"


WORKFLOW = '''
from cairn.workflow import Field, Model, workflow

class Goal(Model):
    goal: str = Field(min_length=1)

@workflow(description="settle", input=Goal, output=Goal)
async def run(flow, args: Goal) -> Goal:
    return args
'''


def launch_description(run_id: str, policy: SettlementPolicy) -> LaunchDescription:
    source = WORKFLOW
    review = review_source(source, filename="wf.py")
    return LaunchDescription(
        run_id=run_id, owner_uid=OWNER, owner_gid=OWNER, owner_name="alice",
        definition="/home/alice/wf.py", source=source, source_filename="wf.py",
        review_hash=review.review_hash, review=review.model_dump(mode="json"),
        args={"goal": "g"},
        project=ProjectSpec(root="/home/alice/p", owner_uid=OWNER, on_pool_fs=True),
        profiles={"test:x": ProfileSpec(name="test:x", kind="scripted")},
        cairn_version="0", created_at=1.0,
        policy=SettlementPolicySpec(write_paths=list(policy.write_paths)),
    )


def test_a_c_that_failed_is_deleted_or_its_delete_logged(
    pool: Pool, run_id: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = Settlement(pool, run_id, source="record")
    pool.delete(s.c, pool.receipt(s.c))  # build_c makes its own

    def failing(spec: HelperUnitSpec, name: str, timeout: float) -> dict[str, Any]:
        raise SystemdError(f"{name} failed (exit-code, status 1)")

    monkeypatch.setattr(units, "run_helper", failing)
    desc = launch_description(run_id, POLICY)

    def build() -> None:
        build_c(desc, pool, (s.q, s.p, s.c), None, "proj", change_source(s.q, s.p), s.work)

    with pytest.raises(SystemdError, match="failed"):
        build()
    assert not s.c.exists()  # no receipt names it: it went

    def stuck(path: Path, receipt: object) -> None:
        raise StorageError(f"{path} is busy")

    monkeypatch.setattr(pool, "delete", stuck)
    with pytest.raises(SystemdError, match="failed"):  # the unit's failure, not the delete's
        build()
    assert "could not remove" in caplog.text and s.c.exists()
