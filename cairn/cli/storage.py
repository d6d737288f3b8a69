"""``cairn storage`` (storage pools: ``init``, ``df``), the top-level ``cairn rm`` and
``cairn prune``, which delete finished runs' storage, and ``cairn checkpoints``, which
lists a run's snapshots. Making a pool is
:mod:`cairn.storage_init`; what goes is decided by cairnd (``daemon/lifecycle.py``)."""


import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cairn import paths
from cairn.cli.client import emit, fail, request, typed
from cairn.cli.options import (
    CairnGroup,
    add_commands,
    argument,
    asks,
    check_run_ref,
    confirm_or_stop,
    dry_run_flag,
    echo,
    human_size,
    json_flag,
    run_argument,
    yes_flag,
)
from cairn.protocol.requestchecks import RUN_REF_HELP
from cairn.sizes import parse_age

if TYPE_CHECKING:
    from cairn.protocol.replies import PruneReply, RmReply

storage_app = CairnGroup("storage", help="Storage pools.", no_args_is_help=True)


def register(app: click.Group) -> None:
    """Add ``rm``, ``prune`` and ``checkpoints`` to ``app`` (the main ``cairn`` app)."""
    add_commands(app, rm, prune, checkpoints)


@storage_app.command("init")
@click.option("--loop", help="Size of a loop-image pool, e.g. 8G.", required=True)
@click.option(
    "--image",
    type=click.Path(path_type=Path),
    help="Where the image lives.",
    default=Path(
        "/var/lib/cairn/pool.img"
        ),
)
def storage_init(
    loop: str,
    image: Path = Path(
        "/var/lib/cairn/pool.img"
    ),
) -> None:
    """Create a loop-image Btrfs pool at /var/lib/cairn/pool (root; hosts without Btrfs).

    Example: sudo cairn storage init --loop 8G
    """
    # Not a cycle: cairn.storage needs btrfsutil, which only this command uses. 'cairn
    # --help', every other command and the man-page build (packaging/prebuild.sh) run
    # without python3-btrfsutil.
    from cairn.storage_init import init_loop_storage

    if os.geteuid() != 0:
        fail("storage init needs root", hint="run it with sudo", code=2)
    mountpoint = paths.pool_dir()
    _pool, unit = init_loop_storage(image, loop, mountpoint)
    echo(f"pool {mountpoint}: Btrfs on {image} ({loop}); mounted at boot by {unit}")


def _ago(ts: float | None) -> str:
    if ts is None:  # a time cairnd did not record
        return "-"
    seconds = int(time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


@storage_app.command("df")
@click.option("--all", "all_users", help="All users' runs (cairn-admin).", is_flag=True)
@json_flag
def storage_df(all_users: bool = False, json_out: bool = False) -> None:
    """Pool size, used, free and reserve; per run with storage: its exclusive bytes (only
    where the host has Btrfs quotas on; otherwise unknown).

    Example: cairn storage df
    """
    from cairn.protocol.daemon import StorageDfRequest
    from cairn.protocol.replies import StorageDfReply

    sent = request(StorageDfRequest(all_users=all_users))
    if json_out:
        emit(sent)
        return
    data = typed(StorageDfReply, sent)
    pool = data.pool
    echo(
        f"pool {pool.root}: size {human_size(pool.size)}, "
        f"used {human_size(pool.used)}, free {human_size(pool.free)}, "
        f"reserve {human_size(pool.reserve)}"
    )
    if not pool.quotas:
        echo("exclusive bytes per run: unknown (Btrfs quotas are off on this pool)")
    if not data.runs:
        echo("no runs hold storage")
        return
    echo(f"{'RUN':<38} {'STATE':<10} {'UPDATED':<10} {'EXCLUSIVE':<11} KEPT BECAUSE")
    for run in data.runs:
        echo(
            f"{run.run_id:<38} {run.state:<10} {_ago(run.finished_at):<10} "
            f"{human_size(run.exclusive):<11} {run.held or '-'}"
        )


@argument("run_ids", metavar="RUN...", help=RUN_REF_HELP, nargs=-1, required=True)
@dry_run_flag
@yes_flag
@json_flag
def rm(
    run_ids: tuple[str, ...],
    dry_run: bool = False,
    yes: bool = False,
    json_out: bool = False,
) -> None:
    """Delete finished runs' storage (Q, W, checkpoints, P, C, F); their journal rows and
    receipts stay, so 'cairn show' still tells their history.

    Example: cairn rm 3fa9 7b21
    """
    from cairn.protocol.daemon import RmRequest
    from cairn.protocol.replies import RmReply

    for ref in run_ids:
        check_run_ref(ref)
    # without a terminal and without --yes, refused before anything
    ask = False if dry_run else asks(yes)
    # Every run is checked before any is deleted: one that must stay deletes none. What a
    # reference resolved to then is what goes (a prefix is not resolved twice).
    sent = [request(RmRequest(run_id=ref, dry_run=True)) for ref in run_ids]
    checked = [typed(RmReply, run) for run in sent]
    going = [run.run_id for run in checked if not run.already_gone]
    if dry_run:
        if json_out:
            emit(sent)
            return
        for run in checked:
            echo(f"{run.run_id}: storage already gone" if run.already_gone
                 else f"would delete {run.run_id} (its history stays)")
        return
    if going and ask:
        confirm_or_stop(
            f"Delete the storage of {len(going)} run(s): {', '.join(going)}? Their history "
            "stays; 'cairn revert' no longer works for them.",
            yes=yes,
        )
    sent = [request(RmRequest(run_id=run.run_id)) for run in checked]
    if json_out:
        emit(sent)
        return
    done = [typed(RmReply, run) for run in sent]
    for run in done:
        if run.already_gone:
            echo(f"{run.run_id}: storage already gone")
        else:
            echo(f"deleted {run.run_id} ({run.subvolumes} subvolumes)")
    deleted = [run for run in done if not run.already_gone]
    if deleted:
        _print_space(deleted[-1])


def _print_space(data: "RmReply | PruneReply") -> None:
    """What a delete left: the pool's free space, and whether Btrfs still returns some."""
    free = data.free_bytes
    pending = data.reclaim_pending
    shown = "" if free is None else f"{free >> 20} MiB free"
    if pending:
        echo(f"Btrfs is still reclaiming the space of {pending} deleted subvolume(s)"
             + (f"; {shown} so far" if shown else "")
             + "; 'cairn storage df' shows it return")
    elif shown:
        echo(f"space reclaimed: the pool has {shown}")


@click.option("--older-than", help="Delete runs that finished longer ago: 14d, 12h, 2w.")
@click.option(
    "--keep",
    type=click.IntRange(0, None),
    help="Keep each user's newest N finished runs.",
)
@click.option("--dry-run", help="Only print what would be deleted.", is_flag=True)
@yes_flag
@json_flag
def prune(
    older_than: str | None = None,
    keep: int | None = None,
    dry_run: bool = False,
    yes: bool = False,
    json_out: bool = False,
) -> None:
    """Delete finished runs' storage by rule; without --older-than or --keep, by the host
    policy (/etc/cairn/storage.toml). Running, waiting, blocked and unsettled runs stay.

    Example: cairn prune --older-than 14d --dry-run
    """
    from cairn.protocol.daemon import PruneRequest
    from cairn.protocol.replies import PruneReply

    age = None if older_than is None else parse_age(older_than)
    if not dry_run and asks(yes):
        preview = typed(PruneReply, request(PruneRequest(older_than=age, keep=keep,
                                                         dry_run=True)))
        count = len(preview.delete)
        whose = " of every user" if os.geteuid() == 0 else ""
        if count:
            confirm_or_stop(
                f"Delete the storage of {count} finished run(s){whose}? 'cairn prune "
                "--dry-run' lists them; their history stays.",
                yes=yes,
            )
    sent = request(PruneRequest(older_than=age, keep=keep, dry_run=dry_run))
    data = typed(PruneReply, sent)
    if json_out:
        emit(sent)
    else:
        _print_prune(data)
    if data.failed:
        raise click.exceptions.Exit(1)


def _print_prune(data: "PruneReply") -> None:
    rule = data.rule
    if rule.older_than is None and rule.keep is None:
        echo("the rule deletes nothing (no keep_days or keep_per_user)")
    if data.dry_run:
        for run in data.delete:
            echo(f"would delete {run.run_id}: {run.reason}")
    for gone in data.deleted:
        echo(f"deleted {gone.run_id} ({gone.subvolumes} subvolumes)")
    for failed in data.failed:
        echo(f"not deleted {failed.run_id}: {failed.error}")
    echo(f"{len(data.kept)} run(s) with storage kept")
    if data.deleted:
        _print_space(data)


@run_argument
@json_flag
def checkpoints(run_id: str, json_out: bool = False) -> None:
    """Every checkpoint of a run: its operation, scope, when it was taken, its exclusive
    size (only where the host has Btrfs quotas on; otherwise unknown), and whether its
    storage was deleted.

    Example: cairn checkpoints @last
    """
    from cairn.protocol.daemon import CheckpointsRequest
    from cairn.protocol.replies import CheckpointsReply

    sent = request(CheckpointsRequest(run_id=run_id))
    if json_out:
        emit(sent)
        return
    data = typed(CheckpointsReply, sent)
    storage = data.storage
    if storage.deleted:
        echo(
            f"{data.run_id}: storage deleted {_ago(storage.deleted_at)}; "
            "the checkpoints below are the journal's record"
        )
    if not data.checkpoints:
        echo(f"{data.run_id}: no checkpoints")
        return
    echo(f"{'OPERATION':<12} {'KIND':<8} {'SCOPE':<10} {'TAKEN':<10} {'EXCLUSIVE':<11} PATH")
    for cp in data.checkpoints:
        size = "deleted" if cp.deleted else human_size(cp.exclusive)
        echo(
            f"{cp.op_id:<12} {cp.kind or '-':<8} {cp.scope or '-':<10} "
            f"{_ago(cp.at):<10} {size:<11} {cp.path}"
            + (" (reminted)" if cp.reminted else "")
        )
