"""Fixtures for the system tier: the built package and booted throwaway machines.

The tier needs root, ``systemd-nspawn`` (package ``systemd-container``) and
``debootstrap``; without them it is skipped with the reason. Anything else that goes
wrong (no mirror, a broken package) is an error, never a skip.

``CAIRN_DEB=/path/to/cairn_*.deb`` tests a prebuilt package instead of building one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import Machine

from cairn.proc import run

REPO = Path(__file__).resolve().parents[2]


def _missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "the system tier needs root (loop devices, overlay mounts, nspawn)"
    for tool, package in (("systemd-nspawn", "systemd-container"), ("debootstrap", "debootstrap")):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"the system tier needs {tool} (apt-get install {package})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing_requirement()
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.system)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def deb() -> Path:
    """The package under test: ``$CAIRN_DEB`` or a fresh build of this tree."""
    prebuilt = os.environ.get("CAIRN_DEB")
    if prebuilt:
        path = Path(prebuilt)
        if not path.is_file():
            pytest.fail(f"CAIRN_DEB={prebuilt} does not exist")
        return path
    result = run([REPO / "packaging" / "build-deb.sh"], timeout=900)
    return Path(result.stdout.decode().strip().splitlines()[-1])


@pytest.fixture
def machine(deb: Path) -> Iterator[Machine]:
    """A booted machine with the package installed, users alice and bob, and a loop
    Btrfs pool bound at /var/lib/cairn/pool."""
    with Machine(deb, with_pool=True) as booted:
        yield booted
