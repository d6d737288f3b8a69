"""A run's settlement at a glance, for ``cairn ps``, ``cairn show`` and ``cairn diff``.

A proposal that was refused in part never reads as a plain success: the label says how
many paths were refused (``applied, 2 refused``), and ``complete`` is true only when every
change of the proposal reached the live project (or there was none). Paths left out as a
profile's tool leftovers (``settle_ignore``) are counted apart (``no changes, 2 ignored``)
and do not make a settlement incomplete.
"""

from __future__ import annotations

from typing import Any

# ``--apply ask``: the proposal waits for the owner as an approval request of this ID,
# recorded against no operation (the settlement is not one).
APPLY_REQUEST_ID = "apply"
SETTLEMENT_OP = "settlement"


def _count(holder: dict[str, Any], key: str) -> int:
    value = holder.get(key)
    return len(value) if isinstance(value, list) else 0


def _paths(n: int) -> str:
    return f"{n} path" if n == 1 else f"{n} paths"


def summary(settlement: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{status, label, complete, accepted, applied, already_applied, refused, ignored,
    conflicts, reverted}`` of a settlement record; None when the run has none (yet)."""
    if not settlement:
        return None
    status = str(settlement.get("status", "not settled"))
    candidate = settlement.get("candidate") or {}
    result = settlement.get("apply") or {}
    refused = _count(candidate, "refused")
    ignored = _count(candidate, "ignored")
    conflicts = _count(result, "conflicts")
    tail = (f", {refused} refused" if refused else "") + (f", {ignored} ignored" if ignored
                                                           else "")
    if status == "applied":
        label = "applied" + tail
    elif status == "refused":
        label = f"none applied{tail}"
    elif status == "conflict":
        label = f"conflict, {_paths(conflicts)}{tail}"
    elif status == "noop":
        label = "no changes" + tail
    elif status == "verification-failed":
        failed = [c for c in (settlement.get("verification") or {}).get("checks", [])
                  if not c.get("passed")]
        name = failed[0].get("name", "?") if failed else "?"
        label = f"check {name} failed, none applied{tail}"
    elif status == "failed":
        label = f"not settled, none applied{tail}"
    elif status == "waiting":
        label = f"waiting for 'cairn apply', {_paths(_count(candidate, 'accepted'))}{tail}"
    elif status == "held":
        label = f"held, {_paths(_count(candidate, 'accepted'))} not applied{tail}"
    else:
        label = status + tail
    revert = settlement.get("revert") or {}
    if revert.get("status") == "conflict":
        label += ", revert refused"
    elif revert:
        label += ", reverted"
    return {
        "status": status,
        "label": label,
        "complete": status in ("applied", "noop") and refused == 0 and conflicts == 0,
        "accepted": _count(candidate, "accepted"),
        "applied": _count(result, "applied"),
        "already_applied": _count(result, "already_applied"),
        "refused": refused,
        "ignored": ignored,
        "conflicts": conflicts,
        "reverted": bool(revert) and revert.get("status") != "conflict",
    }
