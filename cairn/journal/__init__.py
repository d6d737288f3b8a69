"""The SQLite journal: runs, operations, intents, events, leases, people in the loop.

One home per concern:

- :mod:`~cairn.journal.schema`: the tables, versioned migrations;
- :mod:`~cairn.journal.rows`: run and operation states, the rows read back;
- :mod:`~cairn.journal.store`: the connection, clock, lease TTL, schema version;
- :mod:`~cairn.journal.transactions`: transactions and migrations, for writers only;
- :mod:`~cairn.journal.reader`: :class:`JournalReader`, read-only and never migrating —
  the only part the root broker opens;
- :mod:`~cairn.journal.writes`: fencing, events, intents and receipts;
- :mod:`~cairn.journal.runs`: runs and their lease;
- :mod:`~cairn.journal.operations`: operations and their state machine
  (:data:`OP_TRANSITIONS`);
- :mod:`~cairn.journal.people`: questions, approvals, control requests, their rows;
- :mod:`~cairn.journal.readwrite`: :class:`Journal`, all of the above.

Names are imported from here (``from cairn.journal import Journal, OpRow``). They load
lazily, so importing :mod:`cairn.journal.reader` does not pull in the writers (nor, through
the people part, the host policy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.journal.operations import OP_TRANSITIONS, check_op_transition
    from cairn.journal.people import ApprovalRow, QuestionRow
    from cairn.journal.reader import JournalReader
    from cairn.journal.readwrite import Journal
    from cairn.journal.rows import (
        TERMINAL_RUN_STATES,
        ControlAction,
        EventRow,
        OpRow,
        OpState,
        RunRow,
        RunState,
    )
    from cairn.journal.store import LEASE_TTL, SCHEMA_VERSION, Clock

_HOMES = {
    "OP_TRANSITIONS": "operations",
    "check_op_transition": "operations",
    "JournalReader": "reader",
    "Journal": "readwrite",
    "SCHEMA_VERSION": "store",
    "TERMINAL_RUN_STATES": "rows",
    "ControlAction": "rows",
    "EventRow": "rows",
    "OpRow": "rows",
    "OpState": "rows",
    "RunRow": "rows",
    "RunState": "rows",
    "ApprovalRow": "people",
    "QuestionRow": "people",
    "LEASE_TTL": "store",
    "Clock": "store",
}

__all__ = [
    "ApprovalRow",
    "Clock",
    "ControlAction",
    "EventRow",
    "Journal",
    "JournalReader",
    "LEASE_TTL",
    "OP_TRANSITIONS",
    "OpRow",
    "OpState",
    "QuestionRow",
    "RunRow",
    "RunState",
    "SCHEMA_VERSION",
    "TERMINAL_RUN_STATES",
    "check_op_transition",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
