"""`cairn upgrade RUN --to FILE [--dry-run]`: move a waiting or blocked run to new source.

The dry run re-executes the new source in a control worker and answers every call from
the run's journal, comparing each call's identity with the one recorded: it reports the
first divergence, or that the new source reproduces every committed operation. Only then
may the run move, and the move is recorded in the journal.
"""

from __future__ import annotations

from typing import Any

from cairn.daemon import attest
from cairn.daemon.views import visible_run
from cairn.errors import PermissionDenied, UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import OpRow
from cairn.operations import OperationKind
from cairn.proc import make_env
from cairn.protocol.control import (
    CallRequest,
    CallResult,
    StartWorkflow,
    UnknownWorkerMessage,
    WorkflowFailure,
    parse_worker_message,
)
from cairn.protocol.daemon import UpgradeRequest
from cairn.workflow import runtime
from cairn.workflow.review import Review, review_source


def upgrade(journal: Journal, request: UpgradeRequest, uid: int) -> dict[str, Any]:
    run = visible_run(journal, request.run_id, uid)
    if request.source is None:
        raise UsageError("no new source given", hint="cairn upgrade RUN --to FILE.py")
    desc = journal.launch_description(run.run_id)
    review = review_source(request.source, filename=desc.source_filename)
    report = dry_run(journal, run.run_id, request.source, desc.source_filename, desc.args, review)
    report.update(run_id=run.run_id, from_hash=desc.review_hash, to_hash=review.review_hash)
    if request.dry_run:
        return report
    if report["divergence"] is not None:
        raise UsageError(
            f"the new source diverges at {report['divergence']['op_id']}; the run stays on "
            "its source",
            hint=f"see 'cairn upgrade {run.run_id} --to FILE --dry-run'",
        )
    if request.confirm != review.review_hash:
        raise PermissionDenied(
            f"the new source is not confirmed: its review hash is {review.review_hash}",
            hint=f"repeat with --confirm {review.review_hash}",
        )
    attest.require_channel()  # the move needs the owner's word before the journal changes
    missing = sorted({a.profile for a in review.agents.values()} - set(desc.profiles))
    if missing:
        raise UsageError(f"the new source needs profiles the run never resolved: {missing}")
    new = desc.model_copy(
        update={
            "source": request.source,
            "review_hash": review.review_hash,
            "review": review.model_dump(mode="json"),
        }
    )
    journal.upgrade_source(
        run.run_id, new, locations=report["locations"], actor_uid=uid, old_hash=desc.review_hash
    )
    # Root acts on the description it pinned: the owner attests the new one, and the
    # broker re-pins it only if nothing but the source changed.
    attest.start_attested(new)
    report["upgraded"] = True
    return report


def dry_run(
    journal: Journal,
    run_id: str,
    source: str,
    filename: str,
    args: dict[str, Any],
    review: Review,
) -> dict[str, Any]:
    """Replay the journal's committed calls against ``source`` without touching the run."""
    committed = {(o.scope, o.seq): o for o in journal.list_ops(run_id) if o.state == "committed"}
    sites = {(c.kind, c.line, c.descriptor) for c in review.calls}
    locations: dict[str, str] = {}
    previous: dict[str, str | None] = {}
    divergence: dict[str, Any] | None = None
    worker = runtime.spawn(make_env())
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.write(
            StartWorkflow(source=source, filename=filename, args=args).model_dump_json() + "\n"
        )
        worker.stdin.flush()
        while True:
            line = worker.stdout.readline()
            if not line:
                break
            try:
                message = parse_worker_message(line)
            except UnknownWorkerMessage:
                break
            match message:
                case CallRequest():
                    call = message
                case WorkflowFailure(kind=kind, error=error):
                    divergence = {
                        "op_id": "-",
                        "field": "workflow",
                        "expected": "the committed calls",
                        "actual": f"{kind}: {error}",
                    }
                    break
                case _:  # the workflow returned or forked: nothing more to compare
                    break
            op = committed.get((call.scope, call.seq))
            if op is None:
                break  # the frontier: everything after it runs fresh on the new source
            divergence = compare(op, call, previous.get(call.scope), sites)
            if divergence is not None:
                break
            locations[op.op_id] = call.location
            previous[call.scope] = op.op_id
            assert op.result is not None
            worker.stdin.write(CallResult(seq=call.seq, value=op.result).model_dump_json() + "\n")
            worker.stdin.flush()
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    return {
        "checked": len(locations),
        "committed": len(committed),
        "divergence": divergence,
        "locations": locations,
    }


def compare(
    op: OpRow,
    call: CallRequest,
    predecessor: str | None,
    sites: set[tuple[OperationKind, int, str | None]],
) -> dict[str, Any] | None:
    line = int(call.location.rsplit(":", 2)[1])
    checks = (
        ("kind", op.kind, call.kind),
        ("request", op.request, call.request),
        ("predecessor", op.predecessor, predecessor),
    )
    for field, expected, actual in checks:
        if expected != actual:
            return {"op_id": op.op_id, "field": field, "expected": expected, "actual": actual}
    if (call.kind, line, call.request.get("descriptor")) not in sites:
        return {
            "op_id": op.op_id,
            "field": "manifest",
            "expected": "a reviewed call site",
            "actual": call.location,
        }
    return None
