"""The coordinator: holds the run lease and replays the workflow against the journal.

Every ``flow.*`` call the control worker makes is answered from the journal when it was
committed before, and otherwise carried out through intents for the broker. An agent
operation commits only after FINISH → QUIESCE → SNAPSHOT → MATERIALIZE.

Recovery (ARCHITECTURE §5) is not a separate mode: a restarted coordinator replays from
the start and each operation continues from the state the journal recorded for it.

:class:`Coordinator` runs one run from start to end. It builds the run's collaborators in
one place and hands each the others it needs, explicitly: the run context and the broker
client (:mod:`~cairn.coordinator.context`), the lease (:mod:`~cairn.coordinator.lease`),
lanes (:mod:`~cairn.coordinator.lanes`), agent operations
(:mod:`~cairn.coordinator.agentop`) with the recovery of an attempt
(:mod:`~cairn.coordinator.recovery`), experiments (:mod:`~cairn.coordinator.experiments`),
restores (:mod:`~cairn.coordinator.restores`), people in the loop
(:mod:`~cairn.coordinator.interactions`), settlement (:mod:`~cairn.coordinator.settlement`)
and replay of the control worker's calls (:mod:`~cairn.coordinator.replay`). Which
collaborator answers a call is one table by operation kind
(:mod:`~cairn.coordinator.dispatch`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping

from cairn import paths, retention
from cairn.coordinator import interactions, upgradecheck
from cairn.coordinator.agentop import AgentOperations, BudgetExhausted
from cairn.coordinator.base import (
    EXIT_RESTART,
    MAX_ATTEMPTS,
    RunBlocked,
)
from cairn.coordinator.budget import MoneyBudget, TokenBudget
from cairn.coordinator.context import RunContext, WGenerations
from cairn.coordinator.dispatch import Handlers
from cairn.coordinator.experiments import Experiments
from cairn.coordinator.lanes import Lanes
from cairn.coordinator.lease import (
    HEARTBEAT,
    UNKNOWN_BOOT,
    Lease,
    boot_id,
    holder_is_dead,
    lease_holder,
)
from cairn.coordinator.recovery import Recovery
from cairn.coordinator.replay import Replay
from cairn.coordinator.restores import Restores
from cairn.coordinator.settlement import Settlement
from cairn.errors import CairnError, SystemdError, Unavailable
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES, OpRow
from cairn.journal.store import LEASE_TTL
from cairn.journal.writes import LeaseLost
from cairn.protocol.broker import StorageVerified
from cairn.protocol.jsonvalue import JSONObject, JSONValue, json_int, json_object
from cairn.protocol.settlement_record import SettlementRecord
from cairn.workflow import RUNTIME_API_VERSION
from cairn.workflow.review import review_source

__all__ = [
    "EXIT_RESTART",
    "HEARTBEAT",
    "LEASE_TTL",
    "MAX_ATTEMPTS",
    "UNKNOWN_BOOT",
    "BudgetExhausted",
    "Coordinator",
    "RunBlocked",
    "boot_id",
    "holder_is_dead",
    "lease_holder",
    "tokens_used",
]

log = logging.getLogger(__name__)


def tokens_used(ops: list[OpRow], spent: dict[tuple[str, int], int]) -> int:
    """Model tokens the run has spent (survives restarts): every attempt's recorded
    ``spent`` tokens, crashed and retried ones included, plus what a committed boundary
    reported for an attempt with no record (a journal written before tokens were
    recorded as spent)."""
    used = sum(spent.values())
    for op in ops:
        if (
            op.state == "committed"
            and op.result is not None
            and (op.op_id, op.attempt) not in spent
        ):
            used += json_int(json_object(op.result.get("usage", {})).get("total_tokens", 0))
    return used


class Coordinator:
    """Run one workflow run to a terminal state (or until it must wait): the one place
    where the run's collaborators are built and wired to each other."""

    def __init__(self, run_id: str) -> None:
        self.context = run = RunContext.load(run_id)
        self.run_id = run_id
        self.lease = Lease(run)
        self.w = WGenerations()
        ops = run.journal.list_ops(run_id)
        spent = run.journal.model_tokens_spent(run_id)
        limits = run.desc.limits
        self.lanes = Lanes(run, self.w)
        self.agents = AgentOperations(
            run,
            self.w,
            self.lanes,
            Recovery(run, self.w),
            budget=TokenBudget(limits.model_tokens, used=tokens_used(ops, spent)),
            money=MoneyBudget(
                limits.model_cost_cents, run.journal.model_spend(run_id).cost_micros,
                daily_cents=limits.daily_cost_cents, spent_today=run.spent_today,
            ),
        )
        self.experiments = Experiments(run, self.w)
        self.restores = Restores(run, self.w)
        self.settlement = Settlement(run, self.w)
        self.handlers = Handlers(run, self.agents, self.lanes, self.experiments, self.restores)
        # Operations committed before this coordinator started: replay answers them from
        # memory, in the reader thread, without a journal round trip or a thread each.
        self.replayer = Replay(
            run,
            self.handlers.carry_out,
            self.lanes,
            committed={(op.scope, op.seq): op for op in ops if op.state == "committed"},
            always_replay=os.environ.get("CAIRN_ALWAYS_REPLAY") == "1",
        )

    @property
    def journal(self) -> Journal:
        """The calling thread's journal connection."""
        return self.context.journal

    @property
    def token(self) -> int:
        """The lease's fencing token (0 before the lease is held)."""
        return self.context.token

    @token.setter
    def token(self, value: int) -> None:
        self.context.token = value

    def replay(self) -> JSONObject:
        """Run the workflow's control worker until it returns (:meth:`Replay.replay`)."""
        return self.replayer.replay()

    # --- main -----------------------------------------------------------------------

    def run(self) -> int:
        # cairn upgrade's dry runs first: they only read the run (coordinator/upgradecheck.py)
        upgradecheck.serve_pending(self.journal, self.run_id)
        run = self.journal.get_run(self.run_id)
        if run.state in (*TERMINAL_RUN_STATES, "blocked"):
            log.info("run %s is %s; nothing to do", self.run_id, run.state)
            return 0
        self.lease.take()
        self.context.event("coordinator-started", token=self.token)
        try:
            self.replayer.prestart_control_worker()
            self.check_pinned_source()
            self.journal.set_run_state(self.run_id, "running", token=self.token)
            self.prepare_storage()
            self.verify_storage()
            output = self.replay()
            settlement = self.settlement.settle() if self.settlement.needs_settlement() else None
            self.finish_run(output, settlement)
            return 0
        except (Unavailable, SystemdError) as exc:
            log.error("run %s: %s; exiting so systemd restarts recovery", self.run_id, exc)
            return EXIT_RESTART
        except RunBlocked as exc:
            log.error("run %s blocked: %s", self.run_id, exc)
            self.journal.set_run_state(self.run_id, "blocked", token=self.token, error=str(exc))
            return 0
        except interactions.RunSuspended as exc:  # waits for a person, or paused/stopped
            log.info("run %s: %s", self.run_id, exc)
            if exc.state == "cancelled":  # no lane's agent outlives a cancelled run
                self.agents.stop_running_agents()
            return int(interactions.suspend(self.context, exc))
        except LeaseLost:
            raise
        except CairnError as exc:
            log.error("run %s failed: %s", self.run_id, exc)
            self.journal.set_run_state(self.run_id, "failed", token=self.token, error=str(exc))
            return 0
        finally:
            self.replayer.discard_prestarted_worker()
            self.lease.stop_heartbeat()
            self.remove_channels_if_ended()
            self.lease.release()

    def remove_channels_if_ended(self) -> None:
        """A run that ended has no agent left: its socket directory goes. (Not before:
        a running agent's bound channel directory must survive a coordinator restart.)"""
        if self.journal.get_run(self.run_id).state in TERMINAL_RUN_STATES:
            shutil.rmtree(paths.agent_socket_dir(self.run_id), ignore_errors=True)

    def finish_run(
        self, output: Mapping[str, JSONValue], settlement: SettlementRecord | None
    ) -> None:
        if settlement is not None and settlement.status == "verification-failed":
            assert settlement.verification is not None
            check = settlement.verification.first_failed() or {}
            self.journal.set_run_state(
                self.run_id,
                "failed",
                token=self.token,
                output=output,
                error=f"proposal not applied: check {check.get('name')} failed "
                f"({check.get('result')}, exit status {check.get('exit_status')}); "
                f"see 'cairn show {self.run_id}'",
            )
        elif settlement is not None and settlement.status == "conflict":
            conflicts = [c.path for c in settlement.apply.conflicts]
            self.journal.set_run_state(
                self.run_id,
                "failed",
                token=self.token,
                output=output,
                error=f"proposal not applied: {len(conflicts)} path(s) changed in the "
                f"live project meanwhile: {', '.join(conflicts[:5])}",
            )
        else:
            self.journal.set_run_state(self.run_id, "succeeded", token=self.token, output=output)

    def check_pinned_source(self) -> None:
        """A run resumes only on the exact reviewed source and runtime it was launched with."""
        desc = self.context.desc
        current = review_source(desc.source, filename=desc.source_filename)
        if current.review_hash != desc.review_hash:
            raise CairnError(
                f"the pinned source of {self.run_id} no longer reviews to its launch hash "
                f"({current.review_hash} != {desc.review_hash})"
            )
        if desc.review.get("api_version") != RUNTIME_API_VERSION:
            raise RunBlocked(
                f"run was launched for {desc.review.get('api_version')}; this host runs "
                f"{RUNTIME_API_VERSION}",
                hint="replay it into a new run, or upgrade it once that is supported",
            )

    # --- storage --------------------------------------------------------------------

    def prepare_storage(self) -> None:
        """Q and the first W, plus whatever storage intents a crash left pending. The
        first time, the pool must have its reserve free (an import may copy the project)."""
        if not self.journal.intents(self.run_id, "storage-v1"):
            retention.admit("the project's import or snapshot")
        # A replayed run's Q and checkpoints are the source's, reminted by prepare-q; its
        # root W starts from the checkpoint it was replayed through.
        run = self.context
        replayed_through = run.desc.replay.through_op if run.desc.replay else None
        with run.progress_relay("import"):
            run.broker(
                "storage-v1",
                [
                    run.intent("prepare-q", "prepare-q"),
                    run.intent(
                        "create-w",
                        "create-w.root.1",
                        scope="root",
                        generation=1,
                        from_checkpoint=replayed_through,
                    ),
                ],
            )
        for intent in self.journal.intents(self.run_id, "storage-v1"):
            if intent.kind == "create-w":
                self.w.at_least(intent.scope, intent.generation)
            if intent.kind == "fork" and intent.op_id is not None:
                self.w.add_lanes(intent.op_id, intent.lanes)

    def verify_storage(self) -> None:
        """Before continuing, the broker checks the run's subvolumes against its receipts;
        a missing or foreign snapshot blocks the run instead of being papered over."""
        run = self.context
        (report,) = run.broker(
            "storage-v1", [run.intent("verify-storage", f"verify-storage.{self.token}")]
        )
        problems = report.body(StorageVerified).problems
        if problems:
            raise RunBlocked(
                f"storage integrity: {'; '.join(problems[:3])}",
                hint=f"see 'cairn doctor {self.run_id}'",
            )
