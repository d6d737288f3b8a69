"""`cairn replay SOURCE --through OP`: a new run from a root boundary of a finished run.

The new run keeps the source's frozen definition (source, review hash, arguments,
project, scripted profiles, limits, apply mode) and takes everything else from the host's
configuration now. The operations :func:`cairn.replay.select_imports` picks are imported
into its journal, committed as they were, with their boundary evidence; its
``prepare-q`` has the broker remint the source's Q and checkpoints as the new run's own
snapshots (``broker/remint.py``, which checks all of it again), and its coordinator
makes the root W from the checkpoint of OP and runs the rest fresh.
"""

from __future__ import annotations

import logging
import secrets
import shutil
from typing import Any

from cairn import paths, retention
from cairn.daemon import attest
from cairn.daemon.launch import admit_or_queue, freeze
from cairn.daemon.views import visible_run
from cairn.errors import PermissionDenied, UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES, RunRow
from cairn.protocol.daemon import LaunchRequest
from cairn.protocol.launch import ReplayOrigin
from cairn.protocol.replies import QueuedReplayReply, ReplayReply
from cairn.replay import select_imports
from cairn.views.run import storage_status
from cairn.workflow.review import review_source

log = logging.getLogger(__name__)


def check_source(run: RunRow, uid: int, *, storage_deleted: bool) -> None:
    """The source must be the caller's own finished run whose storage still exists."""
    if run.owner_uid != uid:
        raise UsageError(
            f"run {run.run_id} is not yours; only its owner can replay it",
            hint="replay one of your own runs ('cairn ps' lists them)",
        )
    if run.state not in TERMINAL_RUN_STATES:
        raise UsageError(
            f"run {run.run_id} is {run.state}; only a finished or stopped run can be replayed",
            hint=f"wait for it to finish, or stop it with 'cairn stop {run.run_id}'",
        )
    if storage_deleted:
        raise UsageError(
            f"the storage of {run.run_id} was deleted (cairn rm); its checkpoints are gone",
            hint=f"launch the workflow again instead; 'cairn show {run.run_id}' keeps its history",
        )


def replay(
    journal: Journal, source_id: str | None, through: str | None, uid: int
) -> dict[str, Any]:
    """Record and start the replayed run; its ID, source and the imported operations,
    :class:`ReplayReply` (:class:`QueuedReplayReply` when it joined the queue)."""
    if not through:
        raise UsageError("no operation given", hint="e.g. cairn replay RUN --through root-3")
    source = visible_run(journal, source_id, uid)
    deleted = storage_status(journal.receipts(source.run_id))["deleted"]
    check_source(source, uid, storage_deleted=deleted)
    imported = select_imports(journal.list_ops(source.run_id), source.run_id, through)
    old = journal.launch_description(source.run_id)
    review = review_source(old.source, filename=old.source_filename)
    if review.review_hash != old.review_hash:
        raise PermissionDenied(
            f"the pinned source of {source.run_id} no longer reviews to its hash "
            f"({review.review_hash} != {old.review_hash}) on this host",
            hint="launch the workflow again instead",
        )
    request = LaunchRequest(
        definition=old.definition,
        args=old.args,
        project=old.project.root,
        scripted={n: p for n, p in old.profiles.items() if p.kind == "scripted"},
        limits=old.limits.model_dump(exclude_none=True, exclude={"daily_cost_cents"}),
        apply_mode=old.apply_mode,
    )
    origin = ReplayOrigin(
        source_run=source.run_id, through_op=through, ops=[o.op_id for o in imported]
    )
    desc = freeze(
        request,
        uid,
        "flow_" + secrets.token_hex(16),
        source=old.source,
        filename=old.source_filename,
        review=review,
        args=old.args,
        project=old.project,
        replay=origin,
    )
    attest.require_channel()  # an unattested replay is refused before the run exists
    retention.admit("replay")  # a full pool refuses the replay before the run exists
    copy_evidence(source.run_id, desc.run_id, origin.ops)
    admitted = admit_or_queue(journal, desc, imported=imported)
    reply = ReplayReply(
        run_id=desc.run_id,
        source_run=source.run_id,
        through=through,
        imported=origin.ops,
        review_hash=desc.review_hash,
        launch_hash=desc.launch_hash(),
        state=admitted["state"],
    )
    # a run that joined the queue has its position; no key is added or dropped
    if "position" in admitted:
        reply = QueuedReplayReply(**dict(reply), position=admitted["position"])
    return reply.model_dump(mode="json")


def copy_evidence(source_id: str, run_id: str, op_ids: list[str]) -> None:
    """The imported boundaries' files (``boundary.json``, handoff, result, transcript),
    which later agents of the new run get as their incoming evidence. Written by the
    source's coordinator as this user; links are copied as links, never followed."""
    source_dir, target_dir = paths.run_state_dir(source_id), paths.run_state_dir(run_id)
    for op_id in op_ids:
        boundary = source_dir / "boundaries" / op_id
        if boundary.is_dir() and not boundary.is_symlink():
            shutil.copytree(boundary, target_dir / "boundaries" / op_id, symlinks=True)
