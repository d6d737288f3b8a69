"""`cairn upgrade`'s dry run, in the run's coordinator unit (ARCHITECTURE §2: cairnd never
runs workflow source). cairnd records an ``upgrade-check-requested`` event with the new
source and has the broker start the coordinator; before anything else the coordinator
replays the journal's committed calls against that source in its own sandboxed control
worker and records the report as ``upgrade-checked``.

The replay is the coordinator's own (:class:`~cairn.coordinator.replay.Replay`): answers
carry their lane's scope, a fork is answered and its join compared as on a resume. Only
what differs is overridden: identity is kind, request and predecessor (a call may move to
another line, so its location is recorded, not compared), a call site must be in the new
review, nothing is ever carried out (the first uncommitted call is the frontier) and
nothing is written but the report.
"""

from __future__ import annotations

from cairn import paths
from cairn.coordinator.base import Nondeterminism, ReviewedSite
from cairn.coordinator.context import RunContext, WGenerations
from cairn.coordinator.lanes import Lanes
from cairn.coordinator.replay import Replay
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.operations import FORK_KINDS
from cairn.protocol.control import CallRequest, JoinRequest
from cairn.protocol.jsonvalue import JSONObject, json_list, json_str
from cairn.workflow.review import review_source

REQUESTED = "upgrade-check-requested"
CHECKED = "upgrade-checked"


class Diverged(Nondeterminism):
    """The new source's call differs from the journal's: ``report`` says where and how."""

    def __init__(self, report: dict[str, object]) -> None:
        super().__init__(f"the new source diverges at {report['op_id']}")
        self.report = report


class _Frontier(CairnError):
    """The first call the journal never committed: everything after it runs fresh."""


class UpgradeCheck(Replay):
    """One dry run of ``source`` against the run's committed operations."""

    def __init__(self, run_id: str, source: str) -> None:
        with Journal(paths.journal_path()) as journal:
            old = journal.launch_description(run_id)
        review = review_source(source, filename=old.source_filename)
        run = RunContext(old.model_copy(update={
            "source": source,
            "review_hash": review.review_hash,
            "review": review.model_dump(mode="json"),
        }))
        self.ops = {(op.scope, op.seq): op for op in run.ops()}
        committed = {k: op for k, op in self.ops.items() if op.state == "committed"}
        super().__init__(run, _carry_out_nothing, Lanes(run, WGenerations()),
                         committed=committed)
        self.locations: dict[str, str] = {}

    def report(self) -> dict[str, object]:
        """Replay until the frontier, a divergence or the workflow's end."""
        divergence: dict[str, object] | None = None
        try:
            self.replay_once()
        except Diverged as exc:
            divergence = exc.report
        except _Frontier:
            pass
        except CairnError as exc:  # the new source raised, or its worker died
            divergence = {
                "op_id": "-",
                "field": "workflow",
                "expected": "the committed calls",
                "actual": exc.message,
            }
        return {
            "checked": len(self.locations),
            "committed": len(self.committed),
            "divergence": divergence,
            "locations": self.locations,
        }

    # --- what differs from a resume -------------------------------------------------

    def check_manifest(self, call: CallRequest) -> ReviewedSite:
        return {}  # checked with the identity, after it (a divergence names its op)

    def check_identity(self, op: OpRow, call: CallRequest, predecessor: str | None) -> None:
        for field, expected, actual in (
            ("kind", op.kind, call.kind),
            ("request", op.request, call.request),
            ("predecessor", op.predecessor, predecessor),
        ):
            if expected != actual:
                raise Diverged(
                    {"op_id": op.op_id, "field": field, "expected": expected, "actual": actual}
                )
        try:
            super().check_manifest(call)
        except Nondeterminism:
            raise Diverged(
                {
                    "op_id": op.op_id,
                    "field": "manifest",
                    "expected": "a reviewed call site",
                    "actual": call.location,
                }
            ) from None
        self.locations[op.op_id] = call.location

    def answer(
        self, call: CallRequest, predecessor: str | None
    ) -> tuple[JSONObject, str, bool]:
        """A fork whose lanes still run is answered as forked (its lanes' committed calls
        are checked too); any other uncommitted call is the frontier."""
        op = self.ops.get((call.scope, call.seq))
        if op is None or op.kind not in FORK_KINDS:
            raise _Frontier(f"{call.scope}-{call.seq}")
        self.check_identity(op, call, predecessor)
        return {"forked": True, "lanes": list(json_list(op.request["lanes"]))}, op.op_id, False

    def join(self, join: JoinRequest) -> tuple[JSONObject, str, bool]:
        op = self.committed.get((join.scope, join.seq))
        if op is None:
            raise _Frontier(f"{join.scope}-{join.seq}")
        try:
            return super().join(join)  # compares every lane's outcome with the journal's
        except Diverged:
            raise
        except Nondeterminism as exc:
            raise Diverged(
                {"op_id": op.op_id, "field": "lanes", "expected": "the journal's outcomes",
                 "actual": exc.message}
            ) from None


def _carry_out_nothing(op: OpRow, call: CallRequest) -> tuple[JSONObject, bool]:
    """A check carries nothing out: the first call not committed is the frontier."""
    raise _Frontier(op.op_id)


def serve_pending(journal: Journal, run_id: str) -> int:
    """Answer every upgrade check of the run that has no report yet; how many."""
    events = journal.events(run_id, limit=100_000)
    done = {e.data.get("check_id") for e in events if e.event == CHECKED}
    served = 0
    for event in events:
        if event.event != REQUESTED or event.data["check_id"] in done:
            continue
        try:
            report = UpgradeCheck(run_id, json_str(event.data["source"])).report()
        except CairnError as exc:
            report = {"error": exc.message}
        journal.append_event(run_id, CHECKED, {"check_id": event.data["check_id"], **report})
        served += 1
    return served


def main(run_id: str) -> int:
    """Serve the run's pending checks (``python -m cairn.coordinator.upgradecheck RUN``)."""
    with Journal(paths.journal_path()) as journal:
        return serve_pending(journal, run_id)


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
