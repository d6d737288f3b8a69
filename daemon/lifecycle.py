"""cairnd's side of ``cairn storage df``, ``cairn rm`` and ``cairn prune``.

Which runs go is :mod:`cairn.retention`'s decision; the deletion is the broker's
``delete-v1`` (it re-checks that the run is finished and settled). Journal rows and
receipts stay, so ``cairn show`` still tells a deleted run's history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypedDict

from cairn import paths, retention, storage
from cairn.daemon.oneshot import carry_out_one
from cairn.daemon.views import is_admin, visible_run
from cairn.errors import CairnError, PermissionDenied, UsageError
from cairn.journal.readwrite import Journal
from cairn.journal.rows import TERMINAL_RUN_STATES, RunRow
from cairn.protocol.broker import Intent, RunDeleted
from cairn.protocol.daemon import PruneRequest, RmRequest, StorageDfRequest
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.replies import (
    PoolSpace,
    PrunedRun,
    PruneFailure,
    PruneReply,
    PruneRule,
    PruneVerdict,
    RmReply,
    RunStorage,
    StorageDfReply,
)
from cairn.views.run import storage_status

DELETE_INTENT = "delete-run"
ALL_RUNS = 1_000_000


def facts(journal: Journal, run: RunRow) -> retention.RunFacts:
    """What retention needs of ``run``: its state, whether it ever asked for storage,
    whether that is gone, and whether a frozen proposal still waits for settlement."""
    intents = journal.intents(run.run_id)
    receipts = journal.receipts(run.run_id)
    return retention.RunFacts(
        run_id=run.run_id,
        owner_uid=run.owner_uid,
        state=run.state,
        finished_at=run.updated_at,
        has_storage=any(i.kind == "prepare-q" for i in intents),
        storage_deleted=storage_status(receipts)["deleted"],
        # a freeze the broker did not carry out (the pool was full) froze nothing
        proposal_frozen=any(r["kind"] == "freeze-proposal" for r in receipts),
        settled=run.settlement is not None,
    )


class StorageDeleted(TypedDict):
    """What :func:`delete_storage` deleted: the fields :class:`RmReply` shares."""

    subvolumes: int
    reclaim_pending: int
    free_bytes: int | None


def delete_storage(journal: Journal, run_id: str, uid: int) -> StorageDeleted:
    """Have the broker delete the run's subvolumes (it waits, bounded, for Btrfs to return
    their space); how many it deleted, how many still wait for the cleaner, and the pool's
    free bytes then."""
    intent = Intent(intent_id=DELETE_INTENT, run_id=run_id, kind="delete-run")
    done = carry_out_one(journal, intent, "delete-v1", timeout=600).body(RunDeleted)
    deleted = len(done.deleted)
    journal.append_event(run_id, "storage-deleted", {"subvolumes": deleted, "by_uid": uid})
    return {"subvolumes": deleted, "reclaim_pending": done.reclaim_pending or 0,
            "free_bytes": _free_bytes()}


def _free_bytes() -> int | None:
    """The pool's free bytes now, or None when the pool cannot be opened."""
    try:
        return storage.Pool.open(paths.pool_dir()).free_bytes()
    except (CairnError, OSError):
        return None


def df(journal: Journal, request: StorageDfRequest, uid: int) -> dict[str, Any]:
    """The pool's space and every run (of the caller's) that holds storage,
    :class:`StorageDfReply`."""
    policy = retention.load_policy()
    pool = storage.Pool.open(paths.pool_dir())
    usage = retention.pool_usage(pool, policy.reserve_bytes)
    owner = None if (request.all_users and is_admin(uid)) else uid
    runs = []
    for run in journal.list_runs(owner, limit=ALL_RUNS):
        known = facts(journal, run)
        if not known.has_storage or known.storage_deleted:
            continue
        runs.append(
            RunStorage(
                run_id=run.run_id,
                owner_uid=run.owner_uid,
                state=run.state,
                finished_at=run.updated_at,
                exclusive=retention.run_exclusive_bytes(pool, run.run_id),
                held=retention.held_because(known),
            )
        )
    return StorageDfReply(pool=PoolSpace.model_validate(vars(usage)),
                          runs=runs).model_dump(mode="json")


def rm(journal: Journal, request: RmRequest, uid: int) -> JSONObject:
    """Delete the storage of the caller's own finished, settled run (``dry_run``: only
    check that it may go), :class:`RmReply`. Another user's run, or one that must stay,
    is refused."""
    run = visible_run(journal, request.run_id, uid)
    if run.owner_uid != uid:
        raise PermissionDenied(
            f"run {run.run_id} is not yours; only its owner deletes it",
            hint="an administrator deletes by the host policy: 'cairn prune' as root",
        )
    known = facts(journal, run)
    held = retention.held_because(known)
    if held is not None:
        if run.state in TERMINAL_RUN_STATES:  # finished, its proposal not settled
            hint = f"'cairn show {run.run_id}' shows where its settlement stopped"
        else:
            hint = f"wait for it to end or stop it ('cairn stop {run.run_id}'), then rm it"
        raise UsageError(f"run {run.run_id} is kept: {held}", hint=hint)
    gone = known.storage_deleted or not known.has_storage
    deleted: StorageDeleted = {"subvolumes": 0, "reclaim_pending": 0, "free_bytes": None}
    if not gone and not request.dry_run:
        deleted = delete_storage(journal, run.run_id, uid)
    return RmReply(run_id=run.run_id, already_gone=gone, **deleted).model_dump(mode="json")


def prune(
    journal: Journal, request: PruneRequest, uid: int, *, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """Delete finished runs' storage by the rule given, or (none given) by the host
    policy, :class:`PruneReply`. Root prunes every user's runs (keeping each user's
    newest), anyone else only their own."""
    if request.older_than is None and request.keep is None:
        rule = retention.load_policy().rule()
    else:
        rule = retention.Rule(older_than=request.older_than, keep=request.keep)
    owner = None if uid == 0 else uid
    runs = [facts(journal, run) for run in journal.list_runs(owner, limit=ALL_RUNS)]
    verdicts = retention.select(runs, rule, clock())
    going = [v for v in verdicts if v.delete]
    deleted: list[PrunedRun] = []
    failed: list[PruneFailure] = []
    reclaim_pending: int = 0
    free_bytes: int | None = None  # nothing deleted: not asked
    for verdict in [] if request.dry_run else going:
        try:
            done = delete_storage(journal, verdict.run_id, uid)
        except CairnError as exc:  # one run's refusal does not stop the others
            failed.append(PruneFailure(run_id=verdict.run_id, error=exc.message))
            continue
        deleted.append(PrunedRun(run_id=verdict.run_id, subvolumes=done["subvolumes"]))
        # each delete waits for the cleaner, so the last one speaks for the pool
        reclaim_pending, free_bytes = done["reclaim_pending"], done["free_bytes"]
    return PruneReply(
        dry_run=request.dry_run,
        rule=PruneRule(older_than=rule.older_than, keep=rule.keep),
        delete=[PruneVerdict(run_id=v.run_id, reason=v.reason) for v in going],
        kept=[PruneVerdict(run_id=v.run_id, reason=v.reason) for v in verdicts if not v.delete],
        deleted=deleted,
        failed=failed,
        reclaim_pending=reclaim_pending,
        free_bytes=free_bytes,
    ).model_dump(mode="json")
