"""How a refusal spreads to the changes that depend on it, so that C never holds half of
a change (ARCHITECTURE §9: settlement is whole per dependency).

The rules, applied until nothing more is refused:

1. Beneath a refused change nothing changes. When the change of a path that exists in P
   (created, replaced or re-moded) is refused, C keeps Q's entry there, so every change
   below it is refused too: files created in a refused directory, and the deletions of
   Q's files under a directory whose replacement (by a symlink, a file, another
   directory) was refused — the live subtree then stays byte-identical.
2. A directory that must keep an entry is neither deleted nor replaced by a
   non-directory: a refused deletion below a deleted directory, or below a directory
   that P replaced by a file or symlink, refuses that deletion or replacement.
3. A rename is one change: if anything on either side is refused (the source's removal
   or anything beneath it, the destination or anything beneath it), the whole rename is
   refused, so it never turns into a copy or a loss.
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.pathrules import ancestors, depth, parent
from cairn.settle.changes import ChangeSet


def close_refusals(
    changes: ChangeSet, refused: dict[str, str], dir_replaced_by_nondir: Iterable[str]
) -> None:
    """Extend ``refused`` (path → reason) with every change that depends on a refused one.

    ``dir_replaced_by_nondir``: paths that are a directory in Q and not one in P.
    """
    present = {*changes.created, *changes.modified, *changes.metadata}
    deleted = set(changes.deleted) - present
    every = sorted(present | deleted, key=lambda s: (depth(s), s))
    must_stay_dir = deleted | (set(dir_replaced_by_nondir) & present)
    sides = _rename_sides(changes, present, deleted, every)

    def refuse(path: str, reason: str) -> bool:
        if path in refused:
            return False
        refused[path] = reason
        return True

    grew = True
    while grew:
        grew = False
        # 1. beneath a refused present path (shallowest first: one pass reaches the leaves)
        for path in every:
            if path in refused:
                continue
            for top in ancestors(path):
                if top in present and top in refused:
                    if path in present:
                        reason = (
                            "parent directory was refused"
                            if top == parent(path)
                            else f"inside {top}, which was refused"
                        )
                    else:
                        reason = f"inside {top}, whose replacement was refused"
                    grew |= refuse(path, reason)
                    break
        # 2. a directory that keeps a refused deletion stays a directory
        holding: set[str] = set()
        for path in refused:
            if path in deleted:
                holding.update(ancestors(path))
        for path in sorted(must_stay_dir & holding):
            grew |= refuse(path, "directory still holds refused paths")
        # 3. renames are whole
        for old, new, old_side, new_side in sides:
            old_refused = any(p in refused for p in old_side)
            new_refused = any(p in refused for p in new_side)
            if not (old_refused or new_refused):
                continue
            for p in old_side:
                grew |= refuse(
                    p,
                    f"its rename destination {new} was refused"
                    if new_refused
                    else f"part of the rename {old} -> {new}, which was refused in part",
                )
            for p in new_side:
                grew |= refuse(
                    p,
                    f"its rename source {old} could not be removed"
                    if old_refused
                    else f"part of the rename {old} -> {new}, which was refused in part",
                )


def _rename_sides(
    changes: ChangeSet, present: set[str], deleted: set[str], every: list[str]
) -> list[tuple[str, str, list[str], list[str]]]:
    """Per rename: the changes that remove the source (its own change and the deletions
    beneath it) and those that make the destination (it and every present path beneath)."""
    olds: dict[str, list[int]] = {}
    news: dict[str, list[int]] = {}
    for i, rn in enumerate(changes.renamed):
        olds.setdefault(rn.old, []).append(i)
        news.setdefault(rn.new, []).append(i)
    old_side: list[list[str]] = [[] for _ in changes.renamed]
    new_side: list[list[str]] = [[] for _ in changes.renamed]
    for path in every:
        for top in (path, *ancestors(path)):
            if path == top or path in deleted:
                for i in olds.get(top, ()):
                    old_side[i].append(path)
            if path in present:
                for i in news.get(top, ()):
                    new_side[i].append(path)
    return [
        (rn.old, rn.new, old_side[i], new_side[i])
        for i, rn in enumerate(changes.renamed)
        if old_side[i] or new_side[i]
    ]
