"""A run's settlement at a glance, for ``cairn ps``, ``cairn show`` and ``cairn diff``.

A proposal that was refused in part never reads as a plain success: the label says how
many paths were refused (``applied, 2 refused``), and ``complete`` is true only when every
change of the proposal reached the live project (or there was none). Paths left out as a
profile's tool leftovers (``settle_ignore``) are counted apart (``no changes, 2 ignored``)
and do not make a settlement incomplete.
"""

from __future__ import annotations

from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.settlement_record import SETTLED_WITHOUT_CONFLICT, SettlementRecord

# ``--apply ask``: the proposal waits for the owner as an approval request of this ID,
# recorded against no operation (the settlement is not one).
APPLY_REQUEST_ID = "apply"
SETTLEMENT_OP = "settlement"


def _paths(n: int) -> str:
    return f"{n} path" if n == 1 else f"{n} paths"


def summary(settlement: SettlementRecord | None) -> JSONObject | None:
    """``{status, label, complete, accepted, applied, already_applied, refused, ignored,
    conflicts, reverted}`` of a settlement record; None when the run has none (yet)."""
    if settlement is None:
        return None
    status = settlement.status
    accepted = len(settlement.candidate_list("accepted"))
    refused = len(settlement.candidate_list("refused"))
    ignored = len(settlement.candidate_list("ignored"))
    conflicts = len(settlement.apply.conflicts)
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
        failed = settlement.verification.first_failed() if settlement.verification else None
        label = f"check {(failed or {}).get('name', '?')} failed, none applied{tail}"
    elif status == "failed":
        label = f"not settled, none applied{tail}"
    elif status == "waiting":
        label = f"waiting for 'cairn apply', {_paths(accepted)}{tail}"
    else:  # held
        label = f"held, {_paths(accepted)} not applied{tail}"
    revert = settlement.revert
    if revert is not None:
        label += ", revert refused" if revert.status == "conflict" else ", reverted"
    return {
        "status": status,
        "label": label,
        "complete": status in SETTLED_WITHOUT_CONFLICT and refused == 0 and conflicts == 0,
        "accepted": accepted,
        "applied": len(settlement.apply.applied),
        "already_applied": len(settlement.apply.already_applied),
        "refused": refused,
        "ignored": ignored,
        "conflicts": conflicts,
        "reverted": revert is not None and revert.status != "conflict",
    }
