"""Settlement of a run that may write (ARCHITECTURE §9): freeze P, build the candidate C,
and apply F to the live project, each step a broker receipt."""

from __future__ import annotations

from typing import Any

from cairn.coordinator.base import MAX_ATTEMPTS, CoordinatorBase
from cairn.errors import BrokerRefused
from cairn.protocol.broker import ApplyDone, CandidateBuilt, Receipt


class Settlement(CoordinatorBase):
    """P → changes → C → F → live."""

    def needs_settlement(self) -> bool:
        return any(a["access"] == "write" for a in self.review["agents"].values())

    def settle(self) -> dict[str, Any]:
        """P → changes → C → F → live, each step a broker receipt."""
        freeze, candidate = self.broker(
            "storage-v1",
            [
                self.intent("freeze-proposal", "freeze-proposal", generation=self.w_gen["root"]),
                self.intent("settle-candidate", "settle-candidate"),
            ],
        )
        built = candidate.body(CandidateBuilt)
        settlement: dict[str, Any] = {"candidate": candidate.data}
        if not built.accepted:
            settlement["status"] = "noop" if built.inventories_equal else "refused"
            settlement["apply"] = {"applied": [], "already_applied": [], "conflicts": []}
        else:
            applied = self.apply_proposal().body(ApplyDone)
            settlement["apply"] = applied.result.model_dump(mode="json")
            settlement["status"] = applied.result.status
        self.journal.set_settlement(self.run_id, settlement, token=self.token)
        self.event("settled", status=settlement["status"], refused=len(built.refused))
        return settlement

    def apply_proposal(self) -> Receipt:
        """Run the apply unit; an interrupted apply is simply run again (it resumes from
        its per-path receipts)."""
        intent = self.intent("start-apply", "start-apply.1")
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with self.progress_relay("apply"):
                    (applied,) = self.broker("launch-v1", [intent], queued=attempt > 1)
                return applied
            except BrokerRefused as exc:
                if attempt == MAX_ATTEMPTS:
                    raise
                self.event("apply-retry", attempt=attempt + 1, reason=str(exc))
        raise AssertionError("unreachable")
