"""Candidate building and the three-way live apply on real Btrfs snapshots."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import failpoints, fsutil
from cairn.settle import apply as settle_apply
from cairn.settle.apply import BATCH, apply, plan_apply
from cairn.settle.candidate import build_candidate
from cairn.settle.changes import changes
from cairn.settle.inventory import inventories_equal
from cairn.settle.paths import SettlementPolicy, glob_regex
from cairn.storage import Pool

pytestmark = pytest.mark.btrfs
REPO = Path(__file__).resolve().parents[2]


def live_project(pool: Pool) -> Path:
    live = pool.root / "live"
    pool.create_subvolume(live)
    (live / "src").mkdir()
    (live / "src" / "app.py").write_text("v1\n")
    (live / "src" / "util.py").write_text("util\n")
    (live / "docs").mkdir()
    (live / "docs" / "guide.md").write_text("guide\n")
    (live / ".git").mkdir()
    (live / ".git" / "config").write_text("[core]\n")
    (live / "old.txt").write_text("old\n")
    return live


def settle_run(pool: Pool, run_id: str, live: Path, agent: object,
               policy: SettlementPolicy) -> tuple[Path, Path, list[str], object]:
    """Q from live, agent edits W, P, changes, C, candidate, F. Returns Q, F, accepted,
    report."""
    q = pool.q_path(run_id)
    pool.snapshot(live, q, read_only=True)
    w = pool.w_path(run_id, "root", 0)
    pool.snapshot(q, w, read_only=False)
    agent(w)  # type: ignore[operator]
    p = pool.settlement_path(run_id, "P")
    pool.snapshot(w, p, read_only=True)
    cs = changes(q, p)
    c = pool.settlement_path(run_id, "C")
    pool.snapshot(q, c, read_only=False)
    report = build_candidate(q, p, c, cs, policy)
    f = pool.settlement_path(run_id, "F")
    pool.snapshot(c, f, read_only=True)
    return q, f, report.accepted, report


def good_agent(w: Path) -> None:
    (w / "src" / "app.py").write_text("v2\n")
    (w / "src" / "new.py").write_text("new\n")
    (w / "src" / "pkg").mkdir()
    (w / "src" / "pkg" / "mod.py").write_text("mod\n")
    os.unlink(w / "old.txt")
    os.rename(w / "docs" / "guide.md", w / "docs" / "manual.md")
    os.chmod(w / "src" / "util.py", 0o755)


def test_glob_semantics() -> None:
    assert glob_regex("src/**").match("src") and glob_regex("src/**").match("src/a/b.py")
    assert not glob_regex("src/**").match("srcx/a")
    assert glob_regex("**/*.py").match("a/b/c.py") and glob_regex("**/*.py").match("c.py")
    assert not glob_regex("*.py").match("a/c.py")
    assert glob_regex("**").match(".hidden/x")


def test_candidate_refuses_what_policy_forbids(pool: Pool, run_id: str) -> None:
    live = live_project(pool)

    def agent(w: Path) -> None:
        (w / "src" / "app.py").write_text("v2\n")
        (w / "src" / "suid").write_text("#!/bin/sh\n")
        os.chmod(w / "src" / "suid", 0o4755)
        os.symlink("../../etc/passwd", w / "src" / "escape")
        os.symlink("/etc/shadow", w / "src" / "absolute")
        os.symlink("util.py", w / "src" / "fine-link")
        (w / ".git" / "config").write_text("[core]\nhooksPath=/tmp\n")
        (w / "docs" / "guide.md").write_text("outside write paths\n")
        (w / "src" / "big.bin").write_bytes(b"\0" * 5000)
        os.mkfifo(w / "src" / "pipe")
        (w / "src" / "dir").mkdir()
        os.chmod(w / "src" / "dir", 0o2755)
        (w / "src" / "dir" / "child.py").write_text("c\n")
        os.setxattr(w / "src" / "app.py", "user.tag", b"t")

    policy = SettlementPolicy(write_paths=["src/**"], max_file_bytes=4096)
    q, f, accepted, report = settle_run(pool, run_id, live, agent, policy)
    reasons = {r.path: r.reason for r in report.refused}  # type: ignore[attr-defined]
    assert reasons["src/suid"] == "setuid/setgid bit"
    assert "leaves the project" in reasons["src/escape"]
    assert "absolute" in reasons["src/absolute"]
    assert reasons[".git/config"] == ".git internals are excluded"
    assert reasons["docs/guide.md"] == "outside the write paths"
    assert "larger than" in reasons["src/big.bin"]
    assert reasons["src/pipe"] == "fifo"
    assert reasons["src/dir"] == "setuid/setgid bit"
    assert reasons["src/dir/child.py"] == "parent directory was refused"
    assert sorted(accepted) == ["src/app.py", "src/fine-link"]
    assert (f / "src" / "app.py").read_text() == "v2\n"
    assert os.getxattr(f / "src" / "app.py", "user.tag") == b"t"
    assert os.readlink(f / "src" / "fine-link") == "util.py"
    for refused in ("src/suid", "src/escape", "src/absolute", "src/big.bin", "src/pipe",
                    "src/dir"):
        assert not os.path.lexists(f / refused), refused
    assert (f / ".git" / "config").read_text() == "[core]\n"
    assert (f / "docs" / "guide.md").read_text() == "guide\n"


def test_a_profiles_tool_leftovers_are_ignored_not_refused(pool: Pool, run_id: str) -> None:
    """aider's history and caches, Python's bytecode: left out of C, reported apart."""
    live = live_project(pool)
    (live / ".aider.conf.yml").write_text("model: x\n")

    def agent(w: Path) -> None:
        (w / "src" / "app.py").write_text("v2\n")
        (w / ".aider.chat.history.md").write_text("the whole conversation\n")
        (w / ".aider.tags.cache.v4").mkdir()
        (w / ".aider.tags.cache.v4" / "cache.db").write_bytes(b"\0" * 100)
        (w / ".aider.conf.yml").write_text("model: changed by the tool\n")
        (w / "src" / "__pycache__").mkdir()
        (w / "src" / "__pycache__" / "app.pyc").write_bytes(b"pyc")
        os.rename(w / "old.txt", w / ".aider.old")  # a real file moved under an ignored name

    policy = SettlementPolicy(ignore=[".aider*", "**/__pycache__"])
    q, f, accepted, report = settle_run(pool, run_id, live, agent, policy)
    assert accepted == ["src/app.py"]
    assert report.ignored == [  # type: ignore[attr-defined]
        ".aider.chat.history.md", ".aider.conf.yml", ".aider.old", ".aider.tags.cache.v4",
        ".aider.tags.cache.v4/cache.db", "src/__pycache__", "src/__pycache__/app.pyc"]
    # the rename's other side is a real change that cannot be made alone: refused, kept
    reasons = {r.path: r.reason for r in report.refused}  # type: ignore[attr-defined]
    assert list(reasons) == ["old.txt"]
    assert (f / "old.txt").read_text() == "old\n"
    assert (f / ".aider.conf.yml").read_text() == "model: x\n"
    for left_out in (".aider.chat.history.md", ".aider.tags.cache.v4", "src/__pycache__"):
        assert not os.path.lexists(f / left_out), left_out
    assert (f / "src" / "app.py").read_text() == "v2\n"


def test_a_proposal_of_only_ignored_changes_has_the_same_inventory(
    pool: Pool, run_id: str
) -> None:
    live = live_project(pool)

    def agent(w: Path) -> None:
        (w / ".aider.input.history").write_text("fix it\n")

    ignore = [".aider*"]
    q, _f, accepted, report = settle_run(pool, run_id, live, agent,
                                         SettlementPolicy(ignore=ignore))
    assert accepted == [] and report.refused == []  # type: ignore[attr-defined]
    p = pool.settlement_path(run_id, "P")
    assert inventories_equal(q, p, ignore=ignore)
    assert not inventories_equal(q, p)


def test_refused_rename_destination_keeps_the_source(pool: Pool, run_id: str) -> None:
    live = live_project(pool)

    def agent(w: Path) -> None:
        os.rename(w / "src" / "util.py", w / "docs" / "util.py")

    _q, f, accepted, _report = settle_run(
        pool, run_id, live, agent, SettlementPolicy(write_paths=["src/**"]))
    assert accepted == []
    assert (f / "src" / "util.py").read_text() == "util\n"


def test_apply_clean_then_already_applied(pool: Pool, run_id: str, tmp_path: Path) -> None:
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    assert set(accepted) >= {"src/app.py", "src/new.py", "src/pkg", "src/pkg/mod.py",
                             "old.txt", "docs/guide.md", "docs/manual.md", "src/util.py"}
    receipts = tmp_path / "receipts.jsonl"
    progress: list[tuple[int, int]] = []
    result = apply(q, f, live, accepted, receipts, lambda n, total: progress.append((n, total)))
    assert result.status == "applied" and not result.conflicts
    assert sorted(result.applied) == sorted(accepted)
    # one report per syncfs: here, on the pool's Btrfs with reflinked temporaries, the
    # deletions' batch and the placements' share the one at the end
    assert progress == [(len(accepted), len(accepted))]
    assert inventories_equal(f, live)
    assert stat.S_IMODE(os.lstat(live / "src" / "util.py").st_mode) == 0o755
    lines = [json.loads(line) for line in receipts.read_text().splitlines()]
    assert sorted(r["path"] for r in lines) == sorted(accepted)
    assert not list(live.rglob(".cairn-apply.*"))

    again = apply(q, f, live, accepted, receipts)
    assert again.status == "applied"
    assert again.applied == [] and sorted(again.already_applied) == sorted(accepted)
    assert apply(q, f, live, [], receipts).status == "noop"


def test_a_file_written_through_a_new_name_reaches_its_other_name(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    """docs/guide.md and src/guide-link.md are one file; the agent renames the second and
    writes through the new name (send names the file by that one: its directory is the
    older), and the live project's other name gets the new bytes too."""
    live = live_project(pool)
    os.link(live / "docs" / "guide.md", live / "src" / "guide-link.md")

    def agent(w: Path) -> None:
        os.rename(w / "src" / "guide-link.md", w / "src" / "manual.md")
        with open(w / "src" / "manual.md", "a") as fh:
            fh.write("more\n")

    q, f, accepted, _ = settle_run(pool, run_id, live, agent, SettlementPolicy())
    assert "docs/guide.md" in accepted
    result = apply(q, f, live, accepted, tmp_path / "receipts.jsonl")
    assert result.status == "applied"
    assert (live / "docs" / "guide.md").read_text() == "guide\nmore\n"
    assert (live / "src" / "manual.md").read_text() == "guide\nmore\n"
    assert not (live / "src" / "guide-link.md").exists()
    assert inventories_equal(f, live)


def test_a_persons_edit_is_a_conflict_and_nothing_is_written(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    (live / "src" / "app.py").write_text("a person's edit\n")
    before = pool.snapshot(live, pool.root / "live-before", read_only=True)
    receipts = tmp_path / "receipts.jsonl"
    result = apply(q, f, live, accepted, receipts)
    assert result.status == "conflict"
    assert [c.path for c in result.conflicts] == ["src/app.py"]
    assert result.applied == []
    assert inventories_equal(Path(before.path), live)  # not one byte written
    assert (live / "src" / "app.py").read_text() == "a person's edit\n"
    assert not receipts.exists() or receipts.read_text() == ""


def test_revert_is_the_apply_from_f_back_to_q(pool: Pool, run_id: str, tmp_path: Path) -> None:
    """``cairn revert``: the apply with F as the base and Q as the target restores Q for
    every applied path (a rename, a deletion, a new directory, a mode change), and a second
    revert finds everything already reverted."""
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    assert apply(q, f, live, accepted, tmp_path / "apply.jsonl").status == "applied"
    undone = apply(f, q, live, accepted, tmp_path / "revert.jsonl")
    assert undone.status == "applied" and not undone.conflicts
    assert sorted(undone.applied) == sorted(accepted)
    assert inventories_equal(q, live)
    assert (live / "old.txt").read_text() == "old\n"
    assert not (live / "src" / "pkg").exists()
    assert stat.S_IMODE(os.lstat(live / "src" / "util.py").st_mode) != 0o755
    again = apply(f, q, live, accepted, tmp_path / "revert.jsonl")
    assert again.applied == [] and sorted(again.already_applied) == sorted(accepted)


def test_revert_after_a_persons_edit_names_it_and_writes_nothing(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    assert apply(q, f, live, accepted, tmp_path / "apply.jsonl").status == "applied"
    (live / "src" / "new.py").write_text("the person kept working on it\n")
    before = pool.snapshot(live, pool.root / "live-before", read_only=True)
    undone = apply(f, q, live, accepted, tmp_path / "revert.jsonl")
    assert undone.status == "conflict" and undone.applied == []
    assert [c.path for c in undone.conflicts] == ["src/new.py"]
    assert inventories_equal(Path(before.path), live)


def test_live_symlink_never_redirects_a_write(pool: Pool, run_id: str, tmp_path: Path) -> None:
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(live / "src", live / "src.moved")
    os.symlink(outside, live / "src")
    plan = plan_apply(q, f, live, accepted)
    assert {c.path for c in plan.conflicts} >= {"src/app.py", "src/new.py"}
    result = apply(q, f, live, accepted, tmp_path / "r.jsonl")
    assert result.status == "conflict"
    assert list(outside.iterdir()) == []


def test_partial_apply_resumes_from_receipts(pool: Pool, run_id: str, tmp_path: Path) -> None:
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    receipts = tmp_path / "receipts.jsonl"
    first = apply(q, f, live, ["src/app.py", "old.txt"], receipts)
    assert first.status == "applied"
    with open(receipts, "a") as fh:
        fh.write('{"path": "src/new.py", "act')  # a torn line from a crash
    resumed = apply(q, f, live, accepted, receipts)
    assert resumed.status == "applied"
    assert sorted(resumed.already_applied) == ["old.txt", "src/app.py"]
    assert "src/new.py" in resumed.applied
    assert inventories_equal(f, live)


# The crashed apply below has four batches (3 * BATCH + 50 paths). Its temporaries are
# reflinks of F on the live project's own Btrfs ("reflinked": no barrier before the renames,
# one syncfs at the end) or, with the reflink refused, copies of F's bytes ("copied": a
# syncfs before each batch's renames, as on any other filesystem).
COUNT = 3 * BATCH + 50
# mode -> failpoint -> (paths holding F at the crash, receipt lines at the crash,
# temporaries left); the first batch is where each fires but "apply-after-receipts",
# which fires at the first syncfs with receipts to write.
APPLY_CRASHES = {
    "copied": {
        "apply-after-temps": (0, 0, BATCH),  # the batch's temporaries written and synced
        "mid-apply": (1, 0, BATCH - 1),  # one path renamed into place, the rest not
        "apply-after-renames": (BATCH, 0, 0),  # the batch renamed
        # the next batch's temporaries and the first batch's renames synced, its
        # receipts fsync'd, the next batch not renamed
        "apply-after-receipts": (BATCH, BATCH, BATCH),
    },
    "reflinked": {
        "apply-after-temps": (0, 0, BATCH),  # the batch's temporaries made, not synced
        "mid-apply": (1, 0, BATCH - 1),
        "apply-after-renames": (BATCH, 0, 0),
        # no barrier before: every batch renamed, then the one syncfs and every receipt
        "apply-after-receipts": (COUNT, COUNT, 0),
    },
}
APPLY_CHILD = (
    "import json, sys; from pathlib import Path; from cairn.settle import apply as settle_apply; "
    "a = sys.argv[1:]; "
    "settle_apply.clone_file = (lambda src, dst: False) if a[5] == 'copied' else "
    "settle_apply.clone_file; "
    "settle_apply.apply(Path(a[0]), Path(a[1]), Path(a[2]), "
    "json.loads(Path(a[3]).read_text()), Path(a[4]))"
)


@pytest.mark.parametrize(("mode", "failpoint"), [
    (mode, failpoint) for mode, table in APPLY_CRASHES.items() for failpoint in sorted(table)])
def test_apply_killed_between_phases_resumes_to_the_same_tree(
    pool: Pool, run_id: str, tmp_path: Path, mode: str, failpoint: str
) -> None:
    """SIGKILLed at each phase boundary of a batch, the apply leaves exactly the state the
    phase promises; run again it ends with live == F, no temporary left, and one receipt
    per path (written by the crashed run or, for what it had renamed, "already")."""
    live = pool.root / "live"
    pool.create_subvolume(live)
    (live / "data").mkdir()
    count = COUNT
    for i in range(count):
        (live / "data" / f"f{i:04}").write_text(f"old {i}\n")

    def agent(w: Path) -> None:
        for i in range(count):
            (w / "data" / f"f{i:04}").write_text(f"new {i}\n")

    q, f, accepted, _ = settle_run(pool, run_id, live, agent, SettlementPolicy())
    assert len(accepted) == count
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(accepted))
    receipts = tmp_path / "receipts.jsonl"
    child = subprocess.run(
        [sys.executable, "-c", APPLY_CHILD, str(q), str(f), str(live), str(plan_file),
         str(receipts), mode],
        cwd=REPO, env={**os.environ, "CAIRN_FAILPOINTS": failpoint}, timeout=120, check=False,
    )
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / f"failpoint-{failpoint}").exists()

    holding_f, receipt_lines, temps_left = APPLY_CRASHES[mode][failpoint]
    contents = [(live / "data" / f"f{i:04}").read_text() for i in range(count)]
    assert sum(c.startswith("new") for c in contents) == holding_f
    assert receipts.read_text().count("\n") == receipt_lines
    assert len(list(live.rglob(".cairn-apply.*"))) == temps_left

    result = apply(q, f, live, accepted, receipts)
    assert result.status == "applied"
    assert len(result.already_applied) == holding_f
    assert len(result.applied) == count - holding_f
    assert inventories_equal(f, live)
    assert not list(live.rglob(".cairn-apply.*"))
    lines = [json.loads(line) for line in receipts.read_text().splitlines()]
    assert sorted(r["path"] for r in lines) == sorted(accepted)  # each exactly once
    first = {r["path"]: r["action"] for r in lines[:holding_f]}
    assert set(first.values()) <= {"written" if receipt_lines else "already"}


def test_new_empty_files_are_made_in_place_and_a_crash_leaves_them_as_f(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    """An empty file new in F is created where it goes (``O_EXCL``, F's mode), not through
    a temporary: killed after the first batch's creates, the apply leaves those paths
    exactly as F holds them (no temporary, no receipt), and the re-run records them as
    already applied."""
    live = pool.root / "live"
    pool.create_subvolume(live)
    count = BATCH + 10

    def agent(w: Path) -> None:
        (w / "gen").mkdir()
        for i in range(count):
            (w / "gen" / f"e{i:04}").touch(mode=0o640)

    q, f, accepted, _ = settle_run(pool, run_id, live, agent, SettlementPolicy())
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(accepted))
    receipts = tmp_path / "receipts.jsonl"
    child = subprocess.run(
        [sys.executable, "-c", APPLY_CHILD, str(q), str(f), str(live), str(plan_file),
         str(receipts), "reflinked"],
        cwd=REPO, env={**os.environ, "CAIRN_FAILPOINTS": "apply-after-temps"}, timeout=120,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL
    made = sorted((live / "gen").iterdir())
    assert len(made) == BATCH - 1  # the first batch: "gen" itself and BATCH - 1 files
    assert all(m.stat().st_size == 0 and m.stat().st_mode & 0o777 == 0o640 for m in made)
    assert not list(live.rglob(".cairn-apply.*"))
    assert not receipts.exists() or receipts.read_text() == ""

    result = apply(q, f, live, accepted, receipts)
    assert result.status == "applied"
    assert len(result.already_applied) == BATCH
    assert inventories_equal(f, live)


def test_a_file_a_person_made_where_an_empty_one_goes_stops_the_apply(
    pool: Pool, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-place create of an empty file is its own re-check: a file a person made
    there after the plan is never replaced, and the apply stops at it."""
    live = live_project(pool)

    def agent(w: Path) -> None:
        (w / "src" / "empty.py").touch()
        (w / "src" / "zz.py").touch()

    q, f, accepted, _ = settle_run(pool, run_id, live, agent, SettlementPolicy())
    real_make_parents = settle_apply._make_parents

    def person_first(batch: object, ft: object, path: str) -> None:
        if path == "src/empty.py":
            (live / "src" / "empty.py").write_text("a person got there first\n")
        real_make_parents(batch, ft, path)  # type: ignore[arg-type]

    monkeypatch.setattr(settle_apply, "_make_parents", person_first)
    result = apply(q, f, live, accepted, tmp_path / "receipts.jsonl")
    assert result.status == "conflict"
    assert [c.path for c in result.conflicts] == ["src/empty.py"]
    assert (live / "src" / "empty.py").read_text() == "a person got there first\n"
    assert not (live / "src" / "zz.py").exists()


def test_a_persons_edit_during_the_apply_stops_it_and_is_kept(
    pool: Pool, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-check right before each rename: a file a person edits after the plan (here
    between the batch's temporaries and its renames) is never overwritten; what was
    renamed before it stays, with receipts, and no temporary is left behind."""
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    real_failpoint = failpoints.failpoint

    def edit_after_temps(name: str, marker: Path) -> None:
        if name == "apply-after-temps":
            (live / "src" / "new.py").write_text("a person got there first\n")
        real_failpoint(name, marker)

    monkeypatch.setattr(settle_apply, "failpoint", edit_after_temps)
    receipts = tmp_path / "receipts.jsonl"
    result = apply(q, f, live, accepted, receipts)
    assert result.status == "conflict"
    assert [c.path for c in result.conflicts] == ["src/new.py"]
    assert (live / "src" / "new.py").read_text() == "a person got there first\n"
    assert (live / "src" / "app.py").read_text() == "v2\n"  # renamed before src/new.py
    assert not list(live.rglob(".cairn-apply.*"))
    recorded = {json.loads(line)["path"] for line in receipts.read_text().splitlines()}
    assert recorded == set(result.applied) and "src/new.py" not in recorded


@pytest.mark.parametrize("mode", ["reflinked", "copied"])
def test_only_copied_bytes_need_a_barrier_before_the_renames(
    pool: Pool, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """On the live project's own Btrfs a temporary that shares F's data (a reflink) is
    metadata that commits in order with its rename: the whole apply makes one syncfs,
    after the renames, then writes its receipts. Bytes copied into a temporary get a
    syncfs before the first rename, as on every other filesystem."""
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    events: list[str] = []
    real_syncfs, real_rename = fsutil.syncfs, os.rename

    def syncfs(fd: int) -> None:
        events.append("syncfs")
        real_syncfs(fd)

    def rename(src: str, dst: str, **kwargs: int) -> None:
        if src.startswith(".cairn-apply."):
            events.append("rename")
        real_rename(src, dst, **kwargs)

    monkeypatch.setattr(settle_apply, "syncfs", syncfs)
    monkeypatch.setattr(os, "rename", rename)
    if mode == "copied":
        monkeypatch.setattr(settle_apply, "clone_file", lambda src, dst: False)
    receipts = tmp_path / "receipts.jsonl"
    progress: list[tuple[int, int]] = []
    result = apply(q, f, live, accepted, receipts, lambda n, total: progress.append((n, total)))
    assert result.status == "applied"
    assert inventories_equal(f, live)
    renames, total = events.count("rename"), len(accepted)
    assert renames >= 2
    if mode == "reflinked":
        assert events == ["rename"] * renames + ["syncfs"]
        assert progress == [(total, total)]
    else:  # the first syncfs also settles the deletions' batch (old.txt, docs/guide.md)
        assert events == ["syncfs"] + ["rename"] * renames + ["syncfs"]
        assert progress == [(2, total), (total, total)]
    assert {json.loads(line)["path"] for line in receipts.read_text().splitlines()} == set(
        result.applied)


def test_clone_file_shares_data_on_one_btrfs_and_declines_across_filesystems(
    pool: Pool, tmp_path: Path
) -> None:
    data = os.urandom(70_000)
    (pool.root / "src").write_bytes(data)
    fds = [os.open(pool.root / "src", os.O_RDONLY),
           os.open(pool.root / "same", os.O_WRONLY | os.O_CREAT, 0o600),
           os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT, 0o600)]
    try:
        assert fsutil.on_btrfs(fds[1]) and not fsutil.on_btrfs(fds[2])
        assert fsutil.clone_file(fds[0], fds[1]) is True
        assert fsutil.clone_file(fds[0], fds[2]) is False
    finally:
        for fd in fds:
            os.close(fd)
    assert (pool.root / "same").read_bytes() == data
    assert (tmp_path / "other").read_bytes() == b""


def test_worker_main_reports_conflict_as_an_outcome(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("cairn_worker_apply", REPO / "worker/apply.py")
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)

    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    (live / "old.txt").write_text("edited\n")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(accepted))
    result_file = tmp_path / "result.json"
    argv = ["--q", str(q), "--f", str(f), "--live", str(live), "--plan", str(plan_file),
            "--receipts", str(tmp_path / "r.jsonl"), "--result", str(result_file)]
    assert worker.main(argv) == 0
    out = json.loads(result_file.read_text())
    assert out["status"] == "conflict" and out["conflicts"][0]["path"] == "old.txt"
    plan_file.write_text('{"not": "a list"}')
    assert worker.main(argv) == 1


def test_a_symlink_planted_after_the_plan_never_redirects_a_write(
    pool: Pool, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Directories are opened once per walk: a live directory swapped for a symlink
    between the plan and the writes is found by the batch's own walk, never followed."""
    live = live_project(pool)
    q, f, accepted, _ = settle_run(pool, run_id, live, good_agent, SettlementPolicy())
    outside = tmp_path / "outside"
    outside.mkdir()
    real_plan = settle_apply._plan

    def plan_then_swap(*args: object, **kwargs: object) -> settle_apply.ApplyPlan:
        planned = real_plan(*args, **kwargs)  # type: ignore[arg-type]
        os.rename(live / "src", live / "src.moved")
        os.symlink(outside, live / "src")
        return planned

    monkeypatch.setattr(settle_apply, "_plan", plan_then_swap)
    result = apply(q, f, live, accepted, tmp_path / "r.jsonl")
    assert result.status == "conflict"
    assert result.conflicts[0].path.startswith("src/")
    assert list(outside.iterdir()) == []
    assert (live / "src.moved" / "app.py").read_text() == "v1\n"
