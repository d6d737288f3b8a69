"""`cairn revert` in cairnd, on a real journal: who may revert what, and how the outcome is
kept. The apply itself (F back to Q) is tested on real snapshots in tests/btrfs and end to
end in tests/system/test_undo.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_journal import RUN, description

from cairn.daemon.revert import revert
from cairn.errors import NotFound, UsageError
from cairn.journal.readwrite import Journal
from cairn.protocol.settlement import ApplyResult
from cairn.protocol.settlement_record import SettlementRecord
from cairn.settle.outcome import summary


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "journal.db", create=True)
    j.create_run(description(), intents=[])
    return j


def finish(journal: Journal, settlement: dict[str, object] | None) -> None:
    token = journal.acquire_lease(RUN, "t", ttl=60)
    if settlement is not None:
        journal.set_settlement(RUN, SettlementRecord.model_validate(settlement), token=token)
    journal.set_run_state(RUN, "succeeded", token=token)


def test_a_run_that_has_not_finished_is_refused(journal: Journal) -> None:
    with pytest.raises(UsageError, match="is pending; only a finished run can be reverted"):
        revert(journal, RUN, 1001)


def test_a_run_that_applied_nothing_is_refused(journal: Journal) -> None:
    finish(journal, {"status": "noop", "apply": {"applied": [], "already_applied": []}})
    with pytest.raises(UsageError, match="applied nothing to the live project"):
        revert(journal, RUN, 1001)


def test_another_users_run_is_not_found(journal: Journal) -> None:
    finish(journal, {"status": "applied", "apply": {"applied": ["a"]}})
    with pytest.raises(NotFound, match=f"no run {RUN}"):
        revert(journal, RUN, 1002)


def test_the_outcome_is_kept_in_the_settlement_with_an_event(journal: Journal) -> None:
    finish(journal, {"status": "applied", "apply": {"applied": ["a"]}})
    journal.record_revert(RUN, ApplyResult(status="applied", applied=["a"]), actor_uid=1001)
    settlement: dict[str, Any] | None = journal.get_run(RUN).settlement
    assert settlement is not None and settlement["revert"]["applied"] == ["a"]
    assert settlement["revert"]["by_uid"] == 1001 and "held" not in settlement
    assert summary(SettlementRecord.read(settlement))["label"] == "applied, reverted"  # type: ignore[index]
    (event,) = [e for e in journal.events(RUN) if e.event == "reverted"]
    assert event.data == {"status": "applied", "applied": 1, "already_applied": 0, "conflicts": 0}
    refused = ApplyResult(status="conflict", conflicts=[{"path": "a", "reason": "changed"}])  # type: ignore[list-item]
    journal.record_revert(RUN, refused, actor_uid=1001)
    stored = SettlementRecord.read(journal.get_run(RUN).settlement)
    assert summary(stored)["label"] == "applied, revert refused"  # type: ignore[index]
