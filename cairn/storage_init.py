"""Setting up a host's storage (as root, by ``cairn storage init``): a loop-image Btrfs
pool for hosts without Btrfs, made permanent as a systemd mount unit under /etc."""

from __future__ import annotations

from pathlib import Path

from cairn.proc import run
from cairn.storage import LoopPool, init_loop_pool


def init_loop_storage(image: Path, size: str, mountpoint: Path) -> tuple[LoopPool, str]:
    """Create a loop-image pool of ``size`` at ``mountpoint`` and have systemd mount it at
    every boot. Returns the pool and the name of its mount unit."""
    pool = init_loop_pool(image, size, mountpoint)
    return pool, write_mount_unit(image, mountpoint)


def write_mount_unit(image: Path, mountpoint: Path) -> str:
    """Persist the loop mount as a systemd mount unit, enabled for boot."""
    name = (
        run(["systemd-escape", "--path", "--suffix=mount", str(mountpoint)]).stdout.decode().strip()
    )
    unit = Path("/etc/systemd/system") / name
    unit.write_text(
        "[Unit]\nDescription=Cairn storage pool\nBefore=cairn-broker.service\n\n"
        f"[Mount]\nWhat={image}\nWhere={mountpoint}\nType=btrfs\nOptions=loop\n\n"
        "[Install]\nWantedBy=local-fs.target\n"
    )
    if Path("/run/systemd/system").exists():
        run(["systemctl", "daemon-reload"])
        run(["systemctl", "enable", name])
    return name
