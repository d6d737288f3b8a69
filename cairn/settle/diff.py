"""The patch ``cairn diff`` shows: Q against the candidate, path by path, as git writes one.

Runs in the owner's candidate unit, in-process. Both trees hold what the agent wrote, so
every entry is read as :mod:`cairn.untrusted` reads: no link followed, nothing that could
block opened, no side read past :data:`TEXT_LIMIT`. Every change is shown as git shows it:
a new or deleted file (empty ones too) with its mode, a mode-only change, a symbolic link
as its target, a type change as a deletion and a creation; a binary side, or one larger
than :data:`TEXT_LIMIT`, as ``Binary files … differ`` (git does the same past
``core.bigFileThreshold``). A directory is not a change of its own, as in git. The time
is linear in the bytes read: new and deleted files need no matching, a changed file's
common head and tail are trimmed and the middle is matched by Myers' O((N+M)D)
algorithm (git's) up to :data:`MAX_EDITS` edits and :data:`MATCH_BUDGET` steps; a middle
that needs more is shown as one replacement hunk (still a correct patch).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cairn import untrusted
from cairn.protocol.limits import DIFF_LIMIT

TEXT_LIMIT = DIFF_LIMIT // 2  # one path's patch stays below DIFF_LIMIT plus its headers
MATCH_BUDGET = 1_000_000  # (lines of a changed middle) x (edits) one file may cost
MAX_EDITS = 1000  # and at most this many edits: a cost linear in the lines read
CONTEXT = 3
BINARY_PROBE = 8000  # git's: a NUL among the first 8000 bytes makes a side binary
NOT_TEXT = "(changed; not a text difference)"
LINK_MODE = 0o120000

Opcode = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class Side:
    """One side of a path: ``kind`` is absent, file, link or other (a FIFO, a device, or
    an entry that could not be read safely); ``data`` is a file's bytes or a link's
    target, None when larger than :data:`TEXT_LIMIT`."""

    kind: str
    mode: int = 0
    data: bytes | None = b""
    size: int = 0


ABSENT = Side("absent")


def unified_diff(q: Path, f: Path, subpath: str, accepted: list[str]) -> str:
    """The patch of the accepted paths for ``cairn diff``, at most about
    :data:`DIFF_LIMIT` bytes: whole paths while they fit, then the start of the next one
    (cut at a line) and a line saying how many paths were left out."""
    base_q = q / subpath if subpath else q
    base_f = f / subpath if subpath else f
    paths = sorted(accepted)
    chunks: list[str] = []
    size = 0
    for shown, rel in enumerate(paths):
        text = path_diff(rel, _diff_side(base_q, rel), _diff_side(base_f, rel))
        if size + len(text) > DIFF_LIMIT:
            cut = text[: DIFF_LIMIT - size]
            chunks.append(cut[: cut.rfind("\n") + 1])
            left = len(paths) - shown
            chunks.append(f"(diff truncated at {DIFF_LIMIT} bytes; {left} path(s) not shown "
                          "in full)\n")
            break
        chunks.append(text)
        size += len(text)
    return "".join(chunks)


def path_diff(rel: str, old: Side, new: Side) -> str:
    """git's patch of one path from ``old`` to ``new`` ("" when nothing git shows
    differs)."""
    a, b = quoted_path(f"a/{rel}"), quoted_path(f"b/{rel}")
    header = f"diff --git {a} {b}\n"
    if old.kind == "other" or new.kind == "other":
        return f"{header}--- {a}\n+++ {b}\n{NOT_TEXT}\n"
    if old.kind != new.kind and "absent" not in (old.kind, new.kind):
        return path_diff(rel, old, ABSENT) + path_diff(rel, ABSENT, new)  # a type change
    if old.kind == "absent" and new.kind == "absent":
        return ""
    if old.kind == "absent":
        return header + f"new file mode {new.mode:06o}\n" + _content(old, new, "/dev/null", b)
    if new.kind == "absent":
        return header + f"deleted file mode {old.mode:06o}\n" + _content(old, new, a, "/dev/null")
    modes = f"old mode {old.mode:06o}\nnew mode {new.mode:06o}\n" if old.mode != new.mode else ""
    if old.size == new.size and old.data is not None and old.data == new.data:
        return header + modes if modes else ""
    return header + modes + _content(old, new, a, b)


def _content(old: Side, new: Side, a: str, b: str) -> str:
    """The ``---``/``+++`` lines and hunks (or git's binary line) after the header."""
    if old.data is None or new.data is None or _binary(old.data) or _binary(new.data):
        return f"Binary files {a} and {b} differ\n"
    if not old.data and not new.data:
        return ""
    lines_a, lines_b = _lines(old.data), _lines(new.data)
    body = b"".join(_hunks(lines_a, lines_b))
    return f"--- {a}\n+++ {b}\n" + body.decode("utf-8", errors="replace")


def _binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_PROBE]


def _lines(data: bytes) -> list[bytes]:
    """``data`` split after each newline only (never at a CR or form feed)."""
    parts = data.split(b"\n")
    tail = parts.pop()
    lines = [part + b"\n" for part in parts]
    if tail:
        lines.append(tail)
    return lines


def _hunks(a: list[bytes], b: list[bytes]) -> Iterator[bytes]:
    for group in _grouped(_opcodes(a, b)):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        yield f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n".encode()
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                yield from (_line(b" ", line) for line in a[a1:a2])
                continue
            yield from (_line(b"-", line) for line in a[a1:a2])
            yield from (_line(b"+", line) for line in b[b1:b2])


def _line(mark: bytes, line: bytes) -> bytes:
    if line.endswith(b"\n"):
        return mark + line
    return mark + line + b"\n\\ No newline at end of file\n"


def _range(start: int, stop: int) -> str:
    """A hunk's range as diff and git write it (``-0,0`` when empty, no count for 1)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _opcodes(a: list[bytes], b: list[bytes]) -> list[Opcode]:
    """How ``a`` becomes ``b``: the common head and tail trimmed in linear time, the
    middle matched within the budget, else replaced whole."""
    head = 0
    limit = min(len(a), len(b))
    while head < limit and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < limit - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    mid_a, mid_b = a[head : len(a) - tail], b[head : len(b) - tail]
    codes: list[Opcode] = [("equal", 0, head, 0, head)] if head else []
    max_d = min(MAX_EDITS, MATCH_BUDGET // max(1, len(mid_a) + len(mid_b)))
    middle = _myers(mid_a, mid_b, max_d)
    if middle is None:
        middle = [("replace", 0, len(mid_a), 0, len(mid_b))]
    codes += [(t, i1 + head, i2 + head, j1 + head, j2 + head) for t, i1, i2, j1, j2 in middle]
    if tail:
        codes.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
    return codes


def _myers(a: list[bytes], b: list[bytes], max_d: int) -> list[Opcode] | None:
    """A shortest edit script of ``a`` into ``b`` as opcodes (changes merged into one
    "replace" between equal runs), or None when it needs more than ``max_d`` edits."""
    n, m = len(a), len(b)
    max_d = min(max_d, n + m)
    v = {1: 0}
    trace: list[dict[int, int]] = []
    for d in range(max_d + 1):
        trace.append(v.copy())
        for k in range(-d, d + 1, 2):
            down = k == -d or (k != d and v[k - 1] < v[k + 1])
            x = v[k + 1] if down else v[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            v[k] = x
            if x >= n and y >= m:
                return _script(trace, n, m)
    return None


def _script(trace: list[dict[int, int]], n: int, m: int) -> list[Opcode]:
    """Walk Myers' trace back from (n, m): the equal runs, and a change between two."""
    runs: list[tuple[int, int, int]] = []  # (x, y, length) of each equal run, last first
    x, y = n, m
    for d in range(len(trace) - 1, 0, -1):
        v, k = trace[d], x - y
        prev_k = k + 1 if k == -d or (k != d and v[k - 1] < v[k + 1]) else k - 1
        prev_x = v[prev_k]
        moved_x = prev_x + (prev_k == k - 1)  # one deletion; an insertion keeps x
        if x > moved_x:
            runs.append((moved_x, moved_x - k, x - moved_x))
        x, y = prev_x, prev_x - prev_k
    if x:
        runs.append((0, 0, x))
    codes: list[Opcode] = []
    i = j = 0
    for ex, ey, length in reversed(runs):
        if ex > i or ey > j:
            codes.append(("replace", i, ex, j, ey))
        codes.append(("equal", ex, ex + length, ey, ey + length))
        i, j = ex + length, ey + length
    if i < n or j < m:
        codes.append(("replace", i, n, j, m))
    return codes


def _grouped(codes: list[Opcode]) -> Iterator[list[Opcode]]:
    """The changes with :data:`CONTEXT` lines around each, as hunks (difflib's
    grouping, over opcodes that may come from more than one matcher)."""
    if codes and codes[0][0] == "equal":
        t, i1, i2, j1, j2 = codes[0]
        codes[0] = t, max(i1, i2 - CONTEXT), i2, max(j1, j2 - CONTEXT), j2
    if codes and codes[-1][0] == "equal":
        t, i1, i2, j1, j2 = codes[-1]
        codes[-1] = t, i1, min(i2, i1 + CONTEXT), j1, min(j2, j1 + CONTEXT)
    group: list[Opcode] = []
    for t, i1, i2, j1, j2 in codes:
        start_i, start_j = i1, j1
        if t == "equal" and i2 - i1 > 2 * CONTEXT:
            group.append((t, i1, i1 + CONTEXT, j1, j1 + CONTEXT))
            yield group
            group = []
            start_i, start_j = max(i1, i2 - CONTEXT), max(j1, j2 - CONTEXT)
        group.append((t, start_i, i2, start_j, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


# How git writes a name with these in a patch (and 'git apply' reads it back).
_GIT_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r",
                ord('"'): '\\"', ord("\\"): "\\\\"}


def _raw_byte(code: int) -> bool:
    return code < 0x20 or 0x7F <= code < 0xA0 or 0xDC80 <= code < 0xDD00


def quoted_path(name: str) -> str:
    """``name`` as a patch's ``---``/``+++`` label, the way git quotes one: as it is unless
    it holds a control character (C0, DEL, C1), an undecodable byte, a double quote or a
    backslash; then in double quotes with those escaped (``\\n``, ``\\033``; a C1 control as
    its UTF-8 bytes in octal). A newline in an agent's file name never splits the label,
    and no control character reaches a terminal or ``git apply`` raw."""
    if not any(_raw_byte(ord(c)) or c in '"\\' for c in name):
        return name
    out = []
    for char in name:
        code = ord(char)
        if code in _GIT_ESCAPES:
            out.append(_GIT_ESCAPES[code])
        elif _raw_byte(code):  # an undecodable byte of the name is what surrogateescape kept
            out.extend(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogateescape"))
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _diff_side(base: Path, rel: str) -> Side:
    """What the patch compares of ``base/rel`` (in F or Q, which hold what the agent
    wrote), read through :mod:`cairn.untrusted`: a file's mode and bytes, a link's target;
    absent or a directory is absent; anything else, a link among the parents, or a file
    that changes while read, is "other". A file larger than :data:`TEXT_LIMIT` is not
    read."""
    try:
        st = untrusted.lstat(base, rel)
        if stat.S_ISLNK(st.st_mode):
            target = untrusted.readlink(base, rel).encode("utf-8", "surrogateescape")
            return Side("link", LINK_MODE, target, len(target))
        if stat.S_ISDIR(st.st_mode):
            return ABSENT
        if not stat.S_ISREG(st.st_mode):
            return Side("other")
        mode = stat.S_IFREG | stat.S_IMODE(st.st_mode)
        if st.st_size > TEXT_LIMIT:
            return Side("file", mode, None, st.st_size)
        data = untrusted.read_bytes(base, rel, owner=None, limit=TEXT_LIMIT, single_link=False)
        return Side("file", mode, data, len(data))
    except untrusted.UntrustedFileMissing:
        return ABSENT
    except untrusted.UntrustedFileError:
        return Side("other")
