"""``cairn doctor``'s cross-check of an applied run against the live project: the check
over real directories and a real apply's receipts file (plain directories stand in for Q
and F; tests/btrfs/test_settle.py applies from real snapshots), the check unit's entry
point, and cairnd's report over a real journal with the broker's reply stood in."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from test_journal import RUN, description

from cairn.daemon import doctor, oneshot
from cairn.errors import BrokerRefused
from cairn.journal.readwrite import Journal
from cairn.protocol.broker import BrokerReply, Intent, Receipt
from cairn.protocol.settlement import AppliedCheck
from cairn.protocol.settlement_record import AppliedPaths, SettlementRecord
from cairn.settle.apply import ApplyReceipt, apply, check_applied
from cairn.settle.walk import EntryState
from cairn.worker import apply as apply_worker

ALICE = 1001


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def applied(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """Q, F and the live project after a real apply of F, and the apply's receipts."""
    q = write(tmp_path / "q", {"a.txt": "old a\n", "b.txt": "old b\n", "gone.txt": "x\n"})
    f = write(tmp_path / "f", {"a.txt": "new a\n", "b.txt": "new b\n", "c.txt": "new c\n"})
    live = write(tmp_path / "live", {"a.txt": "old a\n", "b.txt": "old b\n", "gone.txt": "x\n"})
    receipts = tmp_path / "receipts.jsonl"
    result = apply(q, f, live, ["a.txt", "b.txt", "c.txt", "gone.txt"], receipts)
    assert result.status == "applied"
    return q, f, live, receipts


def test_each_applied_path_is_as_applied_reverted_or_changed_since(
    applied: tuple[Path, Path, Path, Path],
) -> None:
    q, f, live, receipts = applied
    paths = ["a.txt", "b.txt", "c.txt", "gone.txt"]
    checked = check_applied(q, f, live, paths, receipts)
    # what the check unit writes is what root reads, strictly
    assert AppliedCheck.model_validate(asdict(checked), strict=True) == AppliedCheck(
        as_applied=paths)

    (live / "a.txt").write_text("old a\n")  # reverted by hand: Q's content
    (live / "b.txt").write_text("a person's edit\n")
    (live / "gone.txt").write_text("back, different\n")
    checked = check_applied(q, f, live, paths, receipts)
    assert checked.as_applied == ["c.txt"]
    assert checked.reverted == ["a.txt"]
    assert checked.changed == ["b.txt", "gone.txt"]
    assert checked.receipt_differs == []


def test_a_receipt_not_in_the_plan_is_checked_and_one_unlike_f_is_named(
    applied: tuple[Path, Path, Path, Path],
) -> None:
    q, f, live, receipts = applied
    (f / "c.txt").write_text("F now differs from what the receipt recorded\n")
    checked = check_applied(q, f, live, ["a.txt"], receipts)
    # c.txt comes from the receipts file alone; live holds what was written, not F now
    assert "c.txt" in checked.changed and checked.receipt_differs == ["c.txt"]


def test_a_live_symlink_is_never_followed(
    applied: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    q, f, live, receipts = applied
    elsewhere = write(tmp_path / "elsewhere", {"b.txt": "new b\n"})
    (live / "b.txt").unlink()
    os.symlink(elsewhere / "b.txt", live / "b.txt")
    assert check_applied(q, f, live, ["b.txt"], receipts).changed == ["b.txt"]


def test_the_check_unit_writes_its_result_and_touches_nothing(
    applied: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    q, f, live, receipts = applied
    (live / "b.txt").write_text("a person's edit\n")
    before = {p.name: p.read_bytes() for p in live.iterdir()}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(["a.txt", "b.txt"]))
    result = tmp_path / "result.json"
    argv = ["--q", str(q), "--f", str(f), "--live", str(live), "--plan", str(plan),
            "--receipts", str(receipts), "--result", str(result), "--check"]
    assert apply_worker.main(argv) == 0
    checked = AppliedCheck.model_validate_json(result.read_text())
    assert checked.changed == ["b.txt"] and "a.txt" in checked.as_applied
    assert {p.name: p.read_bytes() for p in live.iterdir()} == before


# --- cairnd's report --------------------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal.db", create=True)
    j.create_run(description(), intents=[])
    token = j.acquire_lease(RUN, "t", ttl=60)
    j.set_settlement(RUN, SettlementRecord(status="applied",
                                           apply=AppliedPaths(applied=["a.txt", "b.txt"])),
                     token=token)
    j.set_run_state(RUN, "succeeded", token=token)
    return j


def stand_in_broker(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, result: AppliedCheck | Exception
) -> list[Intent]:
    seen: list[Intent] = []

    def call(verb: str, run_id: str, *, timeout: float) -> BrokerReply:
        assert verb == "launch-v1"
        intent = [i for i in journal.intents(run_id, verb) if i.kind == "check-applied"][-1]
        seen.append(intent)
        if isinstance(result, Exception):
            raise result
        data: dict[str, Any] = {"unit": "cairn-check-applied-x-1.service",
                                "invocation_id": "0" * 32,
                                "result": result.model_dump(mode="json")}
        receipt = Receipt(intent_id=intent.intent_id, run_id=run_id, kind="check-applied",
                          data=data, at=1.0)
        return BrokerReply(ok=True, receipts=[receipt])

    monkeypatch.setattr(oneshot, "call_broker", call)
    return seen


def test_a_path_changed_since_is_a_warning_not_a_problem(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = stand_in_broker(journal, monkeypatch,
                           AppliedCheck(as_applied=["a.txt"], changed=["b.txt"]))
    report = doctor.check_live(journal, journal.get_run(RUN))
    assert [i.intent_id for i in seen] == ["check-applied.1"]
    assert report["problems"] == [] and report["notes"] == []
    assert report["applied"] == {"as_applied": 1, "reverted": 0, "changed": 1}
    (warning,) = report["warnings"]
    assert warning.startswith("b.txt in the live project is neither")
    assert [r["kind"] for r in journal.receipts(RUN)] == ["check-applied"]
    doctor.check_live(journal, journal.get_run(RUN))  # a second doctor asks anew
    assert [i.intent_id for i in seen] == ["check-applied.1", "check-applied.2"]


def test_a_receipt_unlike_f_is_a_warning_with_its_path(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_broker(journal, monkeypatch,
                    AppliedCheck(as_applied=["a.txt", "b.txt"], receipt_differs=["b.txt"]))
    report = doctor.check_live(journal, journal.get_run(RUN))
    assert report["warnings"] == [
        "b.txt: the apply's receipt does not match the run's proposal F"]
    assert report["problems"] == []


def test_a_deleted_run_is_skipped_with_a_note(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = stand_in_broker(journal, monkeypatch, AppliedCheck())
    journal.add_intents(
        RUN, [Intent(intent_id="delete-run", run_id=RUN, kind="delete-run")], token=None)
    journal.record_receipts(RUN, [{"intent_id": "delete-run", "run_id": RUN,
                                   "kind": "delete-run", "data": {"deleted": []}, "at": 2.0}])
    report = doctor.check_live(journal, journal.get_run(RUN))
    assert report["notes"] == ["the live project was not checked: the run's storage was deleted"]
    assert report["warnings"] == [] and report["problems"] == [] and not seen


def test_a_check_the_broker_refuses_is_a_problem(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_broker(journal, monkeypatch, BrokerRefused("the project is gone"))
    report = doctor.check_live(journal, journal.get_run(RUN))
    assert report["problems"] == ["live project not checked: the project is gone"]
    # withdrawn: it never stands in front of the run's later launch-v1 intents (a revert)
    assert journal.intents(RUN, "launch-v1") == []


def test_a_check_the_broker_did_not_carry_out_is_withdrawn(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oneshot, "call_broker", lambda verb, run_id, *, timeout: BrokerReply(
        ok=True, receipts=[]))
    report = doctor.check_live(journal, journal.get_run(RUN))
    (problem,) = report["problems"]
    assert problem.startswith(f"live project not checked: the broker left check-applied.1 of {RUN}")
    assert journal.intents(RUN, "launch-v1") == []


def test_an_intent_with_a_receipt_is_never_withdrawn(journal: Journal) -> None:
    intent = Intent(intent_id="check-applied.1", run_id=RUN, kind="check-applied", attempt=1)
    journal.add_intents(RUN, [intent], token=None)
    journal.record_receipts(RUN, [{"intent_id": "check-applied.1", "run_id": RUN,
                                   "kind": "check-applied", "data": {}, "at": 2.0}])
    assert journal.withdraw_intent(RUN, "check-applied.1") is False
    assert [i.intent_id for i in journal.intents(RUN, "launch-v1")] == ["check-applied.1"]


def test_a_run_that_applied_nothing_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = Journal(tmp_path / "other.db", create=True)
    j.create_run(description(), intents=[])
    seen = stand_in_broker(j, monkeypatch, AppliedCheck())
    report = doctor.check_live(j, j.get_run(RUN))
    assert report == {"problems": [], "warnings": [], "notes": []} and not seen


class ExitingUnits:
    """systemd as cairnd's doctor sees it: the run's coordinator still ``active`` for the
    first ``polls`` questions (it recorded the end and is on its way out), then gone."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def __enter__(self) -> ExitingUnits:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def unit_state(self, name: str) -> Any:
        if name.startswith("cairn-coordinator@") and self.polls > 0:
            self.polls -= 1
            return type("State", (), {"active_state": "active"})()
        return None


@pytest.mark.parametrize(("polls", "problem"), [(3, False), (10_000, True)])
def test_a_coordinator_on_its_way_out_after_the_run_ended_is_no_problem(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, polls: int, problem: bool
) -> None:
    """The coordinator records the end, then exits: the doctor waits for it a moment
    after the run ended, and only one still going past that is a problem."""
    receipt = {"intent_id": "start-coordinator.1", "kind": "start-coordinator",
               "data": {"unit": f"cairn-coordinator@{RUN}.service"}}
    monkeypatch.setattr(journal, "receipts", lambda run_id: [receipt])
    monkeypatch.setattr(doctor, "Systemd", lambda: ExitingUnits(polls))
    monkeypatch.setattr(doctor, "ENDING_GRACE_SEC", 0.5)
    (run,) = journal.list_runs(None)
    problems = doctor.check_run(journal, run)["problems"]
    assert bool(problems) is problem, problems
    if problem:
        assert problems == [f"cairn-coordinator@{RUN}.service is still active but the run "
                            "is succeeded"]


# A line as the apply unit wrote it before it dropped pydantic (model_dump_json): the
# next apply of the same run, after an upgrade, reads it the same.
EARLIER_LINE = ('{"path":"a.txt","action":"written","f":{"kind":"file","mode":420,'
                '"sha256":"' + "e" * 64 + '","target":""},"at":1796520091.5}')


def test_a_receipt_line_reads_back_and_an_earlier_one_reads_the_same() -> None:
    receipt = ApplyReceipt.from_line(EARLIER_LINE)
    state = EntryState("file", 420, "e" * 64)
    assert receipt == ApplyReceipt("a.txt", "written", state, 1796520091.5)
    assert receipt.line() == EARLIER_LINE + "\n"


@pytest.mark.parametrize("line", [
    '{"path": "a.txt", "act',  # torn by a crash
    "[]", "null", '"a.txt"',
    EARLIER_LINE.replace('"written"', '"moved"'),
    EARLIER_LINE.replace('"kind":"file"', '"kind":"fifo"'),
    EARLIER_LINE.replace('"mode":420', '"mode":"420"'),
    EARLIER_LINE.replace('"mode":420', '"mode":true'),
    EARLIER_LINE.replace('"at":1796520091.5', '"at":"now"'),
    EARLIER_LINE.replace('"path":"a.txt"', '"path":7'),
    EARLIER_LINE.replace('"at":', '"by":1,"at":'),
])
def test_a_line_that_is_no_receipt_is_refused(line: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011  (JSON's own error, or 'not a receipt')
        ApplyReceipt.from_line(line)
