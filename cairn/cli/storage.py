"""``cairn storage``: storage pools. The work is in :mod:`cairn.storage_init`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from cairn import paths
from cairn.cli.client import fail

storage_app = typer.Typer(help="Storage pools.", no_args_is_help=True)


@storage_app.command("init")
def storage_init(
    loop: Annotated[str, typer.Option(help="Size of a loop-image pool, e.g. 8G.")],
    image: Annotated[Path, typer.Option(help="Where the image lives.")] = Path(
        "/var/lib/cairn/pool.img"
    ),
) -> None:
    """Create a loop-image Btrfs pool at /var/lib/cairn/pool (root; hosts without Btrfs)."""
    # Not a cycle: cairn.storage needs btrfsutil, which only this command uses. 'cairn
    # --help', every other command and the man-page build (packaging/prebuild.sh) run
    # without python3-btrfsutil.
    from cairn.storage_init import init_loop_storage

    if os.geteuid() != 0:
        fail("storage init needs root", hint="run it with sudo", code=2)
    mountpoint = paths.pool_dir()
    _pool, unit = init_loop_storage(image, loop, mountpoint)
    typer.echo(f"pool {mountpoint}: Btrfs on {image} ({loop}); mounted at boot by {unit}")
