"""Notification hooks: executables in ``~/.config/cairn/notify.d/`` (the user's) and
``/etc/cairn/notify.d/`` (the host's), each run as a transient unit of the *user's own*
systemd manager (started over its D-Bus) with one
:class:`~cairn.protocol.notify.NotifyEvent` as JSON on stdin.

A hook runs with the user's rights, so only files the user (or, in the host directory,
root) controls are run: a hook is refused when it is a symbolic link, not a regular file,
owned by anyone else, or writable by its group or by others — and so is a directory with
those faults. Nothing here ever runs as root.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from cairn import paths
from cairn.errors import CairnError, UsageError
from cairn.fsutil import write_atomic
from cairn.protocol.notify import NotifyEvent
from cairn.systemd import Prop

log = logging.getLogger(__name__)

HOOK_TIMEOUT_SEC = 120
UNIT_PREFIX = "cairn-notify-"


class HookDir(BaseModel):
    """A directory of hooks and the one owner its files (and itself) must have."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    path: Path
    owner: int


class Refused(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True)

    path: Path
    reason: str


class Hooks(BaseModel):
    """The hooks to run, in order (user's first, then the host's; by name in each), and
    the files that were refused with why."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    run: list[Path]
    refused: list[Refused]


def user_config_dir(uid: int) -> Path:
    """``$XDG_CONFIG_HOME/cairn``, else ``~/.config/cairn`` of ``uid``."""
    config = os.environ.get("XDG_CONFIG_HOME")
    base = Path(config) if config else Path(pwd.getpwuid(uid).pw_dir) / ".config"
    return base / "cairn"


def hook_dirs(uid: int) -> list[HookDir]:
    """The user's ``notify.d`` (theirs) and the host's (root's)."""
    return [
        HookDir(path=user_config_dir(uid) / "notify.d", owner=uid),
        HookDir(path=paths.config_dir() / "notify.d", owner=0),
    ]


def unsafe(st: os.stat_result, owner: int, kind: str) -> str | None:
    """Why a file of ``kind`` with ``st`` (from ``lstat``) must not be trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link (put the file itself here)"
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if not wanted(st.st_mode):
        return f"not a {kind}"
    if st.st_uid != owner:
        return f"owned by uid {st.st_uid}, not {owner}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by its group or others (chmod go-w)"
    return None


def discover_hooks(dirs: Sequence[HookDir]) -> Hooks:
    """The safe hooks of ``dirs`` and the refused files. A missing directory has none;
    names starting with ``.`` or ending with ``~`` are ignored; a file without the
    owner's execute bit is refused."""
    run: list[Path] = []
    refused: list[Refused] = []
    for hook_dir in dirs:
        try:
            st = os.lstat(hook_dir.path)
        except FileNotFoundError:
            continue
        problem = unsafe(st, hook_dir.owner, "directory")
        try:
            names = sorted(os.listdir(hook_dir.path)) if problem is None else []
        except OSError as exc:
            problem = f"cannot be listed: {exc.strerror}"
        if problem is not None:
            refused.append(Refused(path=hook_dir.path, reason=problem))
            continue
        for name in names:
            if name.startswith(".") or name.endswith("~"):
                continue
            path = hook_dir.path / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed meanwhile
            problem = unsafe(st, hook_dir.owner, "regular file")
            if problem is None and not st.st_mode & stat.S_IXUSR:
                problem = "not executable (chmod u+x)"
            if problem is None:
                run.append(path)
            else:
                refused.append(Refused(path=path, reason=problem))
    return Hooks(run=run, refused=refused)


def hook_unit_properties(hook: Path, event: NotifyEvent) -> list[Prop]:
    """The transient unit of one hook in the user's manager: the event on stdin (passed
    over D-Bus, never in an argv other users could read), output to the user's journal,
    ended after :data:`HOOK_TIMEOUT_SEC`, collected when done."""
    return [
        ("Description", "s", f"Cairn notification hook {hook.name} ({event.event} {event.run_id})"),
        ("ExecStart", "a(sasb)", [(str(hook), [str(hook)], False)]),
        ("StandardInput", "s", "data"),
        ("StandardInputData", "ay", event.model_dump_json().encode()),
        ("StandardOutput", "s", "journal"),
        ("RuntimeMaxUSec", "t", HOOK_TIMEOUT_SEC * 1_000_000),
        ("CollectMode", "s", "inactive-or-failed"),
        ("Environment", "as", [f"CAIRN_NOTIFY_EVENT={event.event}", f"CAIRN_RUN={event.run_id}"]),
    ]


def hook_unit_name(event: NotifyEvent, index: int) -> str:
    return f"{UNIT_PREFIX}{event.cursor}-{index}-{secrets.token_hex(3)}.service"


StartUnit = Callable[[str, list[Prop]], None]
"""Start a transient service (name, properties) in the caller's own user manager."""


def run_hooks(
    event: NotifyEvent, hooks: Sequence[Path], start: StartUnit, *, euid: int | None = None
) -> list[str]:
    """Start every hook for ``event`` through ``start`` (the caller's own user manager);
    the unit names started. Refused outright as root: a user's hook never runs with
    root's rights."""
    if (os.geteuid() if euid is None else euid) == 0:
        raise UsageError(
            "notification hooks never run as root",
            hint="run 'cairn notify follow' as the user, from the user unit cairn-notify.service",
        )
    units = []
    for index, hook in enumerate(hooks):
        unit = hook_unit_name(event, index)
        start(unit, hook_unit_properties(hook, event))
        units.append(unit)
    return units


def deliver(event: NotifyEvent, dirs: Sequence[HookDir], start: StartUnit) -> list[str]:
    """Run the hooks of ``dirs`` (found again for every event, so a new hook counts at
    once) for ``event``; refused files and hooks that could not be started are logged,
    never fatal. The unit names started."""
    hooks = discover_hooks(dirs)
    for refused in hooks.refused:
        log.warning("notification hook %s refused: %s", refused.path, refused.reason)
    started = []
    for hook in hooks.run:
        try:
            started += run_hooks(event, [hook], start)
        except UsageError:
            raise
        except (CairnError, OSError) as exc:
            log.warning("notification hook %s not started: %s", hook, exc)
    return started


def cursor_path(uid: int) -> Path:
    """Where the notifier keeps the last cursor it handled: ``$XDG_STATE_HOME/cairn``,
    else ``~/.local/state/cairn``."""
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state) if state else Path(pwd.getpwuid(uid).pw_dir) / ".local" / "state"
    return base / "cairn" / "notify-cursor"


def load_cursor(path: Path) -> int | None:
    """The saved cursor, None when there is none (or it is not a number)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def save_cursor(path: Path, cursor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, f"{cursor}\n")
