"""``flow.settle_experiment(...)``: accept or reject a measured proposal (ARCHITECTURE §4.1).

This release has no coordinator handler for it, so the review refuses the call
(``carried_out=False``).
"""

from __future__ import annotations

from cairn.operations.spec import OperationSpec

SPECS = (
    OperationSpec(
        kind="settle_experiment",
        summary="accept or reject a measured proposal (not carried out yet)",
        carried_out=False,
    ),
)
