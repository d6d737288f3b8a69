"""The typed name of every ``flow.*`` operation; each kind's home is a module of
:mod:`cairn.operations`. Imports only :mod:`typing`, so wire protocols can use it."""

from typing import Literal

# In the order the review lists them when it refuses an unknown ``flow.<name>``.
OperationKind = Literal[
    "agent", "parallel", "map", "unroll", "item",
    "ask", "approve", "measure_proposal", "settle_experiment", "repeat_until", "restore",
]  # fmt: skip
