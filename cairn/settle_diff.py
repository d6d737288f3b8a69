"""The unified diff ``cairn diff`` shows: Q against the candidate, path by path, bounded.

Runs in the owner's candidate unit. Both trees hold what the agent wrote, so every entry
is read as :mod:`cairn.untrusted` reads and copied into a private directory before
``diff`` sees it: no link followed, nothing that could block opened.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from cairn import untrusted
from cairn.proc import run
from cairn.protocol.settlement import DIFF_LIMIT


def unified_diff(q: Path, f: Path, subpath: str, accepted: list[str]) -> str:
    """A bounded unified diff of the accepted paths, for ``cairn diff``."""
    base_q = q / subpath if subpath else q
    base_f = f / subpath if subpath else f
    chunks: list[str] = []
    size = 0
    for rel in sorted(accepted):
        with tempfile.TemporaryDirectory(prefix="cairn-diff.") as tmp:
            a, b = Path(tmp, "a"), Path(tmp, "b")
            shown = _diff_side(base_q, rel, a) and _diff_side(base_f, rel, b)
            old, new = quoted_path(f"a/{rel}"), quoted_path(f"b/{rel}")
            argv = ["diff", "-uN", "--no-dereference", "--label", old, "--label", new]
            proc = run([*argv, str(a), str(b)], check=False) if shown else None
        text = proc.stdout.decode(errors="replace") if proc is not None else ""
        if proc is None or proc.returncode > 1:
            text = f"--- {old}\n+++ {new}\n(changed; not a text difference)\n"
        chunks.append(text)
        size += len(text)
        if size > DIFF_LIMIT:
            chunks.append(f"(diff truncated at {DIFF_LIMIT} bytes)\n")
            break
    return "".join(chunks)


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


def _diff_side(base: Path, rel: str, dst: Path) -> bool:
    """Put what ``diff`` compares of ``base/rel`` (in F or Q, which hold what the agent
    wrote) at ``dst`` in a private directory, read through :mod:`cairn.untrusted`: a file's
    bytes, a link's target as a link; absent or a directory stays absent. False for
    anything else, a link among the parents, or a file too large to show."""
    try:
        mode = untrusted.lstat(base, rel).st_mode
        if stat.S_ISLNK(mode):
            os.symlink(untrusted.readlink(base, rel), dst)
        elif stat.S_ISREG(mode):
            data = untrusted.read_bytes(base, rel, owner=None, limit=DIFF_LIMIT, single_link=False)
            dst.write_bytes(data)
        elif not stat.S_ISDIR(mode):
            return False
    except untrusted.UntrustedFileMissing:
        pass
    except untrusted.UntrustedFileError:
        return False
    return True
