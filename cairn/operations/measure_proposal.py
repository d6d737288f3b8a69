"""``flow.measure_proposal(...)``: measure W with an evaluator (ARCHITECTURE §4.1).

Review: the site needs ``evaluator``. This version reviews the call but has no
coordinator handler: a run that makes it fails with "not supported".
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
