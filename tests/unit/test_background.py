"""Runs yield the CPU where the kernel shares it by session (cairn/background.py), tried
against this host's real kernel: a child in a session of its own gets the autogroup nice
value, a process that is gone is left alone, and a kernel without autogroups is no error.
A process still in PID 1's session or the caller's (a unit's main process before its
``setsid()``) never lowers the share of that session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.background import (
    AUTOGROUP_NICE,
    autogroups_in_use,
    yield_own_session,
    yield_session,
)

AUTOGROUPS = autogroups_in_use()
needs_autogroups = pytest.mark.skipif(
    not AUTOGROUPS, reason="this kernel shares the CPU without autogroups"
)


def restore(autogroup: str) -> None:
    """Put this session's nice value back if a failing check lowered it (root may)."""
    if autogroup and Path("/proc/self/autogroup").read_text() != autogroup \
            and os.geteuid() == 0:
        Path("/proc/self/autogroup").write_text(autogroup.rsplit(maxsplit=1)[-1] + "\n")


def group_name(autogroup: str) -> str:
    """The group's name as ``/proc/PID/autogroup`` shows it; a process whose session was
    never made after boot (a CI runner's, in a container whose init never called
    ``setsid()``) is in the kernel's default group, which that file shows as nothing."""
    return autogroup.split(maxsplit=1)[0] if autogroup else "the default group"


def session_child() -> subprocess.Popen[bytes]:
    """A process in a session of its own, blocked on its stdin until killed."""
    return subprocess.Popen(["cat"], stdin=subprocess.PIPE, start_new_session=True)


def test_the_switch_is_read_from_the_kernel(tmp_path: Path) -> None:
    switch = tmp_path / "sched_autogroup_enabled"
    switch.write_text("1\n")
    assert autogroups_in_use(str(switch))
    switch.write_text("0\n")
    assert not autogroups_in_use(str(switch))
    assert not autogroups_in_use(str(tmp_path / "missing"))


@needs_autogroups
def test_a_session_of_its_own_gets_the_background_nice() -> None:
    child = session_child()
    try:
        before = Path(f"/proc/{child.pid}/autogroup").read_text()
        assert before.endswith(" nice 0\n")
        took = yield_session(child.pid)
        after = Path(f"/proc/{child.pid}/autogroup").read_text()
        assert took == after.endswith(f" nice {AUTOGROUP_NICE}\n")
        if os.geteuid() == 0:  # exempt from the kernel's one-change-per-100-ms limit
            assert took
        assert group_name(after) == group_name(before)  # the same group, not a new one
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_is_left_alone() -> None:
    child = session_child()
    child.kill()
    child.wait()
    assert yield_session(child.pid) is False


def test_a_process_that_ended_and_was_not_reaped_is_left_alone() -> None:
    """Its PID still names it (a zombie) and its pidfd says it ended: nothing is written,
    as for a PID that was reused."""
    child = session_child()
    try:
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped
        assert Path(f"/proc/{child.pid}").exists()
        assert yield_session(child.pid) is False
    finally:
        child.wait()


def test_a_kernel_without_autogroups_is_not_touched(tmp_path: Path) -> None:
    child = session_child()
    try:
        assert yield_session(child.pid, switch=str(tmp_path / "missing")) is False
        assert Path(f"/proc/{child.pid}/autogroup").read_text().endswith(" nice 0\n")
    finally:
        child.kill()
        child.wait()


def test_a_process_that_does_not_lead_its_session_leaves_its_callers_alone() -> None:
    """A coordinator run by a test (or by hand) shares the caller's session: lowering it
    would lower the caller's shell."""
    before = Path("/proc/self/autogroup").read_text()
    assert os.getsid(0) != os.getpid()
    assert yield_own_session() is False
    assert Path("/proc/self/autogroup").read_text() == before


@needs_autogroups
def test_a_session_leader_yields_its_own_session() -> None:
    code = (
        "from pathlib import Path; from cairn.background import yield_own_session;"
        "took = yield_own_session(); print(took, Path('/proc/self/autogroup').read_text())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        start_new_session=True,
    ).stdout
    if os.geteuid() == 0:
        assert out.startswith("True ") and out.strip().endswith(f" nice {AUTOGROUP_NICE}")
    else:
        assert out.startswith("False ") or out.strip().endswith(f" nice {AUTOGROUP_NICE}")


@needs_autogroups
def test_a_process_still_in_its_starters_session_leaves_that_session_alone() -> None:
    """What the broker met: PID 1 forks a unit's main process and ends the start job
    before the child has called ``setsid()``. Lowering "its" session then lowered PID 1's
    own, for as long as the machine ran (every later unit start waited for PID 1)."""
    mine = Path("/proc/self/autogroup").read_text()
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE)  # in this test's session
    try:
        assert yield_session(child.pid, session_wait=0) is False
        assert Path("/proc/self/autogroup").read_text() == mine
        assert Path(f"/proc/{child.pid}/autogroup").read_text() == mine
    finally:
        child.kill()
        child.wait()
        restore(mine)


@needs_autogroups
def test_a_process_that_gets_a_session_of_its_own_a_moment_later_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child calls setsid() only when told, which the first pause of the wait does."""
    mine = Path("/proc/self/autogroup").read_text()
    late = "import os, sys; sys.stdin.readline(); os.setsid(); print('led', flush=True); " \
        "sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", late], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        if not pauses:
            stdin.write(b"lead\n")
            stdin.flush()
            assert stdout.readline() == b"led\n"
        pauses.append(seconds)

    monkeypatch.setattr("cairn.background._pause", pause)
    try:
        assert os.getsid(child.pid) == os.getsid(0)
        took = yield_session(child.pid)
        assert len(pauses) == 1 and os.getsid(child.pid) == child.pid
        group = Path(f"/proc/{child.pid}/autogroup").read_text()
        assert group_name(group) != group_name(mine)
        assert took == group.endswith(f" nice {AUTOGROUP_NICE}\n")
        if os.geteuid() == 0:  # exempt from the kernel's one-change-per-100-ms limit
            assert took
        assert Path("/proc/self/autogroup").read_text() == mine
    finally:
        child.kill()
        child.wait()
        restore(mine)
