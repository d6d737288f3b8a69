"""The read-write journal: the reads of :class:`~cairn.journal.reader.JournalReader` and
the writes of runs, the queue of runs, operations and people, on a connection that
migrates on open."""

from __future__ import annotations

import time
from pathlib import Path

from cairn.journal.operations import Operations
from cairn.journal.people import People
from cairn.journal.queue import Queue
from cairn.journal.schema import MIGRATIONS
from cairn.journal.store import Clock, Store
from cairn.journal.transactions import migrate


class Journal(Queue, Operations, People):
    """A connection to the journal. Not thread-safe: one per thread.

    Opening it read-write creates (``create=True``) and migrates the schema; ``readonly``
    opens without migrating (prefer :class:`~cairn.journal.reader.JournalReader`, which
    also checks the schema version). ``clock`` stamps every row and lease.
    """

    def __init__(
        self,
        path: Path,
        *,
        readonly: bool = False,
        create: bool = False,
        clock: Clock = time.time,
    ) -> None:
        Store.__init__(self, path, readonly=readonly, create=create, clock=clock)
        if not readonly:
            migrate(self.db, MIGRATIONS, label="journal")
