"""The patch of ``cairn diff`` against what git shows for the same two trees: new (empty
too), deleted, mode-only, symbolic links, type changes, binary; a file past the text limit
and a pathological rewrite stay bounded in time; ``git apply`` of the patch turns Q into
F."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cairn.protocol.limits import DIFF_LIMIT
from cairn.settle import diff as settle_diff
from cairn.settle.diff import TEXT_LIMIT, unified_diff

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", *argv], cwd=cwd, env=env, check=True, capture_output=True)
    return done.stdout.decode("utf-8", errors="replace")


def git_patch(tmp: Path, q: Path, f: Path) -> str:
    """``git diff`` from tree ``q`` to tree ``f`` (both staged in a scratch repository),
    without the ``index`` lines (blob ids, which Cairn does not write) and the function
    names git appends to a hunk header."""
    repo = tmp / "repo.git"
    git("init", "-q", "--bare", str(repo), cwd=tmp)
    git("--git-dir", str(repo), "config", "core.bare", "false", cwd=tmp)
    env = {**os.environ, "GIT_DIR": str(repo), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    git("--work-tree", str(q), "add", "-A", cwd=tmp, env=env)
    git("--work-tree", str(q), "commit", "-q", "--allow-empty", "-m", "q", cwd=tmp, env=env)
    git("--work-tree", str(f), "add", "-A", cwd=tmp, env=env)
    text = git("diff", "--cached", "--no-renames", "--no-color", "--diff-algorithm=myers",
               cwd=tmp, env=env)
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("index "))
    return re.sub(r"^(@@ [^@]* @@).*$", r"\1", text, flags=re.M)


def headers(patch: str) -> list[str]:
    return [line for line in patch.splitlines() if line.startswith(
        ("diff --git ", "new file ", "deleted file ", "old mode ", "new mode ", "--- ", "+++ "))]


def changed(q: Path, f: Path) -> list[str]:
    """Every path that differs between the trees (what the candidate accepts)."""
    def entries(root: Path) -> set[str]:
        found = set()
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                found.add(os.path.relpath(os.path.join(dirpath, name), root))
        return found
    return sorted(entries(q) | entries(f))


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    q, f = tmp_path / "Q", tmp_path / "F"
    q.mkdir()
    f.mkdir()
    return q, f


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def test_every_kind_of_change_is_shown_as_git_shows_it(
    tmp_path: Path, trees: tuple[Path, Path]
) -> None:
    q, f = trees
    write(f / "new-empty", b"")
    write(f / "src" / "new.py", b"print('new')\nx = 1\n")
    write(q / "gone.txt", b"old\nlines\n")
    write(q / "gone-empty", b"")
    write(q / "script.sh", b"#!/bin/sh\necho hi\n")
    write(f / "script.sh", b"#!/bin/sh\necho hi\n", 0o755)  # mode only
    write(q / "both.sh", b"a\n", 0o755)
    write(f / "both.sh", b"b\n", 0o644)  # mode and content
    os.symlink("target/one", f / "new-link")
    os.symlink("old-target", q / "moved-link")
    os.symlink("new-target", f / "moved-link")
    write(q / "was-file", b"content\n")
    os.symlink("now-a-link", f / "was-file")  # a type change: deletion, then creation
    write(f / "blob.bin", b"\x00\x01\x02binary")
    write(q / "edit.txt", b"".join(b"line %d\n" % i for i in range(40)))
    write(f / "edit.txt", b"".join(b"line %d\n" % (i + 100 * (i % 7 == 3)) for i in range(40)))
    write(q / "nonl.txt", b"one\ntwo\n")
    write(f / "nonl.txt", b"one\ntwo")
    write(f / "crlf.txt", b"a\r\nb\x0cc\rd\n")  # split at newlines only

    patch = unified_diff(q, f, "", changed(q, f))

    assert patch == git_patch(tmp_path, q, f)
    assert "diff --git a/new-empty b/new-empty\nnew file mode 100644\n" in patch
    assert "diff --git a/gone-empty b/gone-empty\ndeleted file mode 100644\n" in patch
    assert "diff --git a/script.sh b/script.sh\nold mode 100644\nnew mode 100755\n" in patch
    assert "new file mode 120000\n--- /dev/null\n+++ b/new-link\n@@ -0,0 +1 @@\n+target/one\n" \
        "\\ No newline at end of file\n" in patch
    assert "Binary files /dev/null and b/blob.bin differ\n" in patch


def test_git_apply_of_the_patch_turns_q_into_f(tmp_path: Path, trees: tuple[Path, Path]) -> None:
    q, f = trees
    rng = random.Random(7)
    for i in range(30):
        lines = [b"%d\n" % rng.randrange(10) for _ in range(rng.randrange(0, 60))]
        write(q / f"f{i}", b"".join(lines))
        for _ in range(rng.randrange(0, 6)):
            at = rng.randrange(0, len(lines) + 1)
            if rng.random() < 0.5 and at < len(lines):
                del lines[at]
            else:
                lines.insert(at, b"new %d\n" % rng.randrange(5))
        write(f / f"f{i}", b"".join(lines), 0o755 if i % 5 == 0 else 0o644)
    write(f / "empty", b"")
    os.symlink("f1", f / "link")
    patch = unified_diff(q, f, "", changed(q, f))
    # Where lines repeat, git may pick another alignment of the same size: the headers
    # are git's, and the patch does what git's does.
    assert headers(patch) == headers(git_patch(tmp_path, q, f))

    work = tmp_path / "work"
    shutil.copytree(q, work, symlinks=True)
    subprocess.run(["git", "apply", "--unsafe-paths", "-"], cwd=work, input=patch.encode(),
                   check=True)
    for rel in changed(q, f):
        assert (work / rel).is_symlink() == (f / rel).is_symlink(), rel
        if (f / rel).is_symlink():
            assert os.readlink(work / rel) == os.readlink(f / rel)
        else:
            assert (work / rel).read_bytes() == (f / rel).read_bytes(), rel
            assert os.stat(work / rel).st_mode & 0o100 == os.stat(f / rel).st_mode & 0o100


def test_a_file_past_the_text_limit_is_said_to_differ_without_being_read(
    trees: tuple[Path, Path],
) -> None:
    q, f = trees
    write(q / "huge.log", b"x\n" * (TEXT_LIMIT // 2 + 1))
    write(f / "huge.log", b"y\n" * (TEXT_LIMIT // 2 + 1))
    write(f / "new-huge.log", b"z\n" * TEXT_LIMIT)
    patch = unified_diff(q, f, "", ["huge.log", "new-huge.log"])
    assert patch == (
        "diff --git a/huge.log b/huge.log\nBinary files a/huge.log and b/huge.log differ\n"
        "diff --git a/new-huge.log b/new-huge.log\nnew file mode 100644\n"
        "Binary files /dev/null and b/new-huge.log differ\n"
    )


def test_a_pathological_rewrite_is_bounded_and_still_a_correct_patch(
    tmp_path: Path, trees: tuple[Path, Path]
) -> None:
    q, f = trees
    rng = random.Random(1)
    # Many short repeated lines: quadratic (or worse) for difflib; bounded here.
    old = b"".join(b"%d\n" % rng.randrange(3) for _ in range(20_000))
    new = b"".join(b"%d\n" % rng.randrange(3) for _ in range(20_000))
    write(q / "r.txt", old)
    write(f / "r.txt", new)
    start = time.monotonic()
    patch = settle_diff.path_diff("r.txt", settle_diff._diff_side(q, "r.txt"),
                                  settle_diff._diff_side(f, "r.txt"))
    assert time.monotonic() - start < 5
    work = tmp_path / "work"
    shutil.copytree(q, work)
    subprocess.run(["git", "apply", "-"], cwd=work, input=patch.encode(), check=True)
    assert (work / "r.txt").read_bytes() == new


def test_many_new_files_stop_at_the_limit_and_say_how_many_were_left_out(
    trees: tuple[Path, Path],
) -> None:
    q, f = trees
    names = [f"d/{i:06d}" for i in range(20_000)]
    for name in names:
        write(f / name, b"")
    start = time.monotonic()
    patch = unified_diff(q, f, "", names)
    assert time.monotonic() - start < 10
    assert len(patch) <= DIFF_LIMIT + 200
    shown = patch.count("\nnew file mode 100644\n")
    assert shown > 1000
    assert patch.endswith(
        f"(diff truncated at {DIFF_LIMIT} bytes; {len(names) - shown} path(s) not shown "
        "in full)\n")
