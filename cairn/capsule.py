"""The sealed release capsule: manifest format, hashing and verification
(ARCHITECTURE §14). Shared by the builder (``sealed-release/build.py``, which signs
through :mod:`cairn.capsule_build`) and the broker.

A capsule is a directory ``releases/<hash>/`` holding the worker runtime, built-in
workflows and profiles, plus two files that are not listed in the manifest:

``manifest.json``  canonical JSON: every file's path, size, mode, SHA-256 and fs-verity
                   digest (SHA-256, 4096-byte blocks, no salt).
``manifest.sig``   the raw Ed25519 signature of ``manifest.json``.

``<hash>`` is the SHA-256 of ``manifest.json``, so the name pins the content and the
signature says who built it. A capsule verifies when its name matches, the signature is
valid under the installed public key, every listed file has its size and SHA-256, and
nothing else is there (no unlisted file, no symlink, nothing writable by group or others).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from cairn.errors import CairnError

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
WORKER_ENTRY = "cairn-worker"
LIB = "lib"
HASH_RE = re.compile(r"^[0-9a-f]{64}$")
PATH_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")

VERITY_BLOCK = 4096


class CapsuleInvalid(CairnError):
    """A capsule that must not be used: tampered, unsigned, incomplete or malformed."""

    code = "capsule-invalid"


def _check_rel_path(path: str) -> str:
    if not PATH_RE.fullmatch(path) or ".." in path.split("/"):
        raise ValueError(f"{path!r} is not a plain relative path inside the capsule")
    if path in (MANIFEST, SIGNATURE):
        raise ValueError(f"{path} cannot list itself")
    return path


RelPath = Annotated[str, AfterValidator(_check_rel_path)]
Hex64 = Annotated[str, Field(pattern=HASH_RE.pattern)]


class CapsuleFile(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    path: RelPath
    size: int = Field(ge=0)
    mode: Literal[0o644, 0o755]
    sha256: Hex64
    fsverity: Hex64


class Manifest(BaseModel):
    """What a capsule holds. Serialised only through :meth:`canonical_bytes`."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    format: Literal[1] = 1
    cairn_version: str = Field(min_length=1, max_length=64)
    entry: RelPath = WORKER_ENTRY
    python_path: RelPath = LIB
    files: list[CapsuleFile]

    def canonical_bytes(self) -> bytes:
        data = self.model_dump(mode="json")
        data["files"] = sorted(data["files"], key=lambda f: f["path"])
        return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()

    def by_path(self) -> dict[str, CapsuleFile]:
        return {f.path: f for f in self.files}


def release_hash(manifest_bytes: bytes) -> str:
    """The capsule's name: the SHA-256 of its manifest."""
    return hashlib.sha256(manifest_bytes).hexdigest()


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    try:
        key = load_pem_public_key(pem)
    except ValueError as exc:
        raise CapsuleInvalid(f"the release public key is not PEM: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise CapsuleInvalid("the release public key is not an Ed25519 key")
    return key


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``root`` (relative path, lstat), never following symlinks."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            rel = (base / name).relative_to(root).as_posix()
            yield rel, os.lstat(base / name)


def verify(release: Path, public_key: Ed25519PublicKey) -> Manifest:
    """Check a capsule completely (name, signature, files, nothing extra); return its
    manifest. Raises :class:`CapsuleInvalid` naming the first problem found."""
    name = release.name
    if not HASH_RE.fullmatch(name):
        raise CapsuleInvalid(f"capsule directory {release} is not named by a SHA-256")
    try:
        manifest_bytes = (release / MANIFEST).read_bytes()
        signature = (release / SIGNATURE).read_bytes()
    except OSError as exc:
        raise CapsuleInvalid(f"capsule {name}: cannot read {exc.filename}: {exc.strerror}") from exc
    if release_hash(manifest_bytes) != name:
        raise CapsuleInvalid(f"capsule {name}: manifest.json does not match the capsule's hash")
    try:
        public_key.verify(signature, manifest_bytes)
    except InvalidSignature as exc:
        raise CapsuleInvalid(
            f"capsule {name}: the manifest signature is not valid under the release key"
        ) from exc
    try:
        manifest = Manifest.model_validate_json(manifest_bytes)
    except ValidationError as exc:
        raise CapsuleInvalid(
            f"capsule {name}: malformed manifest: {exc.errors()[0]['msg']}"
        ) from exc
    if manifest.canonical_bytes() != manifest_bytes:
        raise CapsuleInvalid(f"capsule {name}: manifest.json is not in canonical form")
    listed = manifest.by_path()
    seen: set[str] = set()
    for rel, st in _walk(release):
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            raise CapsuleInvalid(f"capsule {name}: {rel} is not a regular file")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CapsuleInvalid(f"capsule {name}: {rel} is writable by group or others")
        if stat.S_ISDIR(st.st_mode):
            continue
        if rel in (MANIFEST, SIGNATURE):
            continue
        entry = listed.get(rel)
        if entry is None:
            raise CapsuleInvalid(f"capsule {name}: {rel} is not in the manifest")
        _check_file(release / rel, entry, name)
        seen.add(rel)
    missing = sorted(set(listed) - seen)
    if missing:
        raise CapsuleInvalid(f"capsule {name}: {missing[0]} is missing")
    return manifest


def _check_file(path: Path, entry: CapsuleFile, name: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        digest = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise CapsuleInvalid(f"capsule {name}: {entry.path} does not match its SHA-256")


def current_release(releases: Path) -> str | None:
    """The hash the ``current`` link in ``releases`` names, or None without one."""
    try:
        target = os.readlink(releases / "current")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CapsuleInvalid(f"{releases}/current: {exc.strerror}") from exc
    if not HASH_RE.fullmatch(target):
        raise CapsuleInvalid(f"{releases}/current points at {target!r}, not a capsule hash")
    return target
