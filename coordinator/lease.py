"""The run lease (ARCHITECTURE §5): who holds it, whether a holder on this host is dead,
and the heartbeat that renews it while the coordinator runs (a coordinator that lost it
exits without writing)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from pathlib import Path

from cairn import paths
from cairn.coordinator.base import EXIT_RESTART
from cairn.coordinator.context import RunContext
from cairn.journal.readwrite import Journal
from cairn.journal.store import LEASE_TTL
from cairn.journal.writes import LeaseLost

# The coordinator's lines keep the logger name they always had.
log = logging.getLogger("cairn.coordinator.core")

HEARTBEAT = 15.0
UNKNOWN_BOOT = "unknown-boot"


def boot_id() -> str:
    """This boot's ID; unknown inside a sandbox without /proc/sys (ProcSubset=pid), in
    which case leases are judged by their process alone."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return UNKNOWN_BOOT


def lease_holder() -> str:
    """``host:boot:pid`` of this coordinator process."""
    return f"{socket.gethostname()}:{boot_id()}:{os.getpid()}"


def holder_is_dead(run_id: str, holder: str) -> bool:
    """A lease holder on this host that is gone: from an earlier boot, or a process that
    no longer exists or is no longer this run's coordinator."""
    host, _, rest = holder.partition(":")
    boot, _, pid = rest.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if UNKNOWN_BOOT not in (boot, boot_id()) and boot != boot_id():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists; whose it is we may not see
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot tell: treat as alive, the lease expires on its own
    return not is_coordinator_cmdline(cmdline, run_id)


def is_coordinator_cmdline(cmdline: bytes, run_id: str) -> bool:
    """Whether ``/proc/PID/cmdline`` is ``run_id``'s coordinator: the installed program
    (``/usr/libexec/cairn/cairn-coordinator RUN``, run by its interpreter) or the module
    (``python3 -m cairn.coordinator RUN``)."""
    argv = cmdline.rstrip(b"\0").split(b"\0")
    if run_id.encode() not in argv:
        return False
    return any(
        os.path.basename(arg) == b"cairn-coordinator" or arg == b"cairn.coordinator"
        for arg in argv
    )


class Lease:
    """The run lease of one coordinator: taken once (its fencing token becomes the run
    context's), renewed by a heartbeat thread, given back when the coordinator ends."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.holder = lease_holder()
        self._stop_heartbeat = threading.Event()

    def take(self) -> int:
        """Take the lease (from a holder that is dead, or once it expired) and keep it
        renewed; the fencing token."""
        run_id = self.run.run_id
        self.run.token = self.run.journal.acquire_lease(
            run_id,
            self.holder,
            ttl=LEASE_TTL,
            holder_is_dead=lambda holder: holder_is_dead(run_id, holder),
        )
        threading.Thread(target=self._heartbeat, daemon=True).start()
        return self.run.token

    def stop_heartbeat(self) -> None:
        """Renew no more: the coordinator is on its way out."""
        self._stop_heartbeat.set()

    def release(self) -> None:
        """Stop renewing and give the lease back (a lease already lost stays lost)."""
        self.stop_heartbeat()
        with contextlib.suppress(LeaseLost):
            self.run.journal.release_lease(self.run.run_id, self.run.token)

    def _heartbeat(self) -> None:
        journal = Journal(paths.journal_path())
        try:
            while not self._stop_heartbeat.wait(HEARTBEAT):
                try:
                    journal.renew_lease(self.run.run_id, self.run.token, ttl=LEASE_TTL)
                except LeaseLost:
                    log.error("lease for %s lost; exiting without writing", self.run.run_id)
                    os._exit(EXIT_RESTART)
        finally:
            journal.close()
