"""The user's own systemd manager, as ``cairn schedule`` drives it: a schedule's timer
installed, checked and removed in ``~/.config/systemd/user`` exactly as cairnd renders it.
Runs as the user, never through cairnd."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping
from pathlib import Path

from cairn import userpaths
from cairn.fsutil import write_atomic
from cairn.proc import run

TIMER_FILE_RE_PREFIX = "cairn-schedule@"


def user_unit_dir() -> Path:
    """Where user unit files live and survive reboots: ``~/.config/systemd/user``."""
    return userpaths.config_home() / "systemd" / "user"


def timer_path(schedule_id: str) -> Path:
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    return user_unit_dir() / timer_name(schedule_id)


def _user_env() -> dict[str, str]:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return {
        "XDG_RUNTIME_DIR": runtime,
        "DBUS_SESSION_BUS_ADDRESS": os.environ.get(
            "DBUS_SESSION_BUS_ADDRESS", f"unix:path={runtime}/bus"
        ),
    }


def user_manager_env() -> dict[str, str]:
    """The environment that reaches the caller's own systemd manager."""
    return _user_env()


def systemctl_user(*args: str, check: bool = True) -> str:
    proc = run(["systemctl", "--user", *args], env=_user_env(), check=check, timeout=60)
    return proc.stdout.decode(errors="replace")


def install_timer(schedule_id: str, text: str) -> bool:
    """Make the user manager hold exactly ``text`` as the schedule's timer, enabled and
    started. Returns whether anything had to change."""
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    path = timer_path(schedule_id)
    changed = False
    current = path.read_text() if path.exists() else None
    if current != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        systemctl_user("daemon-reload")
        changed = True
    state = timer_state(schedule_id)
    if state.get("UnitFileState") != "enabled":
        systemctl_user("enable", timer_name(schedule_id))
        changed = True
    if state.get("ActiveState") != "active":
        systemctl_user("start", timer_name(schedule_id))
        changed = True
    elif current is not None and current != text:
        # A running timer keeps its old calendar until restarted.
        systemctl_user("restart", timer_name(schedule_id))
    return changed


def remove_timer(schedule_id: str) -> bool:
    """Stop, disable and delete the schedule's timer. Returns whether one existed."""
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    path = timer_path(schedule_id)
    existed = path.exists()
    if existed:
        systemctl_user("disable", "--now", timer_name(schedule_id), check=False)
        path.unlink()
        systemctl_user("daemon-reload")
    return existed


def timer_state(schedule_id: str) -> dict[str, str]:
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    out = systemctl_user(
        "show",
        "-p",
        "LoadState,ActiveState,UnitFileState,LastTriggerUSec,NextElapseUSecRealtime",
        timer_name(schedule_id),
        check=False,
    )
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def installed_timer_ids() -> list[str]:
    """Schedule IDs of every cairn timer file in the user's unit directory."""
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import SCHEDULE_ID_RE

    folder = user_unit_dir()
    if not folder.is_dir():
        return []
    ids = []
    for entry in folder.glob(f"{TIMER_FILE_RE_PREFIX}*.timer"):
        candidate = entry.name[len(TIMER_FILE_RE_PREFIX) : -len(".timer")]
        if SCHEDULE_ID_RE.match(candidate):
            ids.append(candidate)
    return sorted(ids)


def linger_enabled() -> bool:
    return Path("/var/lib/systemd/linger", pwd.getpwuid(os.getuid()).pw_name).exists()


def linger_hint() -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    return f"timers fire only while you are logged in: run 'sudo loginctl enable-linger {user}'"


def apply_timers(views: Iterable[Mapping[str, object]]) -> list[str]:
    """Bring the user manager in line with cairnd: a timer exactly as cairnd renders it
    for every enabled schedule, none for any other. Returns what was repaired."""
    # here, not at the top: every cairn command would pay for this import
    from cairn.schedules import timer_name

    repaired = []
    wanted = {str(v["schedule_id"]): str(v["timer"]) for v in views if v["timer"]}
    for schedule_id, text in sorted(wanted.items()):
        if install_timer(schedule_id, text):
            repaired.append(f"{timer_name(schedule_id)}: installed")
    for schedule_id in installed_timer_ids():
        if schedule_id not in wanted and remove_timer(schedule_id):
            repaired.append(f"{timer_name(schedule_id)}: removed (schedule not enabled)")
    return repaired
