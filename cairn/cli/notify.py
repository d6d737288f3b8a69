"""``cairn notify``: run the caller's notification hooks (:mod:`cairn.notify`) when their
runs start waiting for a person, are blocked, fail or succeed. ``follow`` is what the user unit
``cairn-notify.service`` runs; ``list`` shows which hooks would run and which are
refused; ``test`` sends a sample event to them."""


import os
import time
from typing import TYPE_CHECKING

import click

from cairn.cli.client import emit, request
from cairn.cli.options import CairnGroup, json_flag
from cairn.cli.timers import user_manager_env
from cairn.errors import CairnError
from cairn.terminal import printable

if TYPE_CHECKING:
    from cairn.protocol.notify import NotifyBatch
    from cairn.systemd import Prop, Systemd

NAME_HAS_NO_OWNER = "org.freedesktop.DBus.Error.NameHasNoOwner"
# After login the user's bus can be up a few seconds before the manager has joined it.
MANAGER_JOIN_SEC = 30.0

notify_app = CairnGroup(
    "notify",
    help="Notification hooks (~/.config/cairn/notify.d, /etc/cairn/notify.d).",
    no_args_is_help=True,
)


def connect_user_manager(bus: str, wait: float) -> "Systemd":
    """The user's manager over the user's bus, which can be up before the manager has
    joined it: asked again for ``wait`` seconds while no one owns the manager's name."""
    # here, not at the top: every cairn command would pay for this import
    from cairn.systemd import DBusCallFailed, Systemd

    deadline = time.monotonic() + wait
    while True:
        try:
            return Systemd(bus)
        except DBusCallFailed as exc:
            if exc.dbus_name != NAME_HAS_NO_OWNER or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)


def start_user_unit(name: str, props: "list[Prop]") -> None:
    """Start transient service ``name`` in the caller's own manager, over its bus, and
    wait for its start job, so a hook that could not start is reported, not lost."""
    bus = user_manager_env()["DBUS_SESSION_BUS_ADDRESS"]
    with connect_user_manager(bus, MANAGER_JOIN_SEC) as manager:
        manager.wait_started(manager.start_transient_service(name, props), timeout=30)


def _poll(cursor: int) -> "NotifyBatch":
    # here, not at the top: every cairn command would pay for this import
    from cairn.protocol.daemon import NotificationsRequest
    from cairn.protocol.notify import NotifyBatch

    return NotifyBatch.model_validate(request(NotificationsRequest(cursor=cursor)))


@notify_app.command()
@click.option("--interval", type=float, help="Seconds between polls.", default=2.0)
@click.option("--once", help="Handle what is new, then exit.", is_flag=True)
def follow(interval: float = 2.0, once: bool = False) -> None:
    """Run your hooks for each of your runs that waits for you, fails or succeeds.

    Example: cairn notify follow --once
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.notify import cursor_path, deliver, hook_dirs, load_cursor, save_cursor

    uid = os.getuid()
    state = cursor_path(uid)
    cursor = load_cursor(state)
    if cursor is None:  # first start: from now on, not the whole history
        cursor = _poll(-1).cursor
        save_cursor(state, cursor)
    while True:
        try:
            batch = _poll(cursor)
        except CairnError as exc:
            click.echo(f"cairn notify: {printable(exc.message)}", err=True)
            if once:
                raise click.exceptions.Exit(1) from None
            time.sleep(interval)
            continue
        for event in batch.events:
            units = deliver(event, hook_dirs(uid), start_user_unit)
            click.echo(f"{event.event} {event.run_id}: {len(units)} hooks started")
            save_cursor(state, event.cursor)
        if batch.cursor != cursor:
            cursor = batch.cursor
            save_cursor(state, cursor)
        if once and not batch.more:
            return
        if not batch.more:
            time.sleep(interval)


@notify_app.command("list")
@json_flag
def list_hooks(json_out: bool = False) -> None:
    """The hooks that would run, in order, and the files refused with why.

    Example: cairn notify list
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.notify import discover_hooks, hook_dirs

    hooks = discover_hooks(hook_dirs(os.getuid()))
    if json_out:
        emit({"run": [str(hook) for hook in hooks.run],
              "refused": [{"path": str(r.path), "reason": r.reason} for r in hooks.refused]})
        return
    for hook in hooks.run:
        click.echo(f"runs     {printable(hook)}")
    for refused in hooks.refused:
        click.echo(f"refused  {printable(refused.path)}: {printable(refused.reason)}")
    if not hooks.run and not hooks.refused:
        click.echo("no hooks (put executables in ~/.config/cairn/notify.d)")


@notify_app.command("test")
@click.option("--event", help="waiting, blocked, failed or succeeded.", default="succeeded")
def send_test_event(event: str = "succeeded") -> None:
    """Send a sample event (run ``flow_000…``) to every hook.

    Example: cairn notify test --event failed
    """
    # here, not at the top: every cairn command would pay for this import
    from cairn.notify import deliver, hook_dirs
    from cairn.protocol.notify import NotifyEvent

    if event not in ("waiting", "blocked", "failed", "succeeded"):
        click.echo("cairn: --event must be waiting, blocked, failed or succeeded", err=True)
        raise click.exceptions.Exit(2)
    sample = NotifyEvent.model_validate(
        {
            "event": event,
            "cursor": 1,
            "at": time.time(),
            "run_id": "flow_" + "0" * 32,
            "definition": "builtin:implement",
            "state": event,
            "summary": f"a test notification ({event})",
        }
    )
    units = deliver(sample, hook_dirs(os.getuid()), start_user_unit)
    for unit in units:
        click.echo(f"started {unit} (journalctl --user -u {unit})")
    if not units:
        click.echo("no hooks ran; see 'cairn notify list'")
