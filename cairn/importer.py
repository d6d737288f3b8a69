"""Import a project into an empty staging subvolume (``runs/<run>/Q.import``).

Runs as the project's owner, so it captures exactly what the owner can read: entries it
cannot read are reported and left out (never copied as empty). Preserves modes,
symlinks (never followed), xattrs, mtimes, empty directories and hard links; reflinks
file data when source and destination share a Btrfs filesystem. Sockets, devices and
fifos are skipped and reported.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cairn.errors import CairnError, UsageError
from cairn.fsutil import copy_file_data
from cairn.pathrules import printable_name
from cairn.progress import WRITE_INTERVAL, Clock, ProgressWriter, Throttle

log = logging.getLogger(__name__)

MAX_LISTED = 1000
# The listed entries' JSON at most: the broker records the stats file as it is and refuses
# one over 1 MiB (STATS_LIMIT, broker/units.py).
MAX_LISTED_BYTES = 256 << 10


# Dataclasses, not pydantic (the import unit starts from this module); cairnd and the
# coordinator read the statistics as cairn.protocol.importstats.ImportStats
# (/usr/share/doc/cairn/docs/decisions/helpers-without-pydantic.md).
@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    reason: str


@dataclass(slots=True)
class Stats:
    """Counts of what was copied and what was not. ``skipped`` lists at most
    ``MAX_LISTED`` entries of at most ``MAX_LISTED_BYTES`` together; ``skipped_count``
    counts them all."""

    files: int = 0
    directories: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    bytes: int = 0
    skipped_special: int = 0
    unreadable: int = 0
    xattrs_not_copied: int = 0
    skipped_count: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    _listed_bytes: int = field(default=0, repr=False)

    def skip(self, path: str, reason: str) -> None:
        self.skipped_count += 1
        size = len(json.dumps([path, reason])) + 32  # escaped, with the entry's keys
        if len(self.skipped) < MAX_LISTED and self._listed_bytes + size <= MAX_LISTED_BYTES:
            self._listed_bytes += size
            self.skipped.append(Skipped(printable_name(path), reason))

    def as_json(self) -> str:
        data = asdict(self)
        del data["_listed_bytes"]
        return json.dumps(data)


@dataclass(frozen=True, slots=True)
class Progress:
    """Entries and bytes copied, of the totals counted first (a ``ProgressReport``)."""

    done: int
    total: int
    bytes_done: int
    bytes_total: int


def _copy_xattrs(src: Path, dst: Path, rel: str, stats: Stats) -> None:
    try:
        names = os.listxattr(src, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM, errno.EACCES):
            return
        raise
    for name in names:
        try:
            value = os.getxattr(src, name, follow_symlinks=False)
            os.setxattr(dst, name, value, follow_symlinks=False)
        except OSError as exc:
            stats.xattrs_not_copied += 1
            stats.skip(rel, f"xattr {name} not copied: {exc.strerror}")


def _finish_entry(src_st: os.stat_result, dst: Path) -> None:
    """Owner (only when root), mode and times, in the order that keeps all of them."""
    is_link = stat.S_ISLNK(src_st.st_mode)
    if os.geteuid() == 0:
        os.lchown(dst, src_st.st_uid, src_st.st_gid)
    if not is_link:
        os.chmod(dst, stat.S_IMODE(src_st.st_mode))
    os.utime(dst, ns=(src_st.st_atime_ns, src_st.st_mtime_ns), follow_symlinks=False)


def count_tree(src: Path) -> tuple[int, int]:
    """Entries below ``src`` and bytes of its regular files (a hard-linked file once):
    the totals progress is reported against. Unreadable directories count as one entry."""
    entries = nbytes = 0
    seen: set[tuple[int, int]] = set()
    stack = [src]
    while stack:
        try:
            listing = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in listing:
            entries += 1
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
            elif stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                if st.st_nlink > 1:
                    seen.add((st.st_dev, st.st_ino))
                nbytes += st.st_size
    return entries, nbytes


def copy_tree(
    src: Path,
    dst: Path,
    *,
    progress: Callable[[Progress], None] | None = None,
    interval: float = WRITE_INTERVAL,
    clock: Clock = time.monotonic,
) -> Stats:
    """Copy the tree at ``src`` into the existing empty directory ``dst``.

    With ``progress``, the totals are counted first; then ``progress(report)`` is called
    with entries and bytes done of those totals at most every ``interval`` seconds of
    ``clock`` (checked after every entry), and once at the end.
    """
    src = src.resolve(strict=True)
    dst = dst.resolve(strict=True)
    if not src.is_dir():
        raise UsageError(f"{src} is not a directory")
    if any(dst.iterdir()):
        raise UsageError(f"import destination {dst} is not empty")
    if dst == src or dst.is_relative_to(src) or src.is_relative_to(dst):
        raise UsageError("import source and destination overlap")

    stats = Stats()
    links: dict[tuple[int, int], Path] = {}
    done = 0
    total, bytes_total = count_tree(src) if progress is not None else (0, 0)
    throttle = Throttle(interval, clock)
    throttle.ready()  # the first report comes after one interval, not at entry one

    def report() -> Progress:
        return Progress(done=done, total=max(total, done), bytes_done=stats.bytes,
                        bytes_total=max(bytes_total, stats.bytes))
    # Directories get their modes and times after their contents (a read-only directory
    # could not be filled, and filling one moves its mtime), deepest first.
    finish: list[tuple[os.stat_result, Path]] = []
    stack: list[tuple[Path, Path, str]] = [(src, dst, "")]

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None and throttle.ready():
            progress(report())

    root_st = os.lstat(src)
    finish.append((root_st, dst))
    _copy_xattrs(src, dst, ".", stats)
    while stack:
        sdir, ddir, rel = stack.pop()
        try:
            entries = sorted(os.scandir(sdir), key=lambda e: e.name)
        except PermissionError:
            stats.unreadable += 1
            stats.skip(rel or ".", "directory not readable")
            continue
        for entry in entries:
            erel = f"{rel}/{entry.name}" if rel else entry.name
            spath, dpath = Path(entry.path), ddir / entry.name
            st = entry.stat(follow_symlinks=False)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                if not os.access(spath, os.R_OK | os.X_OK, follow_symlinks=False):
                    stats.unreadable += 1
                    stats.skip(erel, "directory not readable")
                    tick()
                    continue
                os.mkdir(dpath, 0o700)
                _copy_xattrs(spath, dpath, erel, stats)
                finish.append((st, dpath))
                stack.append((spath, dpath, erel))
                stats.directories += 1
            elif stat.S_ISLNK(mode):
                os.symlink(os.readlink(spath), dpath)
                _finish_entry(st, dpath)
                stats.symlinks += 1
            elif stat.S_ISREG(mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in links:
                    os.link(links[key], dpath)
                    stats.hardlinks += 1
                    tick()
                    continue
                try:
                    sfd = os.open(spath, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except PermissionError:
                    stats.unreadable += 1
                    stats.skip(erel, "file not readable")
                    tick()
                    continue
                try:
                    dfd = os.open(dpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                    try:
                        stats.bytes += copy_file_data(sfd, dfd)
                    finally:
                        os.close(dfd)
                finally:
                    os.close(sfd)
                _copy_xattrs(spath, dpath, erel, stats)
                _finish_entry(st, dpath)
                if st.st_nlink > 1:
                    links[key] = dpath
                stats.files += 1
            else:
                stats.skipped_special += 1
                stats.skip(erel, "socket, device or fifo not imported")
            tick()
    for st, path in reversed(finish):
        _finish_entry(st, path)
    if progress is not None:
        progress(report())
    return stats


def main(argv: list[str] | None = None) -> int:
    """``python3 -I -m cairn.importer SRC DST``: progress on stderr (and in
    ``--progress DIR``), stats JSON on stdout."""
    parser = argparse.ArgumentParser(prog="cairn.importer", description=__doc__)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--stats", type=Path, help="also write the stats JSON to this file")
    parser.add_argument("--progress", type=Path, help="keep DIR/progress.json current")
    args = parser.parse_args(argv)
    writer = ProgressWriter(args.progress, interval=0) if args.progress else None

    def report(progress: Progress) -> None:
        print(
            f"imported {progress.done}/{progress.total} entries, "
            f"{progress.bytes_done}/{progress.bytes_total} bytes",
            file=sys.stderr,
            flush=True,
        )
        if writer is not None:
            writer.report(progress.done, progress.total, bytes_done=progress.bytes_done,
                          bytes_total=progress.bytes_total)

    try:
        stats = copy_tree(args.src, args.dst, progress=report)
    except CairnError as exc:
        print(f"cairn.importer: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cairn.importer: {exc}", file=sys.stderr)
        return 1
    print(stats.as_json())
    if args.stats is not None:
        args.stats.write_text(stats.as_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
