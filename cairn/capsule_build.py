"""Building a capsule (``sealed-release/build.py``): each file's entry with its
fs-verity digest, and the manifest's signature. Verifying one is :mod:`cairn.capsule`,
which the root broker loads without this module."""

from __future__ import annotations

import hashlib
import stat
import struct
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cairn.capsule import VERITY_BLOCK, CapsuleFile

_SHA256_SIZE = 32


def fsverity_digest(data: bytes) -> str:
    """The fs-verity file digest (``FS_IOC_MEASURE_VERITY``) of ``data`` for SHA-256,
    4096-byte blocks and no salt, computed in user space."""
    hashes_per_block = VERITY_BLOCK // _SHA256_SIZE
    if data:
        level = b"".join(
            hashlib.sha256(data[i : i + VERITY_BLOCK].ljust(VERITY_BLOCK, b"\0")).digest()
            for i in range(0, len(data), VERITY_BLOCK)
        )
        while len(level) > _SHA256_SIZE:
            level = b"".join(
                hashlib.sha256(level[i : i + VERITY_BLOCK].ljust(VERITY_BLOCK, b"\0")).digest()
                for i in range(0, len(level), hashes_per_block * _SHA256_SIZE)
            )
        root = level
    else:
        root = b"\0" * _SHA256_SIZE
    descriptor = struct.pack(
        "<BBBBIQ64s32s144s",
        1,  # version
        1,  # FS_VERITY_HASH_ALG_SHA256
        VERITY_BLOCK.bit_length() - 1,
        0,  # salt size
        0,
        len(data),
        root,
        b"",
        b"",
    )
    return hashlib.sha256(descriptor).hexdigest()


def describe_file(root: Path, rel: str) -> CapsuleFile:
    path = root / rel
    data = path.read_bytes()
    executable = bool(path.stat().st_mode & stat.S_IXUSR)
    return CapsuleFile(
        path=rel,
        size=len(data),
        mode=0o755 if executable else 0o644,
        sha256=hashlib.sha256(data).hexdigest(),
        fsverity=fsverity_digest(data),
    )


def sign(manifest_bytes: bytes, key: Ed25519PrivateKey) -> bytes:
    return key.sign(manifest_bytes)
