"""The owner's own record of what they confirmed for a schedule: what ``schedule create``
sent becomes the pin at ``confirm`` (only that revision), a launch is checked against it,
and a pin file that is not the owner's plain file is refused, not followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn.cli import schedulepins
from cairn.cli.schedulepins import SchedulePin
from cairn.errors import PermissionDenied, UsageError
from cairn.protocol.launch import LaunchDescription, ProjectSpec

SCHEDULE = "0123456789ab"


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def sent(revision: int, objective: str) -> SchedulePin:
    return SchedulePin(
        schedule_id=SCHEDULE,
        revision=revision,
        project="/home/alice/demo",
        definition="builtin:implement",
        review_hash=None,
        args={"objective": objective},
        scripted={},
    )


def description(**changes: object) -> LaunchDescription:
    fields: dict[str, object] = {
        "run_id": "flow_" + "a" * 32,
        "owner_uid": os.getuid(),
        "owner_gid": os.getgid(),
        "owner_name": "alice",
        "definition": "builtin:implement",
        "source": "",
        "source_filename": "implement.py",
        "review_hash": "sha256:" + "b" * 64,
        "review": {},
        "args": {"objective": "second"},
        "project": ProjectSpec(root="/home/alice/demo", owner_uid=os.getuid(), on_pool_fs=True),
        "profiles": {},
        "cairn_version": "test",
        "created_at": 1.0,
        "schedule": {"id": SCHEDULE},
    }
    fields.update(changes)
    return LaunchDescription.model_validate(fields)


def test_only_the_confirmed_revision_becomes_the_pin() -> None:
    schedulepins.record_pending(sent(1, "first"))
    schedulepins.record_pending(sent(2, "second"))
    assert schedulepins.pinned(SCHEDULE) is None  # nothing confirmed yet
    assert schedulepins.confirm(SCHEDULE, 2)
    pin = schedulepins.pinned(SCHEDULE)
    assert pin is not None and pin.revision == 2 and pin.args == {"objective": "second"}
    assert list(schedulepins.pin_dir().iterdir()) == [schedulepins.pin_dir() / f"{SCHEDULE}.json"]
    assert oct(os.stat(schedulepins.pin_dir()).st_mode & 0o777) == "0o700"
    # a revision this CLI never sent (an older cairn made it) is said, and pins nothing
    assert not schedulepins.confirm(SCHEDULE, 3)
    assert schedulepins.pinned(SCHEDULE) == pin


def test_a_launch_is_attested_only_as_the_owner_confirmed_it() -> None:
    schedulepins.record_pending(sent(1, "second"))
    schedulepins.confirm(SCHEDULE, 1)
    pin = schedulepins.pinned(SCHEDULE)
    assert pin is not None
    expected = pin.expected()
    expected.check(description().model_dump_json().encode())
    forged = [
        description(args={"objective": "forged"}),
        description(project=ProjectSpec(root="/home/alice/other", owner_uid=os.getuid(),
                                        on_pool_fs=True)),
        description(definition="builtin:optimize"),
        description(schedule={"id": "ba9876543210"}),
        description(profiles={"builtin:implementer": {
            "name": "builtin:implementer", "kind": "scripted", "steps": [],
            "output": {"summary": "forged"}}}),
    ]
    for desc in forged:
        with pytest.raises(PermissionDenied, match="not attesting"):
            expected.check(desc.model_dump_json().encode())


def test_a_pin_that_is_not_the_owners_plain_file_is_refused(tmp_path: Path) -> None:
    schedulepins.pin_dir().mkdir(parents=True)
    path = schedulepins.pin_dir() / f"{SCHEDULE}.json"
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(sent(1, "x").model_dump_json())
    path.symlink_to(elsewhere)
    with pytest.raises(UsageError, match="cannot be used"):
        schedulepins.pinned(SCHEDULE)
    path.unlink()
    os.mkfifo(path)  # never blocks: opened non-blocking, refused by type
    with pytest.raises(UsageError, match="not a regular file of yours"):
        schedulepins.pinned(SCHEDULE)
    path.unlink()
    path.write_text(sent(1, "x").model_copy(update={"schedule_id": "ba9876543210"})
                    .model_dump_json())
    with pytest.raises(UsageError, match="it pins ba9876543210"):
        schedulepins.pinned(SCHEDULE)
    path.write_bytes(b" " * (schedulepins.PIN_LIMIT + 1))
    with pytest.raises(UsageError, match="larger than"):
        schedulepins.pinned(SCHEDULE)
    path.write_text('{"schedule_id": "0123456789ab"}')
    with pytest.raises(UsageError, match="cannot be used"):
        schedulepins.pinned(SCHEDULE)


def test_deleting_the_schedule_forgets_its_pin_and_pending_revisions() -> None:
    schedulepins.record_pending(sent(1, "a"))
    schedulepins.confirm(SCHEDULE, 1)
    schedulepins.record_pending(sent(2, "b"))
    schedulepins.forget(SCHEDULE)
    assert schedulepins.pinned(SCHEDULE) is None
    assert list(schedulepins.pin_dir().iterdir()) == []


def test_a_schedule_id_that_is_not_one_is_refused_before_any_path_is_made() -> None:
    with pytest.raises(UsageError, match="invalid schedule ID"):
        schedulepins.pinned("../../etc")
