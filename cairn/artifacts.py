"""Artifacts: the files an agent leaves in ``/outputs/artifacts/`` to publish.

The coordinator collects them at the agent's boundary, after QUIESCE (no process of the
agent runs any more), into ``boundaries/<op>/artifacts/`` of the run's state: the
boundary records each one's name, size and SHA-256, later agents of the run find them
read-only under ``/evidence/incoming/<op>/artifacts/``, and ``cairn artifacts`` lists and
saves them.

Everything below ``/outputs`` is the agent's (ARCHITECTURE §8), so the walk trusts none
of it: each directory and file is opened beneath its parent without following a link and
without blocking, checked with ``fstat`` for its type and owner, and read to a bound.
Only regular files and directories of the run owner are taken; a link, a FIFO, a socket,
a device, a name that is not printable UTF-8, a file past the size or count limits is
left behind and named in the boundary with the reason, never read. The bounds keep what
one boundary stores small beside the project.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cairn import untrusted
from cairn.fsutil import mkdirs_public
from cairn.pathrules import printable_name
from cairn.protocol.agent import Artifact, ArtifactRefused, Artifacts
from cairn.protocol.names import ARTIFACT_PATH_MAX
from cairn.terminal import printable

ARTIFACTS = "artifacts"
"""The directory below ``/outputs`` (and below a boundary) that holds them."""
MAX_FILES = 100
MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 64 << 20
MAX_ENTRIES = 1000  # directory entries looked at, files or not: a bound on the walk itself
MAX_DEPTH = 8
MAX_REFUSALS = 20  # named in the boundary; more are counted
_CHUNK = 1 << 20


@dataclass
class _Walk:
    owner: int
    dest: Path
    files: list[Artifact] = field(default_factory=list)
    refused: list[ArtifactRefused] = field(default_factory=list)
    refused_total: int = 0
    entries: int = 0
    total: int = 0

    def refuse(self, name: str, reason: str) -> None:
        self.refused_total += 1
        if len(self.refused) < MAX_REFUSALS:
            self.refused.append(ArtifactRefused(name=printable(printable_name(name)),
                                                reason=reason))


def collect(outputs: Path, *, owner: int, dest: Path) -> Artifacts:
    """Copy the artifacts below ``outputs/artifacts`` into ``dest`` (made when there is a
    file to copy; names kept, files 0444, directories 0755) and
    say what was taken and what was left. ``outputs`` is a directory the caller made;
    nothing below it is trusted. No ``artifacts`` directory is no artifacts. What ``dest``
    held before is replaced."""
    walk = _Walk(owner=owner, dest=dest)
    if dest.exists():  # what an earlier try of this boundary left (our own files)
        shutil.rmtree(dest)
    try:
        fd = untrusted.open_dir(outputs, ARTIFACTS, owner=owner)
    except untrusted.UntrustedFileMissing:
        return Artifacts()
    except untrusted.UntrustedFileError as exc:
        walk.refuse(ARTIFACTS, exc.reason)
    else:
        try:
            _walk_dir(walk, fd, "")
        finally:
            os.close(fd)
    return Artifacts(files=walk.files, refused=walk.refused, refused_total=walk.refused_total)


def _walk_dir(walk: _Walk, dir_fd: int, prefix: str) -> None:
    names, more = untrusted.list_names(dir_fd, limit=MAX_ENTRIES - walk.entries)
    walk.entries += len(names)
    if more:
        walk.refuse(prefix or ".", f"more than {MAX_ENTRIES} entries; the rest were not "
                                   "looked at")
    for name in sorted(names):
        rel = f"{prefix}{name}"
        reason = _bad_name(rel)
        if reason:
            walk.refuse(rel, reason)
            continue
        try:
            st = untrusted.lstat(dir_fd, name)
        except untrusted.UntrustedFileError as exc:  # gone or renamed since it was listed
            walk.refuse(rel, exc.reason)
            continue
        if stat.S_ISDIR(st.st_mode):
            _walk_subdir(walk, dir_fd, name, rel)
        elif stat.S_ISREG(st.st_mode):
            _take_file(walk, dir_fd, name, rel)
        else:
            walk.refuse(rel, f"{untrusted.kind_of(st.st_mode)}, not a regular file")


def _walk_subdir(walk: _Walk, dir_fd: int, name: str, rel: str) -> None:
    if rel.count("/") + 1 >= MAX_DEPTH:
        walk.refuse(rel, f"deeper than {MAX_DEPTH} directories")
        return
    try:
        child = untrusted.open_dir(dir_fd, name, owner=walk.owner)
    except untrusted.UntrustedFileError as exc:  # swapped for a link or a file, another's
        walk.refuse(rel, exc.reason)
        return
    try:
        _walk_dir(walk, child, rel + "/")
    finally:
        os.close(child)


def _bad_name(rel: str) -> str:
    if len(rel) > ARTIFACT_PATH_MAX:
        return f"a path longer than {ARTIFACT_PATH_MAX} characters"
    if printable_name(rel) != rel:
        return "a name that is not UTF-8"
    if not rel.isprintable():
        return "a name with a control character"
    return ""


def _take_file(walk: _Walk, dir_fd: int, name: str, rel: str) -> None:
    if len(walk.files) >= MAX_FILES:
        walk.refuse(rel, f"more than {MAX_FILES} files")
        return
    left = MAX_TOTAL_BYTES - walk.total
    limit = min(MAX_FILE_BYTES, left)
    try:  # hard links are the owner's own files: legitimate, and read only through us
        fd = untrusted.open_file(dir_fd, name, owner=walk.owner, limit=limit,
                                 single_link=False)
    except untrusted.UntrustedFileError as exc:
        reason = exc.reason
        if reason.startswith("larger than"):
            reason = (f"larger than {MAX_FILE_BYTES} bytes" if limit == MAX_FILE_BYTES
                      else f"past the {MAX_TOTAL_BYTES} bytes all artifacts may take")
        walk.refuse(rel, reason)
        return
    target = walk.dest / rel
    try:
        mkdirs_public(target.parent)
        digest, size = _copy(fd, target, limit)
    finally:
        os.close(fd)
    if size > limit:  # it grew while read
        target.unlink()
        walk.refuse(rel, f"larger than {limit} bytes")
        return
    walk.total += size
    walk.files.append(Artifact(name=rel, size=size, sha256=digest))


def _copy(src: int, target: Path, limit: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o444)
    try:
        while size <= limit:
            chunk = os.read(src, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
        os.fsync(out)
    finally:
        os.close(out)
    return digest.hexdigest(), size
