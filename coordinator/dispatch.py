"""What the coordinator does for each operation kind: one table ``kind → handler``.

The kinds themselves (review rule, request, views, flags) live in
:mod:`cairn.operations`; a kind that needs the coordinator to act gets one entry here, a
method of :class:`Handlers`. A kind with no entry is one this release does not carry out:
the review refuses it, and a run reviewed by another version that makes it fails with "not
supported". Each handler takes the journalled operation
(not yet committed) and the call, and returns its result and whether it was committed
just now (a fork is answered by its join, so it never is).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cairn.coordinator import interactions
from cairn.coordinator.agentop import AgentOperations
from cairn.coordinator.context import RunContext
from cairn.coordinator.experiments import Experiments
from cairn.coordinator.lanes import Lanes
from cairn.coordinator.restores import Restores
from cairn.errors import CairnError
from cairn.journal.rows import OpRow
from cairn.operations import FORK_KINDS, MARKER_KINDS, OperationKind
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONObject


class Handlers:
    """The coordinator's handler of each operation kind, each over the collaborator that
    carries the kind out."""

    def __init__(
        self,
        run: RunContext,
        agents: AgentOperations,
        lanes: Lanes,
        experiments: Experiments,
        restores: Restores,
    ) -> None:
        self.run = run
        self.agents = agents
        self.lanes = lanes
        self.experiments = experiments
        self.restores = restores

    def carry_out(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        """The handler of ``call``'s kind, on ``op``: its result, and whether it was
        committed just now."""
        handler = HANDLERS.get(call.kind)
        if handler is None:
            raise CairnError(f"flow.{call.kind} is not supported by this version of cairn")
        return handler(self, op, call)

    def answer_agent(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        return self.agents.run_agent(op, call), True

    def answer_ask(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        return interactions.ask(self.run, op, call), True

    def answer_approve(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        return interactions.approve(self.run, op, call), True

    def answer_fork(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        return self.lanes.fork(op, call), False

    def answer_measure(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        return self.experiments.measure(op, call), True

    def answer_settle_experiment(
        self, op: OpRow, call: CallRequest
    ) -> tuple[JSONObject, bool]:
        return self.experiments.settle_experiment(op, call), True

    def answer_restore(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        return self.restores.restore(op, call), True

    def answer_marker(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
        """No effect: recorded so views and replay see it."""
        result: JSONObject = {"marked": call.kind}
        self.run.journal.update_op(
            self.run.run_id, op.op_id, token=self.run.token, state="committed", result=result
        )
        return result, False


Handler = Callable[[Handlers, OpRow, CallRequest], tuple[JSONObject, bool]]

HANDLERS: Mapping[OperationKind, Handler] = {
    "agent": Handlers.answer_agent,
    "ask": Handlers.answer_ask,
    "approve": Handlers.answer_approve,
    "measure_proposal": Handlers.answer_measure,
    "settle_experiment": Handlers.answer_settle_experiment,
    "restore": Handlers.answer_restore,
    **dict.fromkeys(FORK_KINDS, Handlers.answer_fork),
    **dict.fromkeys(MARKER_KINDS, Handlers.answer_marker),
}
