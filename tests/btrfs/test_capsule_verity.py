"""fs-verity of the sealed release on a real Btrfs: the package's postinst turns it on
(``python3 -m cairn.broker.capsule enable-verity``) and the broker then checks every file's
digest against the signed manifest before an agent starts."""

from __future__ import annotations

import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.broker import capsule as broker_capsule
from cairn.proc import run

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "sealed-release" / "build.py"


@pytest.fixture
def installed(btrfs_mount: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A host root on Btrfs with one built capsule installed in /usr/lib/cairn."""
    root = btrfs_mount / f"host-{uuid.uuid4().hex[:12]}"
    lib = root / "usr" / "lib" / "cairn"
    name = run([sys.executable, BUILD, "--out", lib], timeout=120).stdout.decode().strip()
    monkeypatch.setenv("CAIRN_ROOT", str(root))
    yield lib / "releases" / name
    shutil.rmtree(root, ignore_errors=True)


def kernel_has_verity() -> bool:
    return "fsverity" in Path("/proc/filesystems").read_text() or any(
        "CONFIG_FS_VERITY=y" in line for line in _kernel_config())


def _kernel_config() -> list[str]:
    import gzip
    try:
        return gzip.decompress(Path("/proc/config.gz").read_bytes()).decode().splitlines()
    except OSError:
        return []


def test_verity_is_turned_on_where_the_kernel_has_it_and_checked_by_the_broker(
    installed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a kernel without fs-verity (CONFIG_FS_VERITY unset, as on the development hosts)
    enable-verity turns on nothing and the broker checks the sha256 of every file only."""
    assert broker_capsule.main(["verify"]) == 0
    assert "fs-verity unsupported" in capsys.readouterr().out  # not on yet: sha256 only
    assert broker_capsule.main(["enable-verity", str(installed)]) == 0
    out = capsys.readouterr().out
    files = sum(1 for p in installed.rglob("*") if p.is_file() and not p.is_symlink())
    some = next(iter(sorted(installed.rglob("*.py"))))
    if kernel_has_verity():
        assert "fs-verity checked" in out
        assert broker_capsule.verified_capsule(installed.name).fsverity == "checked"
        assert broker_capsule.measure_verity(some) is not None
        assert broker_capsule.enable_verity(some) is True  # already on
    else:
        counted = re.search(r"fs-verity on 0 of (\d+) files", out)
        assert counted and 0 < int(counted.group(1)) < files  # the manifest's files
        assert "fs-verity unsupported" in out
        assert broker_capsule.verified_capsule(installed.name).fsverity == "unsupported"
        assert broker_capsule.measure_verity(some) is None
        assert broker_capsule.enable_verity(some) is False


def test_the_capsule_tool_says_why_it_cannot_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    assert broker_capsule.main(["verify"]) == 1
    assert "cairn.broker.capsule: no sealed release is installed" in capsys.readouterr().err
