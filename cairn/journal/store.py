"""The connection under every journal: opening it, the clock, the lease TTL and the
schema version this code speaks. Transactions and migrations are
:mod:`cairn.journal.transactions`, which only writers load.

One database in WAL mode with ``synchronous=FULL`` and foreign keys on. Every multi-row
change is one ``BEGIN IMMEDIATE`` transaction. Writes on behalf of a coordinator carry its
lease token (fencing): a coordinator whose token is no longer current cannot commit.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from cairn.errors import JournalError

# How long a run lease lasts without renewal (seconds). A coordinator renews it on every
# fenced write (:mod:`cairn.journal.writes`) and from its heartbeat; the one home of this number.
LEASE_TTL = 60.0

# The schema version this code reads and writes; :mod:`cairn.journal.schema` holds the
# migrations that reach it, which only read-write connections run.
SCHEMA_VERSION = 6

Clock = Callable[[], float]


class Store:
    """A connection to the journal. Not thread-safe: one per thread.

    ``clock`` gives the time every row and lease is stamped with (seconds since the epoch);
    tests pass their own to move time instead of sleeping.
    """

    def __init__(
        self,
        path: Path,
        *,
        readonly: bool = False,
        create: bool = False,
        clock: Clock = time.time,
    ) -> None:
        self.path = path
        self.clock = clock
        if not create and not path.exists():
            raise JournalError(
                f"journal {path} does not exist",
                hint="is cairn installed and cairn.socket started?",
            )
        uri = f"file:{path}?mode={'ro' if readonly else 'rwc'}"
        try:
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from exc
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA busy_timeout=30000")
        if not readonly:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])
