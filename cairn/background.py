"""Runs are background work: they yield the CPU to the people on the machine and to
cairnd when it is contended, and use all of it when it is not.

Where systemd has the cgroup CPU controller, ``cairn.slice`` (``CPUWeight=20``) holds
every run unit and does this. Where it has not (a cgroup v1 host, the containers of many
hosts), the kernel shares the CPU between sessions ("autogroups", sched(7)) with an equal
share each, whatever their nice value inside; systemd starts every unit in a session of
its own, so each of a run's units would weigh as much as a person's shell. There, a run
unit's session gets the autogroup nice :data:`AUTOGROUP_NICE`. A process may raise its
own autogroup's nice value but not lower it below 0, so this is a courtesy a run's own
code cannot turn into more than an equal share.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import time

log = logging.getLogger(__name__)

AUTOGROUP_NICE = 19
AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"
# How long a unit's main process may take to call setsid() after its start job ended.
SESSION_WAIT_SEC = 0.5
SESSION_POLL_SEC = 0.005


def autogroups_in_use(switch: str = AUTOGROUP_SWITCH) -> bool:
    """Whether the kernel groups the CPU share by session (``CONFIG_SCHED_AUTOGROUP`` and
    ``kernel.sched_autogroup_enabled=1``)."""
    try:
        with open(switch, "rb") as f:
            return f.read(8).strip() == b"1"
    except OSError:
        return False


def yield_session(
    pid: int | None = None,
    nice: int = AUTOGROUP_NICE,
    *,
    switch: str = AUTOGROUP_SWITCH,
    session_wait: float = SESSION_WAIT_SEC,
) -> bool:
    """Give the session of ``pid`` (this process when None) the autogroup nice value
    ``nice``; True if it took.

    Another process's session must be neither PID 1's nor this process's, and the process
    gets ``session_wait`` seconds to leave them: a unit's start job ends once PID 1 has
    forked its main process, which may not have called ``setsid()`` yet and so still be in
    PID 1's session, whose share this must never lower. (A unit's session is not always
    its main process's own: with ``PrivatePIDs=`` the main process is a child of the one
    that called ``setsid()``.) The process is pinned by a pidfd (polled, which needs no
    permission to signal it), so a PID that was reused meanwhile is never touched. A
    process without ``CAP_SYS_ADMIN`` may do this once per 100 ms on the whole machine: a
    refusal for that (``EAGAIN``) is False, not an error."""
    if not autogroups_in_use(switch):
        return False
    target = "self" if pid is None else str(pid)
    number = os.getpid() if pid is None else pid
    try:
        pidfd = os.pidfd_open(number)
    except OSError:
        return False  # already gone
    try:
        if pid is not None and not _in_a_session_of_its_own(number, pidfd, session_wait):
            log.debug("process %d is in PID 1's session or this one; its share is kept",
                      number)
            return False
        proc_dir = os.open(f"/proc/{target}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _exited(pidfd):  # else proc_dir is that process's, not a reused PID's
                return False
            fd = os.open(
                "autogroup", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=proc_dir
            )
            try:
                os.write(fd, f"{nice}\n".encode())
            finally:
                os.close(fd)
        finally:
            os.close(proc_dir)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.ESRCH, errno.ENOENT):
            log.warning("cannot lower the CPU share of process %s: %s", target, exc.strerror)
        return False
    finally:
        os.close(pidfd)
    return True


def _in_a_session_of_its_own(pid: int, pidfd: int, wait: float) -> bool:
    """Whether ``pid`` (pinned by ``pidfd``) is in a session other than PID 1's and this
    process's, waiting up to ``wait`` seconds for it to be (:func:`_pause` between looks);
    False once it has ended."""
    deadline = time.monotonic() + wait
    try:
        kept = {os.getsid(1), os.getsid(0)}
    except OSError:
        return False
    while True:
        try:
            session = os.getsid(pid)
        except OSError:
            return False
        if _exited(pidfd):  # else getsid answered for this process, not a reused PID
            return False
        if session not in kept:
            return True
        if time.monotonic() >= deadline:
            return False
        _pause(SESSION_POLL_SEC)


_pause = time.sleep  # the unit tests' clock replaces it


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def yield_own_session() -> bool:
    """:func:`yield_session` for this process, if it leads its session (a unit's main
    process: systemd starts each in a session of its own); a process run by hand or by a
    test shares its caller's session and leaves it alone."""
    return os.getsid(0) == os.getpid() and yield_session()
