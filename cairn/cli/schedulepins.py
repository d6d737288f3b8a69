"""What the owner confirmed for each of their schedules, kept by their own ``cairn``
command in ``~/.config/cairn/schedules``
(/usr/share/doc/cairn/docs/decisions/launch-attestation.md).

``schedule create`` records what the person sent (project, definition, the review hash
the CLI computed itself, arguments, scripted profiles) as pending for the revision cairnd
names; ``schedule confirm`` makes the confirmed revision the schedule's pin. A timer's or
``run-now``'s launch is attested against the pin, never against what cairnd says the
schedule is: cairnd (or anything running as ``cairn``) cannot change where, what or with
which arguments the owner's schedule launches.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from cairn import userpaths
from cairn.cli.attest import Expected
from cairn.errors import UsageError
from cairn.fsutil import write_atomic
from cairn.schedules import SCHEDULE_ID_RE

PIN_LIMIT = 1 << 20  # bytes; a pin holds a few scripted profiles at most


class SchedulePin(BaseModel):
    """One confirmed revision of a schedule, as its owner sent it."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    schedule_id: str
    revision: int
    project: str
    definition: str
    review_hash: str | None  # computed by the CLI for user: and project: definitions
    args: dict[str, object]
    scripted: dict[str, dict[str, object]]

    def expected(self) -> Expected:
        """What a launch of this schedule must be before its owner attests it."""
        return Expected(
            schedule_id=self.schedule_id,
            project=self.project,
            definition=self.definition,
            review_hash=self.review_hash,
            args=self.args,
            scripted=self.scripted,
        )


def pin_dir() -> Path:
    return userpaths.cairn_dir() / "schedules"


def _path(schedule_id: str, revision: int | None = None) -> Path:
    if not SCHEDULE_ID_RE.match(schedule_id):
        raise UsageError(f"invalid schedule ID {schedule_id!r}", hint="see 'cairn schedule list'")
    name = schedule_id if revision is None else f"{schedule_id}.r{int(revision)}.pending"
    return pin_dir() / f"{name}.json"


def record_pending(pin: SchedulePin) -> None:
    """Keep what the owner just sent for ``pin.revision`` until they confirm it."""
    pin_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(_path(pin.schedule_id, pin.revision), pin.model_dump_json(), mode=0o600)


def confirm(schedule_id: str, revision: int) -> bool:
    """Make the pending ``revision`` the schedule's pin; drop every other pending one.
    False when this CLI never saw that revision sent (created before pins existed)."""
    pending = _path(schedule_id, revision)
    confirmed = True
    try:
        os.replace(pending, _path(schedule_id))
    except FileNotFoundError:
        confirmed = False
    for stale in pin_dir().glob(f"{schedule_id}.r*.pending.json"):
        stale.unlink(missing_ok=True)
    return confirmed


def forget(schedule_id: str) -> None:
    """The schedule was deleted: its pin and pending revisions go too."""
    _path(schedule_id).unlink(missing_ok=True)
    for stale in pin_dir().glob(f"{schedule_id}.r*.pending.json"):
        stale.unlink(missing_ok=True)


def pinned(schedule_id: str) -> SchedulePin | None:
    """The owner's pin of the schedule; None when there is none. A pin that is not a
    regular file of the caller's, or not one this CLI wrote, is refused."""
    path = _path(schedule_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unreadable(path, exc.strerror or str(exc)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (st.st_mode & 0o170000 == 0o100000 and st.st_uid == os.getuid()):
            raise _unreadable(path, "not a regular file of yours")
        raw = f.read(PIN_LIMIT + 1)
    if len(raw) > PIN_LIMIT:
        raise _unreadable(path, f"larger than {PIN_LIMIT} bytes")
    try:
        pin = SchedulePin.model_validate_json(raw)
    except (ValidationError, json.JSONDecodeError) as exc:
        raise _unreadable(path, str(exc).splitlines()[0]) from None
    if pin.schedule_id != schedule_id:
        raise _unreadable(path, f"it pins {pin.schedule_id}")
    return pin


def _unreadable(path: Path, why: str) -> UsageError:
    return UsageError(
        f"the schedule's pin {path} cannot be used: {why}",
        hint="confirm the schedule again: 'cairn schedule create … --replace', then "
        "'cairn schedule confirm'",
    )
