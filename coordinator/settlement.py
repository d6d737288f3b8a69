"""Settlement of a run that may write (ARCHITECTURE §9): freeze P, build the candidate C,
and apply F to the live project, each step a broker receipt."""

from __future__ import annotations

import time

from cairn.canonical import sha256_hex
from cairn.coordinator.base import MAX_ATTEMPTS
from cairn.coordinator.context import RunContext, WGenerations
from cairn.coordinator.interactions import RunSuspended
from cairn.errors import BrokerRefused, StorageError
from cairn.policy import fingerprint, load_policy
from cairn.protocol.broker import ApplyDone, CandidateBuilt, ProposalVerified, Receipt
from cairn.protocol.settlement_record import (
    AppliedPaths,
    SettlementRecord,
    SettlementStatus,
    Verification,
)
from cairn.rawbytes import apply_result, readable_verification
from cairn.settle.outcome import APPLY_REQUEST_ID, SETTLEMENT_OP


class Settlement:
    """P → changes → C → F → live."""

    def __init__(self, run: RunContext, w: WGenerations) -> None:
        self.run = run
        self.w = w

    def needs_settlement(self) -> bool:
        return any(a["access"] == "write" for a in self.run.review["agents"].values())

    def settle(self) -> SettlementRecord:
        """P → changes → C → F → live, each step a broker receipt; the record kept."""
        try:
            freeze, candidate = self.run.broker(
                "storage-v1",
                [
                    self.run.intent(
                        "freeze-proposal", "freeze-proposal", generation=self.w["root"]
                    ),
                    self.run.intent("settle-candidate", "settle-candidate"),
                ],
            )
        except BrokerRefused as exc:
            if exc.code == StorageError.code:  # a full pool: nothing reached the live project
                not_settled = SettlementRecord(status="failed", error=exc.message)
                self.run.journal.set_settlement(self.run.run_id, not_settled, token=self.run.token)
            raise
        built = candidate.body(CandidateBuilt)
        verified = self.verify_proposal() if built.accepted and self.run.desc.verifiers else None
        verification = (None if verified is None
                        else Verification.model_validate(readable_verification(verified)))

        def record(status: SettlementStatus, *, held: str | None = None,
                   apply: AppliedPaths | None = None) -> SettlementRecord:
            return SettlementRecord(status=status, candidate=candidate.data,
                                    verification=verification, held=held,
                                    apply=AppliedPaths() if apply is None else apply)

        failed = verified is not None and not verified.passed
        held = (self.held_back(built, record("waiting")) if built.accepted and not failed
                else None)
        if not built.accepted:
            settlement = record("noop" if built.inventories_equal else "refused")
        elif failed:
            settlement = record("verification-failed")
        elif held is not None:
            settlement = record("held", held=held)
        else:
            applied = apply_result(self.apply_proposal().body(ApplyDone))
            settlement = record(applied.status, apply=AppliedPaths.of(applied))
        self.run.journal.set_settlement(self.run.run_id, settlement, token=self.run.token)
        self.run.event("settled", status=settlement.status, refused=len(built.refused),
                   ignored=len(built.ignored or []))
        return settlement

    def verify_proposal(self) -> ProposalVerified:
        """The host's checks of F (frozen at launch), before anything is applied or asked."""
        verify = self.run.intent("verify-proposal", "verify-proposal")
        (verified,) = self.run.broker("launch-v1", [verify])
        result = verified.body(ProposalVerified)
        for check in result.checks:
            self.run.event("proposal-checked", check=check.name, passed=check.passed,
                       result=check.result, exit_status=check.exit_status)
        return result

    def held_back(self, built: CandidateBuilt, waiting: SettlementRecord) -> str | None:
        """Why F stays out of the live project, or None to apply it now. With ``--apply
        ask`` the proposal becomes an approval request and the run waits, with no process
        of it alive, until the owner decides (``cairn apply`` approves it); meanwhile the
        settlement record is ``waiting``, so ``cairn diff`` shows what would be written."""
        mode = self.run.desc.apply_mode
        if mode == "auto":
            return None
        if mode == "never":
            return "launched with --apply never"
        request = self.run.journal.approval(self.run.run_id, APPLY_REQUEST_ID)
        if request is None:
            prepared = {
                "kind": "apply",
                "run_id": self.run.run_id,
                "project": self.run.desc.project.root,
                "accepted": sorted(built.accepted),
                "refused": len(built.refused),
                "f": built.f.uuid,
                "diff_sha256": sha256_hex(built.diff.encode()),
            }
            request = self.run.journal.open_approval(
                self.run.run_id,
                token=self.run.token,
                request_id=APPLY_REQUEST_ID,
                op_id=SETTLEMENT_OP,
                attempt=1,
                prepared=prepared,
                fingerprint=fingerprint(prepared),
                evaluation={"decision": "ask", "reasons": ["launched with --apply ask"]},
                deadline=time.time() + load_policy().approval_deadline_sec,
            )
        if request.state == "waiting":
            self.run.journal.set_settlement(self.run.run_id, waiting, token=self.run.token)
            raise RunSuspended("the proposal waits for 'cairn apply'", state="waiting")
        if request.state == "approved":
            return None
        who = f" by uid {request.actor_uid}" if request.actor_uid is not None else ""
        why = f": {request.reason}" if request.reason else ""
        return f"apply {request.state}{who}{why}"

    def apply_proposal(self) -> Receipt:
        """Run the apply unit; an interrupted apply is simply run again (it resumes from
        its per-path receipts)."""
        intent = self.run.intent("start-apply", "start-apply.1")
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with self.run.progress_relay("apply"):
                    (applied,) = self.run.broker("launch-v1", [intent], queued=attempt > 1)
                return applied
            except BrokerRefused as exc:
                if attempt == MAX_ATTEMPTS:
                    raise
                self.run.event("apply-retry", attempt=attempt + 1, reason=str(exc))
        raise AssertionError("unreachable")
