"""The broker's QUIESCE proof, :func:`cairn.systemd.cgroup_is_empty`, over cgroup file
trees laid out as the kernel does: cgroup v2 (the supported hosts), and the hybrid layout
of the development hosts, whose nspawn machines run the system tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.errors import SystemdError, UsageError
from cairn.systemd import cgroup_is_empty

UNIT = "/system.slice/cairn-agent-x.service"


def v2(root: Path, populated: bool | None, *, line: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    if populated is not None:
        events = root / UNIT.lstrip("/") / "cgroup.events"
        events.parent.mkdir(parents=True)
        events.write_text(f"populated {int(populated)}\nfrozen 0\n" if line else "frozen 0\n")
    return root


def v1(root: Path, procs: dict[str, str]) -> Path:
    """The named systemd hierarchy, with ``cgroup.procs`` of each cgroup under the unit."""
    (root / "systemd").mkdir(parents=True, exist_ok=True)
    (root / "systemd" / "cgroup.procs").write_text("1\n")
    for sub, pids in procs.items():
        cgroup = root / "systemd" / UNIT.lstrip("/") / sub
        cgroup.mkdir(parents=True, exist_ok=True)
        (cgroup / "cgroup.procs").write_text(pids)
    return root


@pytest.mark.parametrize(("populated", "empty"), [(True, False), (False, True), (None, True)])
def test_cgroup_v2_decides_by_its_events_file(
    tmp_path: Path, populated: bool | None, empty: bool
) -> None:
    assert cgroup_is_empty(UNIT, root=v2(tmp_path, populated)) is empty


def test_a_v2_events_file_without_populated_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SystemdError, match="has no 'populated' line; check the cgroup v2"):
        cgroup_is_empty(UNIT, root=v2(tmp_path, True, line=False))


@pytest.mark.parametrize(
    ("procs", "unified", "empty"),
    [
        ({"": "", "payload": ""}, False, True),
        ({"": "", "payload": "4242\n"}, False, False),  # a process below the unit counts
        ({"": ""}, True, False),  # the unified hierarchy still holds one
        ({}, None, True),  # both pruned
    ],
)
def test_a_hybrid_host_needs_every_hierarchy_empty(
    tmp_path: Path, procs: dict[str, str], unified: bool | None, empty: bool
) -> None:
    v1(tmp_path, procs)
    v2(tmp_path / "unified", unified)
    (tmp_path / "cgroup.controllers").unlink(missing_ok=True)
    assert cgroup_is_empty(UNIT, root=tmp_path) is empty


def test_a_v1_host_walks_the_named_hierarchy(tmp_path: Path) -> None:
    assert cgroup_is_empty(UNIT, root=v1(tmp_path, {"": "", "a/b": ""})) is True
    assert cgroup_is_empty(UNIT, root=v1(tmp_path, {"a/b": "7\n"})) is False


def test_no_cgroup_hierarchy_or_a_path_out_of_it_is_refused(tmp_path: Path) -> None:
    assert cgroup_is_empty("") is True  # systemd already pruned it
    with pytest.raises(SystemdError, match="no systemd cgroup hierarchy under"):
        cgroup_is_empty(UNIT, root=tmp_path)
    for bad in ("system.slice/x", "/system.slice/../../etc"):
        with pytest.raises(UsageError, match="invalid control group path"):
            cgroup_is_empty(bad, root=tmp_path)
