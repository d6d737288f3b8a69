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
            argv = ["diff", "-uN", "--no-dereference", "--label", f"a/{rel}", "--label"]
            proc = run([*argv, f"b/{rel}", str(a), str(b)], check=False) if shown else None
        text = proc.stdout.decode(errors="replace") if proc is not None else ""
        if proc is None or proc.returncode > 1:
            text = f"--- a/{rel}\n+++ b/{rel}\n(changed; not a text difference)\n"
        chunks.append(text)
        size += len(text)
        if size > DIFF_LIMIT:
            chunks.append(f"(diff truncated at {DIFF_LIMIT} bytes)\n")
            break
    return "".join(chunks)


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
