"""``flow.parallel({key: fn})`` and ``flow.map(items, fn, key=)``: fork the scope.

Each lane runs in its own scope with a writable W made from a checkpoint of the parent's;
the join records every lane's outcome and final boundary (lanes are evidence, never
merged). Journal: the request is the lane keys and the concurrency. Coordinator: FORK
and JOIN (:mod:`cairn.coordinator.lanes`); the broker's ``fork`` intent checks the
operation is one of these kinds.
"""

from __future__ import annotations

from cairn.operations.spec import OperationSpec
from cairn.protocol.jsonvalue import JSONObject


def request(lanes: list[str], concurrency: int) -> JSONObject:
    """What the call sends and the journal stores."""
    return {"lanes": list(lanes), "concurrency": concurrency}


SPECS = (
    OperationSpec(
        kind="parallel",
        summary="fork: each lane gets its own W; answered after every lane is joined",
        is_fork=True,
    ),
    OperationSpec(
        kind="map",
        summary="parallel over data, one lane per item key",
        is_fork=True,
    ),
)
