"""Setting up a host's storage (as root, by ``cairn storage init``): a loop-image Btrfs
pool for hosts without Btrfs, made permanent as a systemd mount unit under /etc."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from cairn import proc
from cairn.errors import StorageError, UsageError
from cairn.proc import run
from cairn.sizes import parse_size
from cairn.storage import filesystem_uuid

log = logging.getLogger(__name__)



def init_loop_storage(image: Path, size: str, mountpoint: Path) -> tuple[LoopPool, str]:
    """Create a loop-image pool of ``size`` at ``mountpoint`` and have systemd mount it at
    every boot. Returns the pool and the name of its mount unit."""
    pool = init_loop_pool(image, size, mountpoint)
    return pool, write_mount_unit(image, mountpoint)


# noatime: an agent that reads the project changes no file time, so a boundary's and the
# settlement's btrfs send walk only what it wrote (reading updates every atime otherwise).
MOUNT_OPTIONS = "loop,noatime"


def write_mount_unit(image: Path, mountpoint: Path) -> str:
    """Persist the loop mount as a systemd mount unit, enabled for boot."""
    name = (
        run(["systemd-escape", "--path", "--suffix=mount", str(mountpoint)]).stdout.decode().strip()
    )
    unit = Path("/etc/systemd/system") / name
    unit.write_text(
        "[Unit]\nDescription=Cairn storage pool\nBefore=cairn-broker.service\n\n"
        f"[Mount]\nWhat={image}\nWhere={mountpoint}\nType=btrfs\nOptions={MOUNT_OPTIONS}\n\n"
        "[Install]\nWantedBy=local-fs.target\n"
    )
    if Path("/run/systemd/system").exists():
        run(["systemctl", "daemon-reload"])
        run(["systemctl", "enable", name])
    return name


class LoopPool(BaseModel):
    """What ``init_loop_pool`` did: the image, its mount point and the new filesystem."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    image: str
    mountpoint: str
    size_bytes: int
    fsid: str
    device: str


def _mounted_source(mountpoint: Path) -> str | None:
    target = os.fspath(mountpoint.resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 4 and fields[4].encode().decode("unicode_escape") == target:
            return right.split()[1]
    return None


NODE_SIZES = (4096, 8192, 16384, 32768, 65536)


def init_loop_pool(
    image: Path, size: str, mountpoint: Path, *, node_size: int | None = None
) -> LoopPool:
    """Create a sparse image of ``size``, make Btrfs on it and loop-mount it at
    ``mountpoint`` (as root), with Btrfs nodes of ``node_size`` bytes (mkfs's default
    without). Refuses an existing image or a mountpoint already in use; undoes its own
    steps if a later one fails."""
    size_bytes = parse_size(size)
    if node_size is not None and node_size not in NODE_SIZES:
        raise UsageError(
            f"a Btrfs node size is one of {', '.join(map(str, NODE_SIZES))}, not {node_size}"
        )
    if size_bytes < 256 << 20:
        raise UsageError(f"a loop pool needs at least 256M, not {size}")
    if os.path.ismount(mountpoint):
        raise StorageError(f"{mountpoint} is already a mount point", hint="pick another path")
    if image.exists():
        raise StorageError(f"image {image} already exists", hint="remove it or pick another path")
    image.parent.mkdir(parents=True, exist_ok=True)
    created_mountpoint = not mountpoint.exists()
    mountpoint.mkdir(parents=True, exist_ok=True)
    if any(mountpoint.iterdir()):
        raise StorageError(f"{mountpoint} is not empty", hint="pick an empty directory")
    mounted = False
    try:
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size_bytes)
        finally:
            os.close(fd)
        nodes = ["--nodesize", str(node_size)] if node_size else []
        proc.run(["mkfs.btrfs", "-q", *nodes, image], timeout=300)
        proc.run(["mount", "-o", MOUNT_OPTIONS, image, mountpoint], timeout=120)
        mounted = True
        device = _mounted_source(mountpoint) or ""
        fsid = filesystem_uuid(mountpoint)
    except BaseException:
        if mounted:
            proc.run(["umount", mountpoint], check=False)
        image.unlink(missing_ok=True)
        if created_mountpoint:
            mountpoint.rmdir()
        raise
    log.info("loop pool %s on %s (%s, fsid %s)", mountpoint, image, device, fsid)
    return LoopPool(
        image=os.fspath(image),
        mountpoint=os.fspath(mountpoint),
        size_bytes=size_bytes,
        fsid=fsid,
        device=device,
    )


def remove_loop_pool(pool: LoopPool, *, delete_image: bool = True) -> None:
    """Unmount a loop pool, make sure its loop device is detached, and (by default)
    delete the image."""
    mountpoint = Path(pool.mountpoint)
    if os.path.ismount(mountpoint):
        proc.run(["umount", mountpoint], timeout=120)
    out = proc.run(["losetup", "-j", pool.image], check=False)
    for line in (out.stdout or b"").decode(errors="replace").splitlines():
        dev = line.split(":", 1)[0].strip()
        if dev.startswith("/dev/loop"):
            proc.run(["losetup", "-d", dev], check=False)
    if delete_image:
        Path(pool.image).unlink(missing_ok=True)
