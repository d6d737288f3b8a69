"""Symbolic links in a proposal, on real Btrfs snapshots: a target is judged as the
kernel resolves it (a ``..`` after a name is refused, since the name may be a link), and
P is never read through a link, also when the change set names a path below one.

Each settlement test shows the escape with the kernel first (``realpath`` of P), then
that the candidate refuses it, and that every link that reaches F resolves inside F.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cairn.settle.apply import apply
from cairn.settle.candidate import Report, build_candidate
from cairn.settle.changes import ChangeSet, changes
from cairn.settle.inventory import inventories_equal
from cairn.settle.paths import SettlementPolicy, symlink_reason
from cairn.storage import Pool

pytestmark = pytest.mark.btrfs
CLIMBS = "climbs through a name"


def project(pool: Pool) -> Path:
    live = pool.root / "live"
    pool.create_subvolume(live)
    (live / "src" / "pkg").mkdir(parents=True)
    (live / "src" / "app.py").write_text("app\n")
    (live / "src" / "util.py").write_text("util\n")
    (live / "src" / "pkg" / "mod.py").write_text("mod\n")
    (live / "docs").mkdir()
    (live / "docs" / "guide.md").write_text("guide\n")
    return live


class Run:
    """Q from the live project, the agent's W, P frozen from it, a fresh C."""

    def __init__(self, pool: Pool, run_id: str, live: Path, agent: Callable[[Path], None]):
        self.pool, self.live = pool, live
        self.q = pool.q_path(run_id)
        pool.snapshot(live, self.q, read_only=True)
        w = pool.w_path(run_id, "root", 0)
        pool.snapshot(self.q, w, read_only=False)
        agent(w)
        self.p = pool.settlement_path(run_id, "P")
        pool.snapshot(w, self.p, read_only=True)
        self.c = pool.settlement_path(run_id, "C")
        pool.snapshot(self.q, self.c, read_only=False)
        self.f = pool.settlement_path(run_id, "F")

    def settle(self, change_set: ChangeSet | None = None) -> Report:
        cs = change_set if change_set is not None else changes(self.q, self.p)
        report = build_candidate(self.q, self.p, self.c, cs, SettlementPolicy())
        self.pool.snapshot(self.c, self.f, read_only=True)
        return report


def reasons(report: Report) -> dict[str, str]:
    return {r.path: r.reason for r in report.refused}


def links_stay_inside(root: Path) -> None:
    """Every symbolic link below ``root`` resolves (as the kernel would) inside it."""
    top = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            if path.is_symlink():
                resolved = os.path.realpath(path)
                assert resolved == top or resolved.startswith(top + "/"), (path, resolved)


# -- the rule itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("l", "x"),
        ("l", "."),
        ("l", "./x/./y/"),
        ("b", "."),
        ("src/l", ".."),
        ("src/l", "../docs/guide.md"),
        ("src/pkg/l", "../../docs/guide.md"),
        ("src/pkg/l", "../util.py"),
        ("src/pkg/l", ".././../docs"),
        ("src/pkg/l", "mod.py"),
        ("a", "b/c/d"),  # names only: each link on the way is judged where it stands
    ],
)
def test_targets_that_stay_inside(path: str, target: str) -> None:
    assert symlink_reason(path, target) == ""


@pytest.mark.parametrize(
    ("path", "target", "reason"),
    [
        ("a", "b/../outside", f"{CLIMBS} ('b/..')"),
        ("a", "b/..", f"{CLIMBS} ('b/..')"),
        ("a", "./b/./../x", f"{CLIMBS} ('b/..')"),
        ("src/a", "../src/b/../../x", f"{CLIMBS} ('b/..')"),
        ("src/pkg/a", "x/y/../../..", f"{CLIMBS} ('y/..')"),
        ("l", "..", "symlink target leaves the project"),
        ("l", "../live/x", "symlink target leaves the project"),
        ("src/l", "../..", "symlink target leaves the project"),
        ("src/pkg/l", "../../../etc/passwd", "symlink target leaves the project"),
        ("src/l", "/etc/passwd", "symlink with an absolute target leaves the project"),
    ],
)
def test_targets_that_may_leave(path: str, target: str, reason: str) -> None:
    assert reason in symlink_reason(path, target)


# -- settlement on Btrfs -----------------------------------------------------------------


def test_a_link_chain_that_lexical_normalization_misses_is_refused(
    pool: Pool, run_id: str
) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        os.symlink(".", w / "b")
        os.symlink("b/../outside", w / "a")  # normpath: "outside", inside; kernel: ../outside
        os.symlink(".", w / "src" / "here")
        os.symlink("here/../../outside", w / "src" / "deeper")  # normpath: "outside"

    run = Run(pool, run_id, live, agent)
    # The kernel resolves b before it applies "..": both links lead out of the snapshot.
    (run.p.parent / "outside").write_text("not the project's\n")
    for link in ("a", "src/deeper"):
        assert (run.p / link).read_text() == "not the project's\n"
    report = run.settle()
    why = reasons(report)
    assert f"{CLIMBS} ('b/..')" in why["a"]
    assert f"{CLIMBS} ('here/..')" in why["src/deeper"]
    assert sorted(report.accepted) == ["b", "src/here"]  # a link to its own directory is fine
    assert not os.path.lexists(run.f / "a") and not os.path.lexists(run.f / "src" / "deeper")
    links_stay_inside(run.f)

    result = apply(run.q, run.f, live, report.accepted, pool.root / "receipts.jsonl")
    assert result.status == "applied"
    assert not os.path.lexists(live / "a")
    links_stay_inside(live)


def test_legitimate_relative_links_are_accepted(pool: Pool, run_id: str) -> None:
    live = project(pool)

    def agent(w: Path) -> None:
        (w / "src" / "pkg" / "deep").mkdir()
        os.setxattr(w / "src" / "pkg" / "deep", "user.new", b"1")  # a new directory's
        os.setxattr(w / "docs", "user.changed", b"2")  # and an existing one's
        os.symlink("../util.py", w / "src" / "pkg" / "util-link")
        os.symlink("../../docs/guide.md", w / "src" / "pkg" / "guide")
        os.symlink("../../../src/app.py", w / "src" / "pkg" / "deep" / "app")
        os.symlink("..", w / "src" / "pkg" / "up")  # src, inside
        os.symlink("pkg/up/util.py", w / "src" / "via")  # through an accepted link
        os.symlink("src/pkg", w / "lib")  # a top-level link to a subdirectory
        os.symlink("./pkg/mod.py", w / "src" / "mod")
        os.symlink("missing/file", w / "src" / "dangling")  # inside, if it ever exists

    run = Run(pool, run_id, live, agent)
    report = run.settle()
    assert report.refused == []
    links = ["lib", "src/dangling", "src/mod", "src/pkg/deep/app", "src/pkg/guide",
             "src/pkg/up", "src/pkg/util-link", "src/via"]
    assert sorted(report.accepted) == sorted([*links, "docs", "src/pkg/deep"])
    assert os.getxattr(run.f / "src" / "pkg" / "deep", "user.new") == b"1"
    assert os.getxattr(run.f / "docs", "user.changed") == b"2"
    for link in links:
        assert os.readlink(run.f / link) == os.readlink(run.p / link)
    assert (run.f / "src" / "via").read_text() == "util\n"
    assert (run.f / "lib" / "up" / "app.py").read_text() == "app\n"  # lib/up is src
    assert (run.f / "src" / "pkg" / "deep" / "app").read_text() == "app\n"
    links_stay_inside(run.f)

    result = apply(run.q, run.f, live, report.accepted, pool.root / "receipts.jsonl")
    assert result.status == "applied"
    for link in links:
        assert os.readlink(live / link) == os.readlink(run.f / link)
    assert (live / "src" / "pkg" / "guide").read_text() == "guide\n"
    links_stay_inside(live)


def test_a_path_below_a_link_in_p_is_never_read_through_it(pool: Pool, run_id: str) -> None:
    """The change set comes from the kernel and names real paths of P; should one ever
    name a path below a link (here: made by hand), P is still not read through it."""
    live = project(pool)
    (live / "d").mkdir()
    (live / "x" / "y").mkdir(parents=True)
    elsewhere = pool.root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("not the project's\n")
    os.mkfifo(elsewhere / "pipe")

    def agent(w: Path) -> None:
        os.rmdir(w / "d")
        os.symlink(elsewhere, w / "d")  # an absolute link: refused by itself
        os.rmdir(w / "x" / "y")
        os.symlink("..", w / "x" / "y")  # x/y is x's parent, the project root
        os.symlink("../outside", w / "a")  # at the root, this leaves the project

    run = Run(pool, run_id, live, agent)
    # As the kernel reads them, d/secret is outside and x/y/a is the root's link a.
    assert (run.p / "d" / "secret").read_text() == "not the project's\n"
    assert os.readlink(run.p / "x" / "y" / "a") == "../outside"
    forged = ChangeSet(
        modified=["d/pipe", "d/secret", "x/y/a"],  # d and x/y are real directories in Q
        touched=["", "d", "x/y"],
    )
    report = run.settle(forged)
    why = reasons(report)
    for path in ("d/secret", "d/pipe", "x/y/a"):
        assert why[path] == "in the proposal snapshot: a symbolic link on the way; not followed"
    assert report.accepted == []
    assert sorted(os.listdir(run.f / "d")) == [] and sorted(os.listdir(run.f / "x" / "y")) == []
    assert inventories_equal(run.q, run.f)


def test_the_kernels_change_set_names_links_where_they_stand(pool: Pool, run_id: str) -> None:
    """A directory replaced by a link: the stream names the link and what the directory
    held, never a path below the link; the link is judged where it stands."""
    live = project(pool)

    def agent(w: Path) -> None:
        os.rename(w / "src" / "pkg", w / "moved")
        os.symlink("../moved", w / "src" / "pkg")  # the old name leads to the new place
        os.symlink("../src/app.py", w / "moved" / "app")  # below the link's target

    run = Run(pool, run_id, live, agent)
    cs = changes(run.q, run.p)
    assert not any(p.startswith("src/pkg/") for p in [*cs.created, *cs.modified])
    report = run.settle(cs)
    assert report.refused == []
    assert {"src/pkg", "moved", "moved/app", "moved/mod.py"} <= set(report.accepted)
    assert (run.f / "src" / "pkg" / "app").read_text() == "app\n"
    links_stay_inside(run.f)


def test_inventories_compare_without_following_or_blocking(pool: Pool, run_id: str) -> None:
    live = project(pool)
    os.mkfifo(live / "pipe")
    os.symlink("src", live / "s")

    def agent(w: Path) -> None:
        pass

    run = Run(pool, run_id, live, agent)
    assert inventories_equal(run.q, run.p)  # a FIFO is compared, never opened
    assert inventories_equal(run.q, run.p, "src")

    other = pool.root / "other"
    pool.snapshot(live, other, read_only=False)
    os.unlink(other / "src" / "util.py")
    os.mkfifo(other / "src" / "util.py")  # the same name, now a FIFO
    assert not inventories_equal(run.q, other)
    os.unlink(other / "src" / "util.py")
    (other / "src" / "util.py").write_text("util\n")
    assert inventories_equal(run.q, other)
    (other / "s").unlink()
    os.symlink("docs", other / "s")
    assert not inventories_equal(run.p, other)
    assert inventories_equal(run.p, other, "src")
