"""Synthetic projects for the benchmarks: deterministic trees of N files and the edits an
agent would make to them.

A project of N files has nested source directories (up to four levels), mixed file
sizes (most under 1 KiB, a few up to 512 KiB), relative symlinks that stay inside the
project (2 % of the entries), and an ignored build directory (10 % of the entries,
listed in ``.gitignore``). The same seed gives the same tree byte for byte.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

FILES_PER_DIR = 20
SUBDIRS_PER_DIR = 6
MAX_DEPTH = 4
SYMLINK_SHARE = 0.02
BUILD_SHARE = 0.10
BUILD_DIR = "build"

# (share, smallest, largest) in bytes; the mean is about 4.5 KiB.
SIZE_CLASSES = ((0.70, 64, 1 << 10), (0.25, 1 << 10, 8 << 10), (0.045, 8 << 10, 64 << 10),
                (0.005, 64 << 10, 512 << 10))
_WORDS = (
    b"def class return import self value result state journal snapshot tree branch "
    b"merge apply commit lease token fence agent worker unit scope index handle buffer "
    b"parse render update insert delete select where order limit offset count total "
)


@dataclass
class Project:
    """What :func:`build_project` made: the source files (not the build dir), the
    symlinks, and the byte count."""

    root: Path
    files: list[str] = field(default_factory=list)
    build_files: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    total_bytes: int = 0

    @property
    def entry_count(self) -> int:
        """Regular files plus symlinks, build directory included."""
        return len(self.files) + len(self.build_files) + len(self.symlinks) + 1  # .gitignore


def _text_pool(rng: random.Random, size: int) -> bytes:
    words = _WORDS.split()
    out = bytearray()
    while len(out) < size:
        line = b" ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        out += b"    " * rng.randint(0, 3) + line + b"\n"
    return bytes(out[:size])


class ContentSource:
    """Text-like file contents cut from a shared pool at random offsets (cheap to make,
    and compressible the way source code is)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pool = _text_pool(rng, 2 << 20)

    def size(self) -> int:
        roll = self.rng.random()
        for share, low, high in SIZE_CLASSES:
            if roll < share:
                return self.rng.randint(low, high)
            roll -= share
        return SIZE_CLASSES[-1][2]

    def content(self, size: int, salt: str = "") -> bytes:
        start = self.rng.randrange(0, len(self.pool) - size) if size < len(self.pool) else 0
        head = f"# {salt}\n".encode() if salt else b""
        return (head + self.pool[start:start + size])[:max(size, len(head))]


def _directories(rng: random.Random, count: int, top: str) -> list[str]:
    """``count`` nested directory paths under ``top`` (breadth-first, up to MAX_DEPTH)."""
    dirs = [top]
    frontier = [top]
    while len(dirs) < count:
        next_frontier: list[str] = []
        for parent in frontier:
            depth = parent.count("/") + 1
            if depth >= MAX_DEPTH:
                continue
            for i in range(rng.randint(2, SUBDIRS_PER_DIR)):
                child = f"{parent}/{rng.choice(('pkg', 'mod', 'lib', 'src', 'part'))}{i}"
                dirs.append(child)
                next_frontier.append(child)
                if len(dirs) >= count:
                    return dirs
        if not next_frontier:  # every branch is at MAX_DEPTH: widen the top level
            frontier = [f"{top}/extra{len(dirs)}"]
            dirs.append(frontier[0])
            continue
        frontier = next_frontier
    return dirs


def build_project(root: Path, n_files: int, *, seed: int = 8) -> Project:
    """Write a synthetic project of ``n_files`` entries into the empty directory ``root``."""
    rng = random.Random(seed)
    src = ContentSource(rng)
    project = Project(root=root)
    n_build = int(n_files * BUILD_SHARE)
    n_links = max(1, int(n_files * SYMLINK_SHARE))
    n_source = n_files - n_build - n_links - 1
    (root / ".gitignore").write_bytes(f"/{BUILD_DIR}/\n".encode())

    for top, count, bucket in (("src", n_source, project.files),
                               (BUILD_DIR, n_build, project.build_files)):
        if count <= 0:
            continue
        dirs = _directories(rng, max(1, count // FILES_PER_DIR), top)
        for d in dirs:
            (root / d).mkdir(parents=True, exist_ok=True)
        project.directories.extend(dirs)
        for i in range(count):
            rel = f"{dirs[i % len(dirs)]}/f{i}.{rng.choice(('py', 'txt', 'json', 'c', 'md'))}"
            data = src.content(src.size())
            with open(root / rel, "wb") as fh:
                fh.write(data)
            project.total_bytes += len(data)
            bucket.append(rel)

    for i in range(n_links):
        target = rng.choice(project.files)
        rel = f"{project.directories[i % len(project.directories)]}/link{i}"
        if rel.startswith(BUILD_DIR):
            rel = f"src/link{i}"
        os.symlink(os.path.relpath(target, os.path.dirname(rel) or "."), root / rel)
        project.symlinks.append(rel)
    return project


@dataclass
class Edit:
    """One round of agent edits: which paths it modified, created and deleted."""

    modified: list[str]
    created: list[str]
    deleted: list[str]

    @property
    def count(self) -> int:
        return len(self.modified) + len(self.created) + len(self.deleted)


class Editor:
    """Makes agent-like edits to a tree: 70 % modifications, 20 % new files (some in new
    directories), 10 % deletions. Tracks the live file list so later rounds stay valid."""

    def __init__(self, project: Project, seed: int = 80) -> None:
        self.rng = random.Random(seed)
        self.content = ContentSource(self.rng)
        self.files = list(project.files)
        self.directories = [d for d in project.directories if not d.startswith(BUILD_DIR)]
        self.serial = 0

    def edit(self, root: Path, changes: int) -> Edit:
        """Apply ``changes`` edits to the tree at ``root`` (same layout as the project)."""
        n_created = max(1, changes // 5) if changes >= 3 else 0
        n_deleted = max(1, changes // 10) if changes >= 3 else 0
        n_modified = changes - n_created - n_deleted
        picks = self.rng.sample(range(len(self.files)), n_modified + n_deleted)
        modified = [self.files[i] for i in picks[:n_modified]]
        deleted_idx = set(picks[n_modified:])
        deleted = [self.files[i] for i in sorted(deleted_idx)]
        for rel in modified:
            self.serial += 1
            with open(root / rel, "ab") as fh:
                fh.write(self.content.content(self.rng.randint(16, 512), f"edit {self.serial}"))
        for rel in deleted:
            os.unlink(root / rel)
        self.files = [f for i, f in enumerate(self.files) if i not in deleted_idx]
        created: list[str] = []
        for i in range(n_created):
            self.serial += 1
            parent = self.rng.choice(self.directories)
            if i % 4 == 3:
                parent = f"{parent}/new{self.serial}"
                (root / parent).mkdir()
                self.directories.append(parent)
            rel = f"{parent}/added{self.serial}.py"
            with open(root / rel, "wb") as fh:
                fh.write(self.content.content(self.content.size(), f"new {self.serial}"))
            created.append(rel)
        self.files.extend(created)
        return Edit(modified=modified, created=created, deleted=deleted)
