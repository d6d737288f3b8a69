"""``flow.measure_proposal(...)``: measure W with an evaluator (ARCHITECTURE §4.1).

Review: the site would need ``evaluator``. This release has no coordinator handler for
it, so the review refuses the call (``carried_out=False``).
"""

from __future__ import annotations

from cairn.operations.spec import OperationSpec, needs

SPECS = (
    OperationSpec(
        kind="measure_proposal",
        summary="snapshot W and run an evaluator over a disposable copy (not carried out yet)",
        review=needs("evaluator"),
        carried_out=False,
    ),
)
