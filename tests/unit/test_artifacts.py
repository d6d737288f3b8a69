"""Collecting what an agent published in /outputs/artifacts (cairn.artifacts): the agent
is the attacker. Whatever it leaves there — links, FIFOs, sockets, huge or many files,
names that would drive a terminal — the collector never follows, blocks, reads past its
bounds or copies what it refused, and says what it left behind and why."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from cairn import artifacts
from cairn.artifacts import MAX_FILE_BYTES, MAX_FILES, collect
from cairn.protocol.agent import Artifacts
from cairn.protocol.mcp import MAX_ARTIFACT_TEXT

ME = os.getuid()


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    (tmp_path / "outputs" / "artifacts").mkdir(parents=True)
    return tmp_path / "outputs"


def gather(outputs: Path, dest: Path) -> Artifacts:
    return collect(outputs, owner=ME, dest=dest)


def reasons(found: Artifacts) -> dict[str, str]:
    return {r.name: r.reason for r in found.refused}


def test_files_and_directories_are_copied_with_their_hashes(outputs: Path,
                                                            tmp_path: Path) -> None:
    (outputs / "artifacts" / "report.md").write_text("# Report\n")
    (outputs / "artifacts" / "data").mkdir()
    (outputs / "artifacts" / "data" / "table.csv").write_bytes(b"a,b\n1,2\n")
    (tmp_path / "boundary").mkdir()
    dest = tmp_path / "boundary" / "artifacts"
    found = gather(outputs, dest)
    assert [(a.name, a.size) for a in found.files] == [("data/table.csv", 8),
                                                        ("report.md", 9)]
    assert found.files[1].sha256 == hashlib.sha256(b"# Report\n").hexdigest()
    assert (dest / "data" / "table.csv").read_bytes() == b"a,b\n1,2\n"
    assert stat.S_IMODE((dest / "report.md").stat().st_mode) == 0o444
    assert found.refused == [] and found.refused_total == 0


def test_no_artifacts_directory_is_no_artifacts(tmp_path: Path) -> None:
    (tmp_path / "outputs").mkdir()
    found = gather(tmp_path / "outputs", tmp_path / "dest")
    assert found == Artifacts()
    assert not (tmp_path / "dest").exists()


def test_links_fifos_and_sockets_are_left_behind_unread(outputs: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not the agent's to publish\n")
    top = outputs / "artifacts"
    (top / "link").symlink_to(secret)
    (top / "dirlink").symlink_to(tmp_path)
    os.mkfifo(top / "fifo")  # a reader that opened it blocking would hang here
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(top / "sock"))
        done = threading.Event()
        result: list[Artifacts] = []

        def run() -> None:
            result.append(gather(outputs, tmp_path / "dest"))
            done.set()

        threading.Thread(target=run, daemon=True).start()
        assert done.wait(10), "the collector blocked on what the agent left"
    found = result[0]
    assert found.files == []
    assert reasons(found) == {
        "dirlink": "a symbolic link, not a regular file",
        "fifo": "a FIFO, not a regular file",
        "link": "a symbolic link, not a regular file",
        "sock": "a socket, not a regular file",
    }
    assert not any((tmp_path / "dest").rglob("*"))


def test_an_artifacts_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outputs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "private").write_text("x")
    (tmp_path / "outputs" / "artifacts").symlink_to(tmp_path / "elsewhere")
    found = gather(tmp_path / "outputs", tmp_path / "dest")
    assert found.files == [] and reasons(found) == {
        "artifacts": "a symbolic link on the way; not followed"}


def test_a_file_over_the_size_limit_is_left_and_the_rest_taken(outputs: Path,
                                                               tmp_path: Path) -> None:
    with open(outputs / "artifacts" / "huge.bin", "wb") as huge:
        huge.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, a size all the same
    (outputs / "artifacts" / "small.txt").write_text("ok\n")
    found = gather(outputs, tmp_path / "dest")
    assert [a.name for a in found.files] == ["small.txt"]
    assert reasons(found) == {"huge.bin": f"larger than {MAX_FILE_BYTES} bytes"}
    assert not (tmp_path / "dest" / "huge.bin").exists()


def test_all_artifacts_together_stay_under_the_total(outputs: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(artifacts, "MAX_TOTAL_BYTES", 10)
    for name in ("a", "b", "c"):
        (outputs / "artifacts" / name).write_bytes(b"1234")
    found = gather(outputs, tmp_path / "dest")
    assert [a.name for a in found.files] == ["a", "b"]
    assert reasons(found) == {"c": "past the 10 bytes all artifacts may take"}


def test_many_files_stop_at_the_count_and_refusals_are_counted(outputs: Path,
                                                               tmp_path: Path) -> None:
    for n in range(MAX_FILES + 30):
        (outputs / "artifacts" / f"f{n:04d}").write_text("x")
    found = gather(outputs, tmp_path / "dest")
    assert len(found.files) == MAX_FILES
    assert found.refused_total == 30
    assert len(found.refused) == artifacts.MAX_REFUSALS
    assert found.refused[0].reason == f"more than {MAX_FILES} files"


def test_a_directory_with_too_many_entries_is_not_walked_to_its_end(
    outputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "MAX_ENTRIES", 5)
    for n in range(8):
        (outputs / "artifacts" / f"e{n}").mkdir()
    found = gather(outputs, tmp_path / "dest")
    assert found.refused[0].reason.startswith("more than 5 entries")


def test_names_that_would_drive_a_terminal_are_refused_and_reported_escaped(
    outputs: Path, tmp_path: Path
) -> None:
    top = os.fsencode(outputs / "artifacts")
    hostile = [b"clear\x1b[2J", b"line\nbreak", b"rtl\xe2\x80\xaeexe.txt", b"bad\xff"]
    for name in hostile:
        with open(top + b"/" + name, "wb") as out:
            out.write(b"x")
    (outputs / "artifacts" / "fine name.txt").write_text("ok")
    found = gather(outputs, tmp_path / "dest")
    assert [a.name for a in found.files] == ["fine name.txt"]
    assert sorted(reasons(found).items()) == [
        ("bad\\xff", "a name that is not UTF-8"),
        ("clear\\x1b[2J", "a name with a control character"),
        ("line\\nbreak", "a name with a control character"),
        ("rtl\\u202eexe.txt", "a name with a control character"),
    ]
    for refused in found.refused:
        assert refused.name.isprintable()


def test_nesting_past_the_depth_is_refused(outputs: Path, tmp_path: Path) -> None:
    deep = outputs / "artifacts" / "/".join("d" * 1 for _ in range(artifacts.MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("x")
    (outputs / "artifacts" / "d" / "near.txt").write_text("y")
    found = gather(outputs, tmp_path / "dest")
    assert [a.name for a in found.files] == ["d/near.txt"]
    assert [r.reason for r in found.refused] == [f"deeper than {artifacts.MAX_DEPTH} directories"]


def test_a_second_collection_replaces_the_first(outputs: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (outputs / "artifacts" / "old.txt").write_text("1")
    gather(outputs, dest)
    (outputs / "artifacts" / "old.txt").unlink()
    (outputs / "artifacts" / "new.txt").write_text("2")
    found = gather(outputs, dest)
    assert [a.name for a in found.files] == ["new.txt"]
    assert sorted(p.name for p in dest.iterdir()) == ["new.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_or_directory_is_refused(outputs: Path, tmp_path: Path) -> None:
    theirs = outputs / "artifacts" / "theirs.txt"
    theirs.write_text("planted")
    os.chown(theirs, 4321, 4321)
    (outputs / "artifacts" / "sub").mkdir()
    os.chown(outputs / "artifacts" / "sub", 4321, 4321)
    found = gather(outputs, tmp_path / "dest")
    assert found.files == []
    assert reasons(found) == {"sub": f"belongs to uid 4321, not {ME}",
                              "theirs.txt": f"belongs to uid 4321, not {ME}"}


def test_the_guide_states_the_limits_the_collector_keeps() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "writing-workflows.md").read_text()
    stated = (f"at most {MAX_FILES} files, {MAX_FILE_BYTES >> 20} MiB each and "
              f"{artifacts.MAX_TOTAL_BYTES >> 20} MiB together, {artifacts.MAX_DEPTH} "
              "directories deep")
    assert stated in " ".join(guide.split())
    mcp = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    assert f"at most {MAX_ARTIFACT_TEXT:,} characters" in mcp
