"""Path policy for proposal settlement (ARCHITECTURE §9): which single entry of a
proposal host policy allows, judged path by path. How refusals spread to the changes that
depend on them is in :mod:`cairn.settle.deps`; building C is :mod:`cairn.settle.candidate`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field

from cairn.errors import ValidationFailed
from cairn.pathrules import ancestors, depth

# A nested subvolume shows, inside a snapshot of the subvolume that holds it, as an empty
# directory with this inode number (BTRFS_EMPTY_SUBVOL_DIR_OBJECTID); in a live subvolume
# its top directory has inode 256 (BTRFS_FIRST_FREE_OBJECTID), which no other entry has.
_SUBVOL_PLACEHOLDER_INO = 2
_SUBVOL_TOP_INO = 256
NESTED_SUBVOLUME = "nested subvolume: its contents are not part of the proposal"


@dataclass(frozen=True, slots=True)
class SettlementPolicy:
    """Host policy for what of a proposal may reach the candidate: the launch
    description's ``SettlementPolicySpec``, as root hands it to the candidate unit."""

    write_paths: list[str] = field(default_factory=lambda: ["**"])
    allow_git_internals: bool = False
    max_file_bytes: int = 64 << 20
    max_total_bytes: int = 1 << 30
    # Globs of what the run's agent tools leave behind (the profiles' settle_ignore): a
    # change there, or below it, is left out of C and reported as ignored, not refused.
    ignore: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: bytes) -> SettlementPolicy:
        """The policy in root's ``policy.json``; ``ValidationFailed`` if it is not one."""
        try:
            policy = cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ValidationFailed(f"policy.json is not a settlement policy: {exc}") from None
        globs = (policy.write_paths, policy.ignore)
        if not (all(isinstance(g, list) and all(isinstance(s, str) for s in g) for g in globs)
                and type(policy.allow_git_internals) is bool
                and all(type(n) is int and n >= 0
                        for n in (policy.max_file_bytes, policy.max_total_bytes))):
            raise ValidationFailed("policy.json is not a settlement policy: a field of the "
                                   "wrong type")
        return policy


def _segment_regex(segment: str) -> str:
    out = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a write-path glob: ``*`` and ``?`` stay inside one component, ``**`` spans
    any number of components (``src/**`` matches ``src`` and everything below it)."""
    parts: list[str] = []
    for part in pattern.strip("/").split("/"):
        if part == "**" and parts and parts[-1] == "**":
            continue
        if part:
            parts.append(part)
    rx = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            if not last:
                rx += "(?:[^/]+/)*"
            elif rx.endswith("/"):
                rx = rx[:-1] + "(?:/.*)?"
            else:
                rx += ".*"
        else:
            rx += _segment_regex(part) + ("" if last else "/")
    return re.compile(rf"\A{rx}\Z", re.DOTALL)


def policy_reason(path: str, policy: SettlementPolicy, patterns: list[re.Pattern[str]]) -> str:
    """Why policy refuses any change at ``path`` whatever the entry is; "" if it does not."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8"
    if not policy.allow_git_internals and ".git" in path.split("/"):
        return ".git internals are excluded"
    if not any(p.match(path) for p in patterns):
        return "outside the write paths"
    return ""


IGNORED = "ignored: a profile's settle_ignore"


def ignored_by(path: str, patterns: list[re.Pattern[str]]) -> bool:
    """Whether ``path`` or a directory above it matches one of the ignore ``patterns``."""
    if not patterns:  # the usual case: no path's ancestors are worked out
        return False
    return any(p.match(at) for at in (path, *ancestors(path)) for p in patterns)


def is_nested_subvolume(st: os.stat_result, parent_dev: int | None = None) -> bool:
    """Whether a directory entry is (the placeholder of) another subvolume."""
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_ino in (_SUBVOL_PLACEHOLDER_INO, _SUBVOL_TOP_INO):
        return True
    return parent_dev is not None and st.st_dev != parent_dev


def symlink_reason(path: str, target: str) -> str:
    """Why a symbolic link at ``path`` (project-relative, its parents real directories)
    pointing at ``target`` may lead outside the project; "" if it cannot.

    The kernel resolves a relative target component by component from the link's
    directory, following every link on the way *before* it applies the next ``..``: with
    ``b -> .``, ``b/../x`` is ``../x``, not the ``x`` that lexical normalization makes of
    it. So a target is judged as the kernel walks it, never normalized: ``..`` may only
    lead (``.`` and empty components aside), and no more of them than the link's own
    directory is deep; after the first name every component descends, through a name that
    is either a real directory or a link judged by this same rule where it stands.
    """
    if target.startswith("/"):
        return "symlink with an absolute target leaves the project"
    climbs = 0
    name = ""
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if name:
                return (
                    f"symlink target climbs through a name ({name + '/..'!r}); "
                    "it may resolve elsewhere"
                )
            climbs += 1
        else:
            name = part
    if climbs > depth(path):
        return "symlink target leaves the project"
    return ""


def entry_reason(path: str, st: os.stat_result, target: str, policy: SettlementPolicy) -> str:
    """Why policy refuses this entry of P at ``path``; "" if it does not."""
    mode = st.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        return "unsupported file type"
    if is_nested_subvolume(st):
        return NESTED_SUBVOLUME
    if mode & (stat.S_ISUID | stat.S_ISGID):
        return "setuid/setgid bit"
    if stat.S_ISLNK(mode):
        reason = symlink_reason(path, target)
        if reason:
            return reason
    if stat.S_ISREG(mode) and st.st_size > policy.max_file_bytes:
        return f"file is larger than {policy.max_file_bytes} bytes"
    # The candidate and apply units run as the owner, who cannot read past these modes:
    # one such entry is refused by name instead of failing the whole settlement.
    needed = stat.S_IRUSR | (stat.S_IXUSR if stat.S_ISDIR(mode) else 0)
    if not stat.S_ISLNK(mode) and st.st_uid == os.geteuid() and mode & needed != needed:
        return f"not readable by its owner (mode {stat.S_IMODE(mode):04o})"
    return ""
