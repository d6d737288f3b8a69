"""The SQLite journal: runs, operations, intents, events, leases, people in the loop.

One home per concern, and every name is imported from its home
(``from cairn.journal.readwrite import Journal``):

- :mod:`~cairn.journal.schema`: the tables, versioned migrations;
- :mod:`~cairn.journal.rows`: run and operation states, the rows read back;
- :mod:`~cairn.journal.store`: the connection, clock, lease TTL, schema version;
- :mod:`~cairn.journal.transactions`: transactions and migrations, for writers only;
- :mod:`~cairn.journal.reader`: :class:`~cairn.journal.reader.JournalReader`, read-only
  and never migrating — the only part the root broker opens;
- :mod:`~cairn.journal.writes`: fencing, events, intents and receipts;
- :mod:`~cairn.journal.runs`: runs and their lease;
- :mod:`~cairn.journal.operations`: operations and their state machine
  (:data:`~cairn.journal.operations.OP_TRANSITIONS`);
- :mod:`~cairn.journal.people`: questions, approvals, control requests, their rows;
- :mod:`~cairn.journal.readwrite`: :class:`~cairn.journal.readwrite.Journal`, all of the
  above.

This package runs no code of its own: importing :mod:`cairn.journal.reader` loads neither
the writers nor (through the people part) the host policy.
"""
