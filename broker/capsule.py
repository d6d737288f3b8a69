"""The broker's side of the sealed release: pick the installed capsule, verify it
completely (signature, every file's SHA-256, fs-verity digests where the filesystem has
them) and hand its path to the agent unit, or refuse.

``python3 -I -m cairn.broker.capsule verify|enable-verity`` runs the same checks from
a shell (and the package's postinst enables fs-verity where the filesystem supports it).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import logging
import os
import struct
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cairn import capsule, paths
from cairn.errors import BrokerRefused, CairnError

log = logging.getLogger(__name__)

# <linux/fsverity.h>
FS_IOC_ENABLE_VERITY = 0x40806685
FS_IOC_MEASURE_VERITY = 0xC0046686
FS_VERITY_HASH_ALG_SHA256 = 1
_NO_VERITY_SUPPORT = (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL)

Verity = Literal["checked", "unsupported"]


class VerifiedCapsule(BaseModel):
    """A capsule that passed :func:`verify_release` just now."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    hash: str
    path: str
    cairn_version: str
    entry: str
    python_path: str
    fsverity: Verity


def release_key_path() -> Path:
    """/usr/lib/cairn/release-key.pub: the Ed25519 key every capsule must be signed with."""
    return paths.release_dir().parent / "release-key.pub"


def measure_verity(path: Path) -> str | None:
    """The file's fs-verity SHA-256 digest, or None when it has none (or the filesystem
    cannot have one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        buf = bytearray(struct.pack("<HH", 0, 64) + bytes(64))
        try:
            fcntl.ioctl(fd, FS_IOC_MEASURE_VERITY, buf)
        except OSError as exc:
            if exc.errno == errno.ENODATA or exc.errno in _NO_VERITY_SUPPORT:
                return None
            raise
    finally:
        os.close(fd)
    algorithm, size = struct.unpack_from("<HH", buf)
    if algorithm != FS_VERITY_HASH_ALG_SHA256:
        raise capsule.CapsuleInvalid(f"{path} has fs-verity with hash algorithm {algorithm}")
    return bytes(buf[4 : 4 + size]).hex()


def enable_verity(path: Path) -> bool:
    """Turn fs-verity on for one file (SHA-256, 4096-byte blocks). False where the
    filesystem or mount does not support it; True when it is on (also already)."""
    arg = struct.pack(
        "<IIIIQII8s88s", 1, FS_VERITY_HASH_ALG_SHA256, capsule.VERITY_BLOCK, 0, 0, 0, 0, b"", b""
    )
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FS_IOC_ENABLE_VERITY, arg)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            return True
        if exc.errno in (*_NO_VERITY_SUPPORT, errno.EROFS, errno.ETXTBSY):
            return False
        raise
    finally:
        os.close(fd)
    return True


def check_verity(release: Path, manifest: capsule.Manifest) -> Verity:
    """Compare every file's fs-verity digest with the manifest where the file has one.
    A file with a wrong digest is refused; files without verity are covered by the
    SHA-256 check alone."""
    found = 0
    for entry in manifest.files:
        digest = measure_verity(release / entry.path)
        if digest is None:
            continue
        found += 1
        if digest != entry.fsverity:
            raise capsule.CapsuleInvalid(
                f"capsule {release.name}: {entry.path} has the wrong fs-verity digest"
            )
    return "checked" if found == len(manifest.files) else "unsupported"


def verify_release(release: Path, key_path: Path | None = None) -> VerifiedCapsule:
    """Verify one installed capsule; raise :class:`cairn.capsule.CapsuleInvalid`."""
    key_path = key_path or release_key_path()
    try:
        key = capsule.load_public_key(key_path.read_bytes())
    except OSError as exc:
        raise capsule.CapsuleInvalid(
            f"cannot read the release key {key_path}: {exc.strerror}"
        ) from exc
    manifest = capsule.verify(release, key)
    verity = check_verity(release, manifest)
    return VerifiedCapsule(
        hash=release.name,
        path=str(release),
        cairn_version=manifest.cairn_version,
        entry=manifest.entry,
        python_path=manifest.python_path,
        fsverity=verity,
    )


def select_release(wanted: str | None) -> Path:
    """The capsule an agent runs with: the one the launch description recorded while it is
    installed, otherwise the current one (after an upgrade, both are signed releases)."""
    releases = paths.release_dir()
    if wanted is not None and capsule.HASH_RE.fullmatch(wanted) and (releases / wanted).is_dir():
        return releases / wanted
    current = capsule.current_release(releases)
    if current is None:
        raise BrokerRefused(
            f"no sealed release is installed in {releases}",
            hint="reinstall the cairn package",
        )
    if wanted is not None and wanted != current:
        log.warning("capsule %s of the launch is not installed; using %s", wanted, current)
    return releases / current


def verified_capsule(wanted: str | None) -> VerifiedCapsule:
    """Select and verify the capsule for an agent unit; refuse a capsule that fails."""
    release = select_release(wanted)
    try:
        verified = verify_release(release)
    except capsule.CapsuleInvalid as exc:
        raise BrokerRefused(
            f"sealed release refused: {exc.message}",
            hint="reinstall the cairn package; agents start only from a verified capsule",
        ) from exc
    log.info("capsule %s verified (fs-verity %s)", verified.hash, verified.fsverity)
    return verified


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairn.broker.capsule", description=__doc__)
    parser.add_argument("action", choices=["verify", "enable-verity"])
    parser.add_argument("release", nargs="?", type=Path, help="default: the current capsule")
    args = parser.parse_args(argv)
    try:
        release = args.release or select_release(None)
        if args.action == "enable-verity":
            files = capsule.verify(
                release, capsule.load_public_key(release_key_path().read_bytes())
            )
            enabled = [enable_verity(release / f.path) for f in files.files]
            print(f"fs-verity on {sum(enabled)} of {len(enabled)} files of {release.name}")
        verified = verify_release(release)
    except (CairnError, OSError) as exc:
        print(f"cairn.broker.capsule: {exc}", file=sys.stderr)
        return 1
    print(
        f"capsule {verified.hash} verified (cairn {verified.cairn_version}, "
        f"fs-verity {verified.fsverity})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
