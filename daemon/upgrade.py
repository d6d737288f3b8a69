"""`cairn upgrade RUN --to FILE [--dry-run]`: move a waiting or blocked run to new source.

The dry run re-executes the new source against the run's journal, comparing each call's
identity with the one recorded: it reports the first divergence, or that the new source
reproduces every committed operation. Only then may the run move, and the move is
recorded in the journal. cairnd never runs workflow source (ARCHITECTURE §2): it records
the request in the journal and has the broker start the run's coordinator, whose control
worker does the dry run (:mod:`cairn.coordinator.upgradecheck`); cairnd reads the report.
"""

from __future__ import annotations

import time
import uuid

from cairn.daemon import attest
from cairn.daemon.reconcile import restart_coordinator
from cairn.daemon.views import visible_run
from cairn.errors import CairnError, PermissionDenied, Unavailable, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import UpgradeRequest
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.run_replies import UpgradeReply
from cairn.workflow.review import review_source

# The coordinator's event names (cairn.coordinator.upgradecheck; cairnd does not import it).
REQUESTED = "upgrade-check-requested"
CHECKED = "upgrade-checked"
CHECK_TIMEOUT = 120.0
UPGRADABLE_STATES = ("waiting", "blocked")


def upgrade(journal: Journal, request: UpgradeRequest, uid: int) -> JSONObject:
    """Check the run against the new source, and unless a dry run, move it:
    :class:`UpgradeReply` as cairnd sends it (``upgraded`` only when it moved)."""
    run = visible_run(journal, request.run_id, uid)
    if request.source is None:
        raise UsageError("no new source given", hint="cairn upgrade RUN --to FILE.py")
    desc = journal.launch_description(run.run_id)
    review = review_source(request.source, filename=desc.source_filename)
    if run.state not in UPGRADABLE_STATES:
        raise UsageError(
            f"run {run.run_id} is {run.state}; only a waiting or blocked run is upgraded",
            hint=f"wait until it waits or is blocked ('cairn show {run.run_id}')",
        )
    report = UpgradeReply.model_validate({
        **dry_run(journal, run.run_id, request.source),
        "run_id": run.run_id,
        "from_hash": desc.review_hash,
        "to_hash": review.review_hash,
    })
    if request.dry_run:
        return report.model_dump(mode="json", exclude_unset=True)
    if report.divergence is not None:
        raise UsageError(
            f"the new source diverges at {report.divergence.op_id}; the run stays on "
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
    wait_dormant(journal, run.run_id)
    journal.upgrade_source(
        run.run_id, new, locations=report.locations, actor_uid=uid, old_hash=desc.review_hash
    )
    # Root acts on the description it pinned: the owner attests the new one, and the
    # broker re-pins it only if nothing but the source changed.
    attest.start_attested(new)
    upgraded = report.model_copy(update={"upgraded": True})
    return upgraded.model_dump(mode="json", exclude_unset=True)


def wait_dormant(journal: Journal, run_id: str, *, timeout: float = CHECK_TIMEOUT) -> None:
    """Wait until the coordinator started for the dry run let go of the run (a waiting
    run's replays to its question and suspends again); upgrade_source re-checks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = journal.get_run(run_id)
        if not run.lease_holder or run.lease_expires <= time.time():
            return
        time.sleep(0.1)


def dry_run(journal: Journal, run_id: str, source: str, *, timeout: float = CHECK_TIMEOUT
            ) -> JSONObject:
    """Have the run's coordinator replay the journal's committed calls against ``source``
    (nothing of the run changes) and return its report."""
    check_id = uuid.uuid4().hex
    journal.append_event(run_id, REQUESTED, {"check_id": check_id, "source": source})
    try:
        restart_coordinator(journal, run_id)
    except CairnError as exc:
        raise Unavailable(f"the coordinator of {run_id} could not start for the dry run: "
                          f"{exc.message}") from exc
    deadline = time.monotonic() + timeout
    cursor = 0
    while time.monotonic() < deadline:
        for event in journal.events(run_id, after=cursor):
            cursor = event.cursor
            if event.event == CHECKED and event.data.get("check_id") == check_id:
                report = {k: v for k, v in event.data.items() if k != "check_id"}
                if "error" in report:
                    raise CairnError(f"the dry run of {run_id} failed: {report['error']}")
                return report
        time.sleep(0.1)
    raise Unavailable(
        f"the coordinator of {run_id} did not report the dry run within {timeout:.0f}s",
        hint=f"see 'journalctl -u cairn-coordinator@{run_id}'",
    )
