"""``flow.restore(boundary)``: put W back to an earlier agent boundary of the same scope
and go on from there (ARCHITECTURE §5).

Journal: the request is the boundary's operation ID (what ``flow.agent`` returned as
``boundary``, or that result itself). Coordinator (:mod:`cairn.coordinator.restores`):
only a committed agent boundary of the calling scope, earlier than the call, may be
restored; the new W generation made from its checkpoint and the drop of the old one are
saved with the move to ``started``, before the broker carries them out, so a crash
replays the same restore. Every later retry, measurement and settlement of the scope
starts from the restored checkpoint (:mod:`cairn.restore_point`).
"""

from __future__ import annotations

from cairn.operations.spec import OperationSpec, needs
from cairn.protocol.jsonvalue import JSONObject
from cairn.protocol.names import is_op_id

CAPABILITY = "restore"


def request(boundary: object) -> JSONObject:
    """What the call sends and the journal stores: the boundary's operation ID."""
    op_id = getattr(boundary, "boundary", boundary)
    if not isinstance(op_id, str) or not is_op_id(op_id):
        raise ValueError(
            "flow.restore takes an agent's boundary: what flow.agent returned, or its "
            ".boundary"
        )
    return {"boundary": op_id}


SPECS = (
    OperationSpec(
        kind="restore",
        summary="put W back to an earlier agent boundary of the same scope",
        review=needs(CAPABILITY),
    ),
)
