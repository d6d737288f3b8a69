"""Settlement is whole per dependency, and nothing of a proposal vanishes unreported:
refused replacements keep their subtrees, renames are all or nothing, nested
subvolumes and special files are refused by name, and run subvolumes go away with
every subvolume an agent nested in them (real Btrfs, agents acting as an unprivileged
user where it matters)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import btrfsutil
import pytest

from cairn.protocol.settlement_record import AppliedPaths, SettlementRecord
from cairn.settle.apply import apply
from cairn.settle.candidate import Report, build_candidate
from cairn.settle.changes import changes
from cairn.settle.inventory import inventories_equal
from cairn.settle.outcome import summary
from cairn.settle.paths import NESTED_SUBVOLUME, SettlementPolicy
from cairn.storage import Pool, is_subvolume

pytestmark = pytest.mark.btrfs
AGENT = 1001
INSIDE_REPLACED = "whose replacement was refused"


def as_agent(*argv: str, cwd: Path | None = None) -> None:
    """Run ``argv`` as an unprivileged user, as an agent unit would."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    subprocess.run(
        ["setpriv", f"--reuid={AGENT}", f"--regid={AGENT}", "--clear-groups", *argv],
        check=True,
        cwd=cwd,
    )


def project(pool: Pool, owner: int = 0) -> Path:
    live = pool.root / "live"
    pool.create_subvolume(live)
    (live / "src").mkdir()
    (live / "src" / "app.py").write_text("app\n")
    (live / "src" / "lib").mkdir()
    (live / "src" / "lib" / "util.py").write_text("util\n")
    (live / "docs").mkdir()
    (live / "docs" / "guide.md").write_text("guide\n")
    (live / "pkg").mkdir()
    (live / "pkg" / "a.py").write_text("a\n")
    (live / "pkg" / ".git").mkdir()
    (live / "pkg" / ".git" / "HEAD").write_text("ref\n")
    (live / "notes.txt").write_text("notes\n")
    (live / "README").write_text("readme\n")
    if owner:
        for dirpath, dirnames, filenames in os.walk(live):
            for name in [".", *dirnames, *filenames]:
                os.lchown(Path(dirpath, name), owner, owner)
    return live


class Settled:
    def __init__(self, q: Path, p: Path, f: Path, report: Report) -> None:
        self.q, self.p, self.f, self.report = q, p, f, report
        self.reasons = {r.path: r.reason for r in report.refused}

    @property
    def accepted(self) -> list[str]:
        return self.report.accepted

    def same_as_q(self, sub: str) -> bool:
        return inventories_equal(self.q, self.f, sub)


def settle(
    pool: Pool, run_id: str, live: Path, agent: Callable[[Path], None],
    policy: SettlementPolicy | None = None, owner: int = 0,
) -> Settled:
    q = pool.q_path(run_id)
    pool.snapshot(live, q, read_only=True)
    w = pool.w_path(run_id, "root", 0)
    pool.snapshot(q, w, read_only=False)
    if owner:
        os.chown(w, owner, owner)
    agent(w)
    p = pool.settlement_path(run_id, "P")
    pool.snapshot(w, p, read_only=True)
    c = pool.settlement_path(run_id, "C")
    pool.snapshot(q, c, read_only=False)
    report = build_candidate(q, p, c, changes(q, p), policy or SettlementPolicy())
    f = pool.settlement_path(run_id, "F")
    pool.snapshot(c, f, read_only=True)
    return Settled(q, p, f, report)


# -- dependency rules -----------------------------------------------------------------


def test_directory_replaced_by_a_refused_symlink_keeps_its_files(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        shutil.rmtree(w / "src")
        os.symlink("/etc", w / "src")
        (w / "README").write_text("readme v2\n")

    s = settle(pool, run_id, live, agent)
    assert "absolute target" in s.reasons["src"]
    for path in ("src/app.py", "src/lib", "src/lib/util.py"):
        assert INSIDE_REPLACED in s.reasons[path], path
    assert s.accepted == ["README"]
    assert s.same_as_q("src")
    result = apply(s.q, s.f, live, s.accepted, tmp_path / "receipts.jsonl")
    assert result.status == "applied" and result.applied == ["README"]
    assert inventories_equal(s.q, live, "src")  # the live subtree is byte-identical
    assert (live / "README").read_text() == "readme v2\n"
    outcome = summary(SettlementRecord(status=result.status, candidate=asdict(s.report),
                                       apply=AppliedPaths.model_validate(asdict(result))))
    assert outcome is not None
    assert outcome["label"] == "applied, 4 refused" and not outcome["complete"]


def test_directory_replaced_by_an_allowed_symlink_is_applied_whole(
    pool: Pool, run_id: str, tmp_path: Path
) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        shutil.rmtree(w / "src")
        os.symlink("docs", w / "src")

    s = settle(pool, run_id, live, agent)
    assert s.reasons == {}
    assert s.accepted == ["src", "src/app.py", "src/lib", "src/lib/util.py"]
    assert os.readlink(s.f / "src") == "docs"
    assert apply(s.q, s.f, live, s.accepted, tmp_path / "r.jsonl").status == "applied"
    assert inventories_equal(s.f, live)


def test_directory_replaced_by_a_file_stays_while_it_holds_a_refused_path(
    pool: Pool, run_id: str
) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        shutil.rmtree(w / "pkg")
        (w / "pkg").write_text("now a file\n")

    s = settle(pool, run_id, live, agent)
    assert s.reasons["pkg/.git"] == ".git internals are excluded"
    assert s.reasons["pkg/.git/HEAD"] == ".git internals are excluded"
    assert s.reasons["pkg"] == "directory still holds refused paths"
    assert INSIDE_REPLACED in s.reasons["pkg/a.py"]
    assert s.accepted == []
    assert s.same_as_q("pkg")


def test_file_replaced_by_a_refused_directory_keeps_the_file(pool: Pool, run_id: str) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.unlink(w / "notes.txt")
        (w / "notes.txt").mkdir()
        os.chmod(w / "notes.txt", 0o2755)
        (w / "notes.txt" / "a.md").write_text("a\n")

    s = settle(pool, run_id, live, agent)
    assert s.reasons["notes.txt"] == "setuid/setgid bit"
    assert s.reasons["notes.txt/a.md"] == "parent directory was refused"
    assert s.accepted == []
    assert (s.f / "notes.txt").read_text() == "notes\n"


def test_file_replaced_by_a_directory_is_applied(pool: Pool, run_id: str, tmp_path: Path) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.unlink(w / "notes.txt")
        (w / "notes.txt" / "sub").mkdir(parents=True)
        (w / "notes.txt" / "sub" / "a.md").write_text("a\n")

    s = settle(pool, run_id, live, agent)
    assert s.reasons == {}
    assert s.accepted == ["notes.txt", "notes.txt/sub", "notes.txt/sub/a.md"]
    assert apply(s.q, s.f, live, s.accepted, tmp_path / "r.jsonl").status == "applied"
    assert inventories_equal(s.f, live)


def test_deletions_under_a_refused_replacement_directory_are_refused(
    pool: Pool, run_id: str
) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        shutil.rmtree(w / "src")
        (w / "src").mkdir()
        os.chmod(w / "src", 0o2775)
        (w / "src" / "fresh.py").write_text("fresh\n")

    s = settle(pool, run_id, live, agent)
    assert s.reasons["src"] == "setuid/setgid bit"
    assert s.reasons["src/fresh.py"] == "parent directory was refused"
    for path in ("src/app.py", "src/lib", "src/lib/util.py"):
        assert INSIDE_REPLACED in s.reasons[path], path
    assert s.accepted == [] and s.same_as_q("src")


def test_a_rename_whose_source_is_refused_is_not_turned_into_a_copy(
    pool: Pool, run_id: str
) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.rename(w / "docs" / "guide.md", w / "src" / "guide.md")
        (w / "src" / "app.py").write_text("app v2\n")

    s = settle(pool, run_id, live, agent, SettlementPolicy(write_paths=["src/**"]))
    assert s.reasons["docs/guide.md"] == "outside the write paths"
    assert s.reasons["src/guide.md"] == "its rename source docs/guide.md could not be removed"
    assert s.accepted == ["src/app.py"]
    assert not os.path.lexists(s.f / "src" / "guide.md")
    assert (s.f / "docs" / "guide.md").read_text() == "guide\n"


def test_a_directory_rename_is_refused_whole(pool: Pool, run_id: str) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.rename(w / "src", w / "source")
        os.mkfifo(w / "source" / "pipe")
        (w / "README").write_text("readme v2\n")

    s = settle(pool, run_id, live, agent)
    assert s.reasons["source/pipe"] == "fifo"
    assert "rename destination source was refused" in s.reasons["src"]
    assert "rename destination" in s.reasons["src/lib/util.py"]
    assert "refused in part" in s.reasons["source/app.py"]
    assert s.accepted == ["README"]
    assert s.same_as_q("src") and not os.path.lexists(s.f / "source")


def test_a_refused_rename_destination_keeps_a_replaced_source(pool: Pool, run_id: str) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.rename(w / "src" / "app.py", w / "docs" / "app.py")
        (w / "src" / "app.py").write_text("a new file in its place\n")

    s = settle(pool, run_id, live, agent, SettlementPolicy(write_paths=["src/**"]))
    assert s.reasons["docs/app.py"] == "outside the write paths"
    assert "rename destination docs/app.py was refused" in s.reasons["src/app.py"]
    assert s.accepted == []
    assert (s.f / "src" / "app.py").read_text() == "app\n"


# -- entries the proposal cannot carry ------------------------------------------------


def test_nested_subvolume_made_by_the_agent_is_reported_and_left_out(
    pool: Pool, run_id: str
) -> None:
    live = project(pool, owner=AGENT)

    def agent(w: Path) -> None:
        as_agent("btrfs", "-q", "subvolume", "create", str(w / "src" / "nest"))
        as_agent("btrfs", "-q", "subvolume", "create", str(w / "top"))
        as_agent("mkdir", str(w / "newdir"))
        as_agent("btrfs", "-q", "subvolume", "create", str(w / "newdir" / "inner"))
        as_agent("sh", "-c", "echo secret > nest/f; mkdir nest/d; echo x > nest/d/g; "
                 "echo t > ../top/t; echo n > ../newdir/inner/n; echo v2 > app.py",
                 cwd=w / "src")
        assert is_subvolume(w / "src" / "nest")

    s = settle(pool, run_id, live, agent, owner=AGENT)
    for path in ("src/nest", "top", "newdir/inner"):
        assert s.reasons[path] == NESTED_SUBVOLUME, path
        assert not os.path.lexists(s.f / path), path
        assert os.lstat(s.p / path).st_ino == 2  # the placeholder a snapshot holds
    assert s.accepted == ["newdir", "src/app.py"]
    assert not [r for r in s.reasons if r.startswith(("src/nest/", "top/"))]


def test_nested_subvolume_at_the_root_of_a_project_in_a_subdirectory(
    pool: Pool, run_id: str
) -> None:
    live = pool.root / "live"
    pool.create_subvolume(live, owner=(AGENT, AGENT))
    as_agent("sh", "-c", "mkdir -p proj/src && echo v1 > proj/src/a", cwd=live)
    q = pool.q_path(run_id)
    pool.snapshot(live, q, read_only=True)
    w = pool.w_path(run_id, "root", 0)
    pool.snapshot(q, w, read_only=False)
    as_agent("btrfs", "-q", "subvolume", "create", str(w / "proj" / "nest"))
    as_agent("sh", "-c", "echo f > nest/f", cwd=w / "proj")
    p = pool.settlement_path(run_id, "P")
    pool.snapshot(w, p, read_only=True)
    c = pool.settlement_path(run_id, "C")
    pool.snapshot(q, c, read_only=False)
    cs = changes(q, p, subpath="proj")
    assert cs.is_empty() and "" in cs.touched
    report = build_candidate(q / "proj", p / "proj", c / "proj", cs, SettlementPolicy())
    assert [(r.path, r.reason) for r in report.refused] == [("nest", NESTED_SUBVOLUME)]
    assert report.accepted == [] and not os.path.lexists(c / "proj" / "nest")


def test_nested_subvolume_inside_a_moved_directory(pool: Pool, run_id: str) -> None:
    live = project(pool, owner=AGENT)

    def agent(w: Path) -> None:
        as_agent("btrfs", "-q", "subvolume", "create", str(w / "src" / "lib" / "nest"))
        as_agent("sh", "-c", "echo f > lib/nest/f && mv lib lib2", cwd=w / "src")

    s = settle(pool, run_id, live, agent, owner=AGENT)
    assert s.reasons["src/lib2/nest"] == NESTED_SUBVOLUME
    assert not os.path.lexists(s.f / "src" / "lib2" / "nest")


def test_special_files_are_refused_by_name(pool: Pool, run_id: str) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.mkfifo(w / "src" / "pipe")
        os.mknod(w / "src" / "null", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(w / "src" / "disk", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
        os.unlink(w / "notes.txt")
        os.mkfifo(w / "notes.txt")
        cwd = os.getcwd()
        os.chdir(w / "src")  # a socket path must fit in 108 bytes
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.bind("sock")
            sock.close()
        finally:
            os.chdir(cwd)

    s = settle(pool, run_id, live, agent)
    assert s.reasons == {
        "notes.txt": "fifo",
        "src/disk": "device node",
        "src/null": "device node",
        "src/pipe": "fifo",
        "src/sock": "socket",
    }
    assert s.accepted == []
    assert (s.f / "notes.txt").read_text() == "notes\n"


# -- deleting subvolumes an agent nested ------------------------------------------------


def nest_as_agent(w: Path) -> None:
    """Nested subvolumes two deep, files in them, the outer one made read-only."""
    as_agent("btrfs", "-q", "subvolume", "create", str(w / "nest"))
    as_agent("btrfs", "-q", "subvolume", "create", str(w / "nest" / "inner"))
    as_agent("sh", "-c", "echo a > nest/a; echo b > nest/inner/b; mkdir nest/d", cwd=w)
    as_agent("btrfs", "property", "set", str(w / "nest"), "ro", "true")


def subvolumes_in(pool: Pool) -> list[str]:
    mount = pool.root.parent  # the session filesystem's top level
    prefix = pool.root.name + "/"
    return [p for p, _id in btrfsutil.SubvolumeIterator(os.fspath(mount)) if p.startswith(prefix)]


def test_deleting_w_removes_subvolumes_the_agent_nested(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 1)
    receipt = pool.create_subvolume(w, owner=(AGENT, AGENT))
    nest_as_agent(w)
    with pytest.raises(btrfsutil.BtrfsUtilError):  # what a plain recursive delete does
        btrfsutil.delete_subvolume(os.fspath(w), recursive=True)
    pool.delete(w, receipt)
    assert not os.path.lexists(w)
    assert subvolumes_in(pool) == []


def test_delete_run_removes_nested_subvolumes_in_w_and_scratch(pool: Pool, run_id: str) -> None:
    w = pool.w_path(run_id, "root", 1)
    pool.create_subvolume(w, owner=(AGENT, AGENT))
    nest_as_agent(w)
    pool.snapshot(w, pool.checkpoint_path(run_id, "op-1"), read_only=True)
    state = pool.run_dir(run_id) / "scratch" / "op-1" / "state.1"
    state.mkdir(parents=True)
    os.chown(state, AGENT, AGENT)
    nest_as_agent(state)
    deleted = pool.delete_run(run_id)
    assert os.fspath(state / "nest") in deleted
    assert not pool.run_dir(run_id).exists()
    assert subvolumes_in(pool) == []
