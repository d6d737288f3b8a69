"""Recovery of an agent attempt that ended without a result (ARCHITECTURE §5): one killed
by a limit fails for good; a sandboxed one (``network="none"``) gets a clean retry on a W
restored from the checkpoint its scope's W held when the operation began (bounded); one
whose effect may have reached outside is ``uncertain`` and blocks the run until ``cairn
reconcile`` decides."""

from __future__ import annotations

from cairn import untrusted
from cairn.coordinator.base import OperationError, ReviewedAgent, RunBlocked
from cairn.coordinator.context import RunContext, WGenerations
from cairn.journal.rows import OpRow
from cairn.protocol.broker import WCreated
from cairn.restore_point import restore_point


class Recovery:
    """Fail, retry or block an attempt that left no result."""

    def __init__(self, run: RunContext, w: WGenerations) -> None:
        self.run = run
        self.w = w

    def fail_if_limit_hit(self, op: OpRow) -> None:
        """An agent killed by one of its limits fails for good, naming the limit: running
        it again would hit the same wall."""
        out, owner = self.run.outputs_dir(op.op_id, op.attempt), self.run.desc.owner_uid
        try:  # written by the unit's ExecStopPost, as the run owner
            result = untrusted.read_text(out, "service-result", owner=owner, limit=99).split()[0]
        except (untrusted.UntrustedFileError, IndexError):
            return
        limits = self.run.desc.limits
        reason = {
            "oom-kill": f"it was killed by the OOM killer: it exceeded MemoryMax="
            f"{limits.memory_max} bytes",
            "timeout": f"it ran longer than RuntimeMaxSec={limits.runtime_max_sec}",
        }.get(result)
        if reason is None:
            return
        self.run.update_op(op.op_id, state="failed",
            error=reason,
            event="op-limit",
            event_data={"result": result},
        )
        raise OperationError(
            f"agent {op.op_id} {reason}",
            hint="raise the limit with 'cairn launch --limit …' or see "
            f"'cairn logs {self.run.run_id}'",
        )

    def retry_or_block(self, op: OpRow, agent: ReviewedAgent, ended: str) -> None:
        """The unit is gone with no result: retry cleanly when nothing could have left the
        sandbox, otherwise stop for a person's decision. (Under a cancel the caller stops
        every lane's agent instead.)"""
        if agent["network"] != "none":
            self.run.update_op(op.op_id, state="uncertain",
                error=f"attempt {op.attempt} ended without a result ({ended})",
            )
            raise RunBlocked(
                f"{op.op_id} ended without a result and may have reached outside ({ended})",
                hint=f"decide with 'cairn reconcile {self.run.run_id} {op.op_id}'",
            )
        if op.attempt >= self.run.desc.profiles[agent["profile"]].agent_attempts:
            attempts = "1 attempt" if op.attempt == 1 else f"{op.attempt} attempts"
            self.run.update_op(op.op_id, state="failed",
                error=f"no finish_work in {attempts} ({ended})",
            )
            raise OperationError(
                f"agent {op.op_id} ended without finish_work in {attempts} (last: {ended})",
                hint=f"see 'cairn logs {self.run.run_id}'",
            )
        self.clean_retry(op, ended)

    def clean_retry(self, op: OpRow, reason: str) -> None:
        """Record the next attempt on a fresh W restored from the checkpoint the scope's W
        held when the operation began (:func:`cairn.restore_point.restore_point`; None: Q);
        the failed attempt's W generation is deleted."""
        current = self.w[op.scope]
        restored = current + 1
        replay = self.run.desc.replay
        source = restore_point(
            self.run.ops(),
            op.scope,
            op.seq,
            replayed_through=replay.through_op if replay else None,
        )
        created, _dropped = self.run.broker(
            "storage-v1",
            [
                self.run.intent(
                    "create-w",
                    f"create-w.{op.scope}.{restored}",
                    scope=op.scope,
                    generation=restored,
                    from_checkpoint=source,
                ),
                self.run.intent(
                    "drop-w",
                    f"drop-w.{op.scope}.{current}",
                    scope=op.scope,
                    generation=current,
                ),
            ],
        )
        self.w.move(op.scope, restored)
        self.run.update_op(op.op_id, state="requested",
            attempt=op.attempt + 1,
            event="op-retry",
            event_data={
                "failed_attempt": op.attempt,
                "ended": reason,
                "w_generation": restored,
                "from_checkpoint": source,
                "source_uuid": created.body(WCreated).source_uuid,
            },
        )
        self.run.event(
            "clean-retry", op_id=op.op_id, attempt=op.attempt + 1, from_checkpoint=source or "Q"
        )
