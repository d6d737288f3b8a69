"""Which checkpoint a clean retry restores W from (cairn.restore_point): never the
predecessor's name when that operation made no checkpoint (an ``ask``, a worklist item, a
measurement, a join), a lane's first agent from its fork's S, the root's first from Q.
The broker's side (that S accepted for its lanes only, the source UUID in the receipt) is
in test_broker_receipts.py; end to end with killed agents in
tests/system/test_retry_checkpoint.py."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.journal.rows import OpRow
from cairn.restore_point import lane_fork, restore_point


def op(scope: str, seq: int, kind: str, state: str = "committed", **fields: Any) -> OpRow:
    return OpRow.model_validate({
        "run_id": "flow_" + "0" * 32, "scope": scope, "seq": seq, "op_id": f"{scope}-{seq}",
        "kind": kind, "request": fields.pop("request", {}), "request_hash": "h",
        "source_location": "wf.py:1:1", "predecessor": None, "attempt": 1, "state": state,
        "finish": None, "result": fields.pop("result", None), "error": None,
        "checkpoint": None, "created_at": 0.0, "updated_at": 0.0,
    })


# agent, ask, unroll item, agent, item, measurement, accept, map (lanes x, y) with a lane
# agent in x, then an agent: the map is its predecessor, committed at its join (the join
# is recorded on the fork's own row)
RUN = [
    op("root", 1, "agent"),
    op("root", 2, "ask"),
    op("root", 3, "item"),
    op("root", 4, "agent"),
    op("root", 5, "item"),
    op("root", 6, "measure_proposal"),
    op("root", 7, "settle_experiment", result={"disposition": "accepted",
                                                "checkpoint": "root-4"}),
    op("root", 8, "map", request={"lanes": ["x", "y"]}),
    op("root-8-x", 1, "agent"),
    op("root-8-x", 2, "item"),
    op("root", 9, "agent", state="started"),
]


@pytest.mark.parametrize(
    ("scope", "seq", "expected"),
    [
        ("root", 1, None),  # the root's first agent: Q
        ("root", 3, "root-1"),  # after an ask
        ("root", 4, "root-1"),  # after an item marker
        ("root", 6, "root-4"),  # after an item marker, the agent before it
        ("root", 7, "root-4"),  # after a measurement
        ("root", 8, "root-4"),  # after an accept: W is as the agent left it
        ("root", 9, "root-4"),  # after a join: the lanes never touch the parent's W
        ("root-8-x", 1, "root-8"),  # a lane's first agent: the fork's S
        ("root-8-y", 1, "root-8"),
        ("root-8-x", 3, "root-8-x-1"),  # after an item in a lane
    ],
)
def test_the_checkpoint_w_holds(scope: str, seq: int, expected: str | None) -> None:
    assert restore_point(RUN, scope, seq) == expected


def test_a_reject_restores_and_a_later_agent_moves_on() -> None:
    ops = [
        *RUN[:7],
        op("root", 8, "agent"),
        op("root", 9, "measure_proposal"),
        op("root", 10, "settle_experiment", result={"disposition": "rejected",
                                                     "checkpoint": "root-4"}),
    ]
    assert restore_point(ops, "root", 11) == "root-4"
    rejected_to_q = [op("root", 1, "agent"), op("root", 2, "settle_experiment", result={
        "disposition": "rejected", "checkpoint": None})]
    assert restore_point(rejected_to_q, "root", 3) is None


def test_an_agent_that_never_committed_made_no_checkpoint() -> None:
    ops = [op("root", 1, "agent"), op("root", 2, "agent", state="failed")]
    assert restore_point(ops, "root", 3) == "root-1"


def test_a_run_replayed_through_a_fork_starts_from_its_s() -> None:
    ops = [op("root", 1, "agent"), op("root", 2, "parallel", request={"lanes": ["a"]})]
    assert restore_point(ops, "root", 3) == "root-1"
    assert restore_point(ops, "root", 3, replayed_through="root-2") == "root-2"
    ops.append(op("root", 3, "agent"))
    assert restore_point(ops, "root", 4, replayed_through="root-2") == "root-3"


def test_nested_lanes_start_from_their_own_fork() -> None:
    ops = [op("root", 1, "parallel", request={"lanes": ["a"]}),
           op("root-1-a", 1, "map", request={"lanes": ["b"]})]
    assert lane_fork(ops, "root-1-a-1-b") == "root-1-a-1"
    assert restore_point(ops, "root-1-a-1-b", 1) == "root-1-a-1"
    assert lane_fork(ops, "root") is None
