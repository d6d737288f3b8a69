"""Edges of library code the root broker loads that no other test reaches: a reader's
directory cache past its size, a link read where there is no link, a new file where a
directory stands, an attestation line that is not one, the per-run socket paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn import paths, untrusted
from cairn.protocol.attestation import attestation_line, parse_attestation

RUN = "flow_" + "c" * 32


def test_a_reader_keeps_only_its_most_recent_directories_open(tmp_path: Path) -> None:
    for i in range(untrusted.DIRS_OPEN + 5):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f").write_bytes(b"x")
    with untrusted.Dirs(tmp_path) as dirs:
        for i in range(untrusted.DIRS_OPEN + 5):
            assert untrusted.lstat(dirs, f"d{i}/f").st_size == 1
        assert len(dirs.fds) == untrusted.DIRS_OPEN
        assert "d0" not in dirs.fds and f"d{untrusted.DIRS_OPEN + 4}" in dirs.fds
        # an evicted directory is opened again, no link followed
        assert untrusted.lstat(dirs, "d0/f").st_size == 1


def test_reading_a_link_where_there_is_a_plain_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a link")
    (tmp_path / "link").symlink_to("target")
    with untrusted.Dirs(tmp_path) as dirs:
        assert untrusted.readlink(dirs, "link") == "target"
        with pytest.raises(untrusted.UntrustedFileError, match="plain"):
            untrusted.readlink(dirs, "plain")


def test_a_new_file_is_never_written_where_a_directory_stands(tmp_path: Path) -> None:
    (tmp_path / "result.json").mkdir()
    with pytest.raises(untrusted.UntrustedFileError, match="a directory"):
        untrusted.write_new(tmp_path, "result.json", b"{}", mode=0o600, uid=os.getuid(),
                            gid=os.getgid())
    assert (tmp_path / "result.json").is_dir()


def test_only_a_well_formed_attestation_line_is_written() -> None:
    line = attestation_line(RUN, "sha256:" + "d" * 64)
    assert parse_attestation(line) == (RUN, "sha256:" + "d" * 64)
    with pytest.raises(ValueError, match="not an attestation"):
        attestation_line(RUN, "sha256:short")
    with pytest.raises(ValueError, match="not an attestation"):
        attestation_line(RUN + "\nattest-v1", "sha256:" + "d" * 64)


def test_a_runs_sockets_live_under_the_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    assert paths.egress_socket(RUN) == tmp_path / "run/cairn/egress" / RUN / "egress.sock"
    model = paths.model_socket_path(RUN, "root-1")
    assert model.name == "model.sock" and model.parent == paths.agent_channel_dir(RUN, "root-1")
    assert str(model).startswith(str(tmp_path / "run/cairn"))
