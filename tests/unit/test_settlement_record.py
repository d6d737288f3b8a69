"""The settlement record (cairn/protocol/settlement_record.py): the JSON the journal keeps
for each way a settlement ends, read back and written again byte for byte; a record this
version cannot read said as such; and the run's end naming the check that failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_interactions import OWNER, RUN, create_run, incarnation, journal_of, root  # noqa: F401

from cairn.canonical import canonical_json
from cairn.daemon import views
from cairn.errors import JournalError
from cairn.protocol.settlement_record import SettlementRecord

CANDIDATE = {"accepted": ["a.txt"], "refused": [{"path": "b", "reason": "outside"}],
             "diff": "--- a/a.txt\n", "inventories_equal": False}
NOTHING: dict[str, list[object]] = {"applied": [], "already_applied": [], "conflicts": []}
CHECK = {"name": "tests", "passed": False, "result": "exit-code", "exit_status": 1,
         "output": "1 failed"}
# Every shape the coordinator and cairnd write, as the journal has always kept them.
STORED = [
    {"status": "failed", "error": "the pool is full", "apply": NOTHING},
    {"status": "noop", "candidate": {**CANDIDATE, "accepted": []}, "apply": NOTHING},
    {"status": "refused", "candidate": {**CANDIDATE, "accepted": []}, "apply": NOTHING},
    {"status": "verification-failed", "candidate": CANDIDATE, "apply": NOTHING,
     "verification": {"checks": [CHECK], "passed": False}},
    {"status": "held", "held": "launched with --apply never", "candidate": CANDIDATE,
     "apply": NOTHING},
    {"status": "waiting", "candidate": CANDIDATE, "apply": NOTHING},
    {"status": "applied", "candidate": CANDIDATE,
     "apply": {"status": "applied", "applied": ["a.txt"], "already_applied": [],
               "conflicts": []}},
    {"status": "conflict", "candidate": CANDIDATE,
     "apply": {"status": "conflict", "applied": [], "already_applied": [],
               "conflicts": [{"path": "a.txt", "reason": "changed"}]}},
    {"status": "applied", "candidate": CANDIDATE,
     "apply": {"status": "applied", "applied": ["a.txt"], "already_applied": [],
               "conflicts": []},
     "revert": {"status": "applied", "applied": ["a.txt"], "already_applied": [],
                "conflicts": [], "by_uid": 1001, "at": 1700000000.5}},
]


@pytest.mark.parametrize("stored", STORED, ids=[f"{s['status']}-{i}" for i, s in
                                                enumerate(STORED)])
def test_every_stored_shape_reads_back_and_is_written_again_unchanged(
    stored: dict[str, object],
) -> None:
    record = SettlementRecord.read(stored)
    assert record is not None and record.status == stored["status"]
    assert canonical_json(record.stored()) == canonical_json(stored)


def test_no_record_is_no_settlement() -> None:
    assert SettlementRecord.read(None) is None


@pytest.mark.parametrize("stored", [
    {"status": "half-applied", "apply": NOTHING},
    {"status": "applied", "apply": NOTHING, "surprise": 1},
    {"apply": NOTHING},
    {"status": "applied", "apply": {"applied": "a.txt"}},
])
def test_a_record_this_version_cannot_read_is_said_to_be_one(stored: dict[str, object]) -> None:
    with pytest.raises(JournalError, match="settlement record this version cannot read"):
        SettlementRecord.read(stored)


def test_the_first_failed_check_is_named_when_several_failed(root: Path) -> None:  # noqa: F811
    create_run(root)
    coord = incarnation()
    second = {**CHECK, "name": "lint", "exit_status": 2}
    record = SettlementRecord.model_validate({
        "status": "verification-failed", "candidate": CANDIDATE, "apply": NOTHING,
        "verification": {"checks": [{**CHECK, "passed": True, "name": "build"}, CHECK, second],
                         "passed": False}})
    coord.finish_run({}, record)
    with journal_of(root) as journal:
        run = journal.get_run(RUN)
    assert run.state == "failed"
    assert run.error is not None and run.error.startswith(
        "proposal not applied: check tests failed (exit-code, exit status 1)")


def test_a_view_of_a_run_whose_record_cannot_be_read_says_so(root: Path) -> None:  # noqa: F811
    create_run(root)
    with journal_of(root) as journal:
        with journal.transaction() as db:
            db.execute("UPDATE runs SET settlement=? WHERE run_id=?",
                       ('{"status": "half-applied"}', RUN))
        view = views.show(journal, RUN, OWNER)
    assert view["settlement"] is None and view["settlement_summary"] is None
    (issue,) = view["integrity"]["issues"]
    assert issue["code"] == "unreadable-record"
    assert "settlement record this version cannot read" in issue["message"]
