"""The connection under every journal: opening, migrating, transactions, the clock;
and the transaction and migration helpers any Cairn SQLite store can use.

One database in WAL mode with ``synchronous=FULL`` and foreign keys on. Every multi-row
change is one ``BEGIN IMMEDIATE`` transaction. Writes on behalf of a coordinator carry its
lease token (fencing): a coordinator whose token is no longer current cannot commit.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Self

from cairn.errors import JournalError

# How long a run lease lasts without renewal (seconds). A coordinator renews it on every
# fenced write (:mod:`cairn.journal.writes`) and from its heartbeat; the one home of this number.
LEASE_TTL = 60.0

# The schema version this code reads and writes; :mod:`cairn.journal.schema` holds the
# migrations that reach it, which only read-write connections run.
SCHEMA_VERSION = 2

Clock = Callable[[], float]


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on an autocommit connection
    (``isolation_level=None``); commits on success, rolls back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    else:
        db.execute("COMMIT")


def migrate(db: sqlite3.Connection, migrations: Mapping[int, str], *, label: str) -> None:
    """Bring a database to the newest of ``migrations`` (version → SQL statements), in one
    transaction, recording each version in ``PRAGMA user_version``. A database newer than
    the code is refused; one another connection migrated meanwhile is left as it is."""
    latest = max(migrations)
    with transaction(db):
        current = db.execute("PRAGMA user_version").fetchone()[0]
        if current > latest:
            raise JournalError(
                f"{label} schema {current} is newer than this cairn ({latest})",
                hint="upgrade the cairn package",
            )
        for version in range(current + 1, latest + 1):
            for statement in migrations[version].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={version}")


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
        migrations: Mapping[int, str] | None = None,
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
            if migrations is not None:
                migrate(self.db, migrations, label="journal")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; commits on success, rolls back on error."""
        return transaction(self.db)
