"""The at-a-glance settlement label of ``cairn ps`` / ``show`` / ``diff``."""

from __future__ import annotations

from cairn.protocol.settlement_record import SettlementRecord
from cairn.settle.outcome import summary


def record(status: str, accepted: int = 0, refused: int = 0, conflicts: int = 0,
           applied: int = 0, ignored: int = 0) -> SettlementRecord:
    return SettlementRecord.model_validate({
        "status": status,
        "candidate": {
            "accepted": [f"a{i}" for i in range(accepted)],
            "refused": [{"path": f"r{i}", "reason": "x"} for i in range(refused)],
            "ignored": [f".tool{i}" for i in range(ignored)],
        },
        "apply": {
            "applied": [f"a{i}" for i in range(applied)],
            "already_applied": [],
            "conflicts": [{"path": f"c{i}", "reason": "y"} for i in range(conflicts)],
        },
    })


def test_labels() -> None:
    assert summary(None) is None
    cases = {
        "applied": (record("applied", 3, applied=3), True),
        "applied, 2 refused": (record("applied", 3, 2, applied=3), False),
        "none applied, 1 refused": (record("refused", 0, 1), False),
        "conflict, 1 path": (record("conflict", 2, conflicts=1), False),
        "conflict, 2 paths, 1 refused": (record("conflict", 2, 1, conflicts=2), False),
        "no changes": (record("noop"), True),
        # a tool's leftovers, left out on purpose, keep a settlement complete
        "no changes, 2 ignored": (record("noop", ignored=2), True),
        "applied, 1 refused, 3 ignored": (record("applied", 1, 1, applied=1, ignored=3), False),
        "applied, 1 ignored": (record("applied", 1, applied=1, ignored=1), True),
        "not settled, none applied": (record("failed"), False),
    }
    for label, (rec, complete) in cases.items():
        out = summary(rec)
        assert out is not None
        assert (out["label"], out["complete"]) == (label, complete), label
    out = summary(record("applied", 3, 2, applied=3))
    assert out == {"status": "applied", "label": "applied, 2 refused", "complete": False,
                   "accepted": 3, "applied": 3, "already_applied": 0, "refused": 2,
                   "ignored": 0, "conflicts": 0, "reverted": False}
