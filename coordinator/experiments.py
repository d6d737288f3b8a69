"""The coordinator's side of experiments (ARCHITECTURE §4.1): ``flow.measure_proposal`` and
``flow.settle_experiment``.

A measurement saves the broker's ``measure-checkpoint`` intent with the move to
``started``; the broker's receipt (idempotent by intent ID) is the measurement, so a crash
at any point measures nothing twice into the record. A settlement is decided from the
journal alone (the measurements by ID, the scope's earlier accepts and rejects); a reject
saves its ``create-w``/``drop-w`` intents and its result with the move to ``started``,
before the broker restores W, so a crash replays the same restore. Either disposition then
has the broker make the scope's hot spare of the checkpoint W holds (``make-spare``), so
the next reject swaps W in by rename.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NoReturn

from cairn import retention
from cairn.coordinator.base import OperationError
from cairn.coordinator.context import RunContext, WGenerations
from cairn.experiments import (
    Measurement,
    MetricDefinition,
    aggregate,
    dishonesty,
    judge,
    reached,
    unsettleable,
)
from cairn.journal.rows import OpRow
from cairn.operations import settle_experiment
from cairn.operations.measure_proposal import site_evaluator
from cairn.protocol.broker import Intent, MeasurementTaken
from cairn.protocol.control import CallRequest
from cairn.protocol.jsonvalue import JSONObject, json_int, json_str
from cairn.rawbytes import InvalidRecordedBytes, measurement_error, trial_check
from cairn.restore_point import restore_point


def _earlier(ops: Iterable[OpRow], scope: str, seq: int) -> list[OpRow]:
    return sorted((o for o in ops if o.scope == scope and o.seq < seq), key=lambda o: o.seq)


def accepted_before(ops: Iterable[OpRow], scope: str, seq: int) -> list[str]:
    """The measurements accepted in ``scope`` before call ``seq``, oldest first: the first
    is the baseline, the last the best."""
    return [
        str((op.result or {}).get("measurement"))
        for op in _earlier(ops, scope, seq)
        if op.kind == "settle_experiment"
        and op.state in ("settled", "committed")
        and (op.result or {}).get("disposition") == "accepted"
    ]


class MeasurementFailed(OperationError):
    """The evaluator failed or printed no metric line; nothing was measured."""

    code = "measurement-failed"


class ExperimentRefused(OperationError):
    """The settlement was refused: a dishonest comparison, a guardrail, or nothing to
    restore. W is unchanged."""

    code = "experiment-refused"


class Experiments:
    """Measure W, and accept or reject what was measured."""

    def __init__(self, run: RunContext, w: WGenerations) -> None:
        self.run = run
        self.w = w

    def measure(self, op: OpRow, call: CallRequest) -> JSONObject:
        site = self.run.check_manifest(call)
        evaluator = call.request["evaluator"]
        reviewed = site_evaluator(site.get("capabilities", []), self.run.desc.args)
        if evaluator != reviewed:
            raise ExperimentRefused(
                f"{op.op_id}: evaluator {evaluator} is not the reviewed one "
                f"(this call's is {reviewed or 'none'})"
            )
        if evaluator not in {e.name for e in self.run.desc.evaluators}:
            raise ExperimentRefused(f"{op.op_id}: evaluator {evaluator} was not frozen at launch")
        measure = self.run.intent(
            "measure-checkpoint",
            f"measure.{op.op_id}.{op.attempt}",
            scope=op.scope,
            op_id=op.op_id,
            attempt=op.attempt,
            generation=self.w[op.scope],
        )
        if op.state == "requested":
            retention.admit("measurement")  # its writable snapshot and the evaluator's output
            self.run.update_op(op.op_id, state="started", intents=[measure]
            )
            self.run.failpoint("measure-after-intent")
        elif op.state != "started":
            return self.settled_or_raise(op, MeasurementFailed)
        (receipt,) = self.run.broker("launch-v1", [measure], queued=True)
        self.run.failpoint("measure-after-receipt")
        taken = receipt.body(MeasurementTaken)
        if taken.error:
            self.measurement_failed(op, measurement_error(taken))
        metrics = {
            name: MetricDefinition.model_validate(d) for name, d in call.request["metrics"].items()
        }
        try:
            values = aggregate(taken.samples, metrics)
            checked = trial_check(taken)
        except ValueError as exc:
            self.measurement_failed(op, str(exc))
        except InvalidRecordedBytes as exc:
            self.measurement_failed(op, exc.message)
        measurement = Measurement(
            measurement=op.op_id,
            evaluator=evaluator,
            primary=call.request["primary"],
            metrics=metrics,
            environment=taken.environment,
            samples=taken.samples,
            values=values,
            checkpoint=restore_point(
                self.run.ops(), op.scope, op.seq,
                replayed_through=self.run.desc.replay.through_op if self.run.desc.replay else None,
            ),
            refused=checked.refused if checked else [],
            refused_count=checked.refused_count if checked else 0,
            allowlist=next(e.allowlist for e in self.run.desc.evaluators if e.name == evaluator),
        )
        result = measurement.model_dump(mode="json")
        self.commit(op, result)
        primary = measurement.primary
        self.run.event("measured", op_id=op.op_id, **{primary: values[primary]})
        return result

    def measurement_failed(self, op: OpRow, error: str) -> NoReturn:
        self.run.update_op(op.op_id, state="failed",
            error=error, result={"error": error, "kind": MeasurementFailed.code},
        )
        raise MeasurementFailed(f"{op.op_id}: {error}")

    def settle_experiment(self, op: OpRow, call: CallRequest) -> JSONObject:
        if op.state == "requested":
            result, intents = self.decide(op, call)
            self.run.update_op(op.op_id, state="started",
                result=result, intents=intents,
            )
            self.run.failpoint("experiment-after-decision")
            op = self.run.op(op.op_id)
        if op.state != "started":
            return self.settled_or_raise(op, ExperimentRefused)
        result = dict(op.result or {})
        intents = self.settlement_intents(op, result)
        if intents:  # saved with the decision; added again (a no-op) for a decision saved
            self.run.broker("storage-v1", intents)  # before settlements made spares
        if result["disposition"] == "rejected":
            self.w.move(op.scope, json_int(result["w_generation"]))
            self.run.failpoint("experiment-after-restore")
        self.commit(op, result)
        self.run.event("experiment-" + json_str(result["disposition"]), op_id=op.op_id,
                   measurement=result["measurement"])
        return result

    def decide(self, op: OpRow, call: CallRequest) -> tuple[JSONObject, list[Intent]]:
        """The settlement's result and the intents that carry it out, from the journal."""
        try:
            settle_experiment.checked(call.request)
        except ValueError as exc:
            self.refuse(op, f"not a settlement of flow.settle_experiment: {exc}")
        ops = self.run.ops()
        candidate = self.measurement(ops, op.scope, call.request["measurement"])
        accepted = [self.measurement(ops, op.scope, m) for m in accepted_before(ops, op.scope,
                                                                                op.seq)]
        result: JSONObject = {
            "measurement": candidate.measurement,
            "baseline": accepted[0].measurement if accepted else candidate.measurement,
            "best": accepted[-1].measurement if accepted else None,
            "gain": None,
        }
        if accepted:
            refusals = dishonesty(accepted[0], candidate)
            if refusals:
                self.refuse(op, "a dishonest comparison: " + "; ".join(refusals))
            verdict = judge(accepted[-1], candidate)
            result["gain"] = verdict.gain
            if call.request["disposition"] == "accept" and verdict.refusals:
                self.refuse(op, "cannot accept: " + "; ".join(verdict.refusals))
        target = call.request.get("target")
        if call.request["disposition"] == "accept" and candidate.refused_count:
            self.refuse(op, f"cannot accept: {unsettleable(candidate)}; reject it, or declare "
                        "the paths in @workflow(write_paths=...)")
        if call.request["disposition"] == "accept":
            result |= {"disposition": "accepted", "best": candidate.measurement,
                       "checkpoint": candidate.checkpoint}
            if target is not None:
                result["target_reached"] = reached(candidate, target)
            return result, self.settlement_intents(op, result)
        if not accepted:
            self.refuse(op, "nothing was accepted yet in this scope to restore W from")
        best = accepted[-1]
        if target is not None:
            result["target_reached"] = reached(best, target)
        if best.checkpoint is None and op.scope != "root":
            self.refuse(op, "a lane's W cannot be restored to its start; accept a checkpoint first")
        generation = self.w[op.scope] + 1
        result |= {"disposition": "rejected", "checkpoint": best.checkpoint,
                   "w_generation": generation}
        return result, self.settlement_intents(op, result)

    def settlement_intents(self, op: OpRow, result: JSONObject) -> list[Intent]:
        """A reject's new W generation from the best accepted checkpoint (None: Q) and the
        drop of the rejected one; then the scope's hot spare of the checkpoint W now holds,
        which the next reject takes by rename (none for Q)."""
        scope, checkpoint = op.scope, result["checkpoint"]
        intents: list[Intent] = []
        if result["disposition"] == "rejected":
            generation = json_int(result["w_generation"])
            intents += [
                self.run.intent("create-w", f"create-w.{scope}.{generation}", scope=scope,
                            generation=generation, from_checkpoint=checkpoint),
                self.run.intent("drop-w", f"drop-w.{scope}.{generation - 1}", scope=scope,
                            generation=generation - 1),
            ]
        if checkpoint is not None:
            intents.append(self.run.intent("make-spare", f"spare.{op.op_id}", scope=scope,
                                       op_id=op.op_id, from_checkpoint=checkpoint))
        return intents

    def measurement(self, ops: list[OpRow], scope: str, op_id: str) -> Measurement:
        """A committed measurement of ``scope``, read from the journal (never the
        workflow's copy)."""
        found = next((o for o in ops if o.op_id == op_id), None)
        if found is None or found.kind != "measure_proposal" or found.scope != scope or \
                found.state != "committed" or found.result is None:
            raise ExperimentRefused(f"{op_id} is not a finished measurement of scope {scope}")
        return Measurement.model_validate(found.result)

    def refuse(self, op: OpRow, reason: str) -> None:
        self.run.update_op(op.op_id, state="not-started",
            error=reason, result={"error": reason, "kind": ExperimentRefused.code},
            event="experiment-refused", event_data={"reason": reason},
        )
        raise ExperimentRefused(f"{op.op_id}: {reason}")

    def commit(self, op: OpRow, result: Mapping[str, object]) -> None:
        self.run.update_op(op.op_id, state="settled",
                               result=result)
        self.run.update_op(op.op_id, state="committed")

    def settled_or_raise(self, op: OpRow, error: type[OperationError]) -> JSONObject:
        """An operation found past ``started`` after a crash: its result, or its failure."""
        if op.state == "settled" and op.result is not None:
            self.run.update_op(op.op_id, state="committed")
            return op.result
        raise error(f"{op.op_id} did not complete: {op.error}")
