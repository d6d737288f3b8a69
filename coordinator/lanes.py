"""Lanes (ARCHITECTURE §5): ``flow.parallel`` and ``flow.map`` fork the scope's W into one
writable W per lane; the join records every lane's outcome and final checkpoint (lanes
are evidence, never merged), and keeps the unfinished work of a lane that failed. Also
which earlier boundaries an operation may see."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from cairn import retention
from cairn.coordinator.base import Nondeterminism
from cairn.coordinator.context import RunContext, WGenerations
from cairn.errors import CairnError
from cairn.journal.rows import OpRow, fork_lanes
from cairn.operations import BOUNDARY_KINDS, FORK_KINDS
from cairn.protocol.control import CallRequest, JoinRequest
from cairn.protocol.jsonvalue import JSONObject, json_object, json_str

log = logging.getLogger(__name__)


class Lanes:
    """FORK and JOIN, and the causal view of earlier boundaries."""

    def __init__(self, run: RunContext, w: WGenerations) -> None:
        self.run = run
        self.w = w

    def fork(self, op: OpRow, call: CallRequest) -> JSONObject:
        """FORK: checkpoint the parent's W; every lane gets a writable W of that checkpoint.
        The operation stays ``started`` until the join commits it."""
        lanes = list(call.request["lanes"])
        intent = self.run.intent(
            "fork",
            f"fork.{op.op_id}",
            scope=op.scope,
            op_id=op.op_id,
            generation=self.w[op.scope],
            lanes=lanes,
        )
        if op.state == "requested":
            retention.admit("fork")
            self.run.update_op(op.op_id, state="started",
                intents=[intent],
                event="fork",
                event_data={"lanes": lanes},
            )
        if op.state in ("requested", "started"):
            self.run.broker("storage-v1", [intent], queued=True)
        self.w.add_lanes(op.op_id, lanes)
        return {"forked": True, "lanes": lanes}

    def join(self, join: JoinRequest) -> tuple[JSONObject, str, bool]:
        """JOIN: record every lane's outcome and final checkpoint; the parent's W is left
        as it was (lanes are evidence, never merged)."""
        op_id = f"{join.scope}-{join.seq}"
        op = self.run.op(op_id)
        live = _lane_ends(join.outcomes)
        if op.state == "committed":
            assert op.result is not None
            stored = _lane_ends(json_object(op.result["outcomes"]))
            if stored != live:
                raise Nondeterminism(
                    f"lanes of {op_id} ended differently on replay: "
                    f"journal {stored} vs replay {live}"
                )
            return op.result, op_id, False
        ops = self.run.ops()
        outcomes: JSONObject = {}
        for key, outcome in join.outcomes.items():
            lane = f"{op_id}-{key}"
            boundaries = [
                o
                for o in ops
                if o.scope == lane and o.kind in BOUNDARY_KINDS and o.state == "committed"
            ]
            last = max(boundaries, key=lambda o: o.seq) if boundaries else None
            last_s = json_object((last.checkpoint or {}).get("s", {})) if last else {}
            outcomes[key] = {
                **outcome,
                "scope": lane,
                "boundary": last.op_id if last else None,
                "checkpoint": last_s.get("path"),
                "evidence": (None if outcome["outcome"] == "succeeded"
                             else self.keep_unfinished_work(lane, ops)),
            }
        result: JSONObject = {"joined": True, "outcomes": outcomes, "order": list(join.outcomes)}
        self.run.update_op(op_id, state="settled",
            result=result,
            event="join",
            event_data={k: v["outcome"] for k, v in join.outcomes.items()},
        )
        self.run.update_op(op_id, state="committed")
        return result, op_id, True

    def keep_unfinished_work(self, lane: str, ops: list[OpRow]) -> str | None:
        """A lane that did not succeed keeps what its last agent left in W when that agent
        failed (:meth:`keep_w_as_evidence`); the operation, or None when W holds nothing a
        checkpoint does not (no agent ran, the last one committed or never started)."""
        agents = [o for o in ops if o.scope == lane and o.kind == "agent"]
        if not agents:
            return None
        last = max(agents, key=lambda o: o.seq)
        if last.state != "failed":
            return None
        return last.op_id if self.keep_w_as_evidence(last, "failed") else None

    def keep_w_as_evidence(self, op: OpRow, ended: str) -> bool:
        """Keep the W ``op``'s agent left as a read-only checkpoint of ``op`` (a person
        sees it in ``cairn show``, later agents under ``/evidence/incoming/<op>/workspace``).
        Only for an operation that never runs again, so its checkpoint's intent ID is never
        reused: one that failed (terminal), or one a cancel stopped (the run ends
        cancelled, never blocked, so no retry). False when there is nothing to keep (its
        agent never started). Best effort: a checkpoint the broker cannot take is logged
        and withdrawn, and the run goes on."""
        if op.checkpoint:  # taken at its failure (no changes) or by an earlier call
            return True
        started = f"start-agent.{op.op_id}."
        if not any(r["intent_id"].startswith(started) for r in self.run.receipts()):
            return False
        intent = self.run.intent("checkpoint", f"checkpoint.{op.op_id}", scope=op.scope,
                             op_id=op.op_id, generation=self.w[op.scope])
        try:
            (taken,) = self.run.broker("storage-v1", [intent])
        except CairnError as exc:
            # a pending intent the broker refuses would stop the run's every later call
            self.run.journal.withdraw_intent(self.run.run_id, intent.intent_id)
            log.warning("%s: its unfinished work is not kept: %s", op.op_id, exc.message)
            return False
        self.run.failpoint("lane-evidence-after-storage")
        self.run.update_op(op.op_id, checkpoint=taken.data, event="lane-evidence-kept",
                               event_data={"scope": op.scope, "state": ended})
        return True

    def causal_incoming(self, scope: str, seq: int) -> list[str]:
        """The boundaries an operation may see: earlier ones of its own scope and of the
        scopes it was forked from (up to the fork), and the final boundaries of lanes
        joined before it. Never a sibling lane's."""
        ops = self.run.ops()
        parents = {
            f"{o.op_id}-{key}": (o.scope, o.seq)
            for o in ops
            if o.kind in FORK_KINDS
            for key in fork_lanes(o.request) or []
        }
        chain = [(scope, seq)]
        while chain[-1][0] in parents:
            chain.append(parents[chain[-1][0]])
        incoming: list[str] = []
        for chain_scope, limit in reversed(chain):
            for o in sorted(
                (o for o in ops if o.scope == chain_scope and o.seq < limit), key=lambda o: o.seq
            ):
                if o.state != "committed":
                    continue
                if o.kind in BOUNDARY_KINDS:
                    incoming.append(o.op_id)
                elif o.kind in FORK_KINDS and o.result:
                    incoming += [
                        json_str(v[key])
                        for v in map(json_object, json_object(o.result["outcomes"]).values())
                        for key in ("boundary", "evidence") if v.get(key)
                    ]
        return incoming


def _lane_ends(outcomes: Mapping[str, object]) -> dict[str, tuple[object, object]]:
    """Each lane's outcome and last operation: what must be the same on replay."""
    return {
        key: (json_object(lane)["outcome"], json_object(lane).get("last_op"))
        for key, lane in outcomes.items()
    }
