"""``flow.repeat_until(step, check, max_attempts=)``: a bounded retry loop.

The loop itself runs in the control worker; the operation is a marker (no effect) that
records the bound. Journal: the request is ``max_attempts``.
"""

from __future__ import annotations

from cairn.operations.spec import OperationSpec
from cairn.protocol.jsonvalue import JSONObject

MAX_ATTEMPTS = 100


def request(max_attempts: int) -> JSONObject:
    """What the call sends and the journal stores; the bound must be 1..100."""
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise ValueError(f"max_attempts must be between 1 and {MAX_ATTEMPTS}")
    return {"max_attempts": max_attempts}


SPECS = (
    OperationSpec(
        kind="repeat_until",
        summary="bounded retry loop; a marker that records the bound",
        is_marker=True,
    ),
)
