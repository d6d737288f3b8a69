"""``flow.settle_experiment(...)``: accept or reject a measured proposal (ARCHITECTURE §4.1).

This version reviews the call (it needs no capability) but has no coordinator handler:
a run that makes it fails with "not supported".
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
