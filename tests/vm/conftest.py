"""Fixtures for the VM tier: the built package and one booted QEMU/TCG VM per test module.

The tier needs root, ``qemu-system-x86_64`` (package ``qemu-system-x86``), ``ssh`` and
``ssh-keygen`` (``openssh-client``) and ``debootstrap``; without them it is skipped with
the reason. Anything else that goes wrong (no mirror, a broken package, a VM that does not
boot) is an error, never a skip.

The emulated CPU is about 50 times slower than the host, so a module shares one VM: it is
booted once, gets a loop-image Btrfs pool from ``cairn storage init --loop 2G``, and each
test makes its own runs on it. ``CAIRN_DEB=/path/to/cairn_*.deb`` tests a prebuilt package.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from cairn.proc import run

if TYPE_CHECKING:
    from machine import VirtualMachine

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
POOL_SIZE = "2G"
TOOLS = (
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
    ("debootstrap", "debootstrap"),
)


def _vm_harness() -> ModuleType:
    """``tests/vm/machine.py`` under a name of its own: the system tier's harness is also
    a top-level ``machine`` module, and both tiers may be collected in one session."""
    name = "cairn_tests_vm_machine"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "machine.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "the vm tier needs root (overlay mounts and chroot to build the disk image)"
    for tool, package in TOOLS:
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"the vm tier needs {tool} (apt-get install {package})"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vm: boots a throwaway QEMU/TCG virtual machine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing_requirement()
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.vm)
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


@pytest.fixture(scope="module")
def vm(deb: Path) -> Iterator[VirtualMachine]:
    """A booted VM with the package installed, users alice and bob, and a loop-image
    Btrfs pool made by ``cairn storage init``. After the module, the QEMU process is gone
    and nothing of the VM is left on the host."""
    harness = _vm_harness()
    machine: VirtualMachine = harness.VirtualMachine(deb)
    with machine:
        machine.exec(["cairn", "storage", "init", "--loop", POOL_SIZE], timeout=300)
        yield machine
    assert not machine.running, f"qemu {machine.qemu_pid} still runs"
    assert not machine.tmp.exists(), f"{machine.tmp} was left behind"
