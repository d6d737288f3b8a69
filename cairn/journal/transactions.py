"""The transaction and migration helpers any Cairn SQLite store uses (the journal's
writers, the schedule store). Readers never need them: the root broker's read-only journal
connection does not load this module."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from cairn.errors import JournalError

# A process's writers take turns here before they ask SQLite: SQLite's busy handler sleeps
# between tries (1 ms, then longer, up to 100 ms), so threads of one process (cairnd serves
# each request on its own) that met at BEGIN waited for a lock that was free most of that
# time (in a burst of 64 launches, up to 0.5 s). Other processes meet at SQLite's lock.
_WRITERS = threading.RLock()
# How long a thread waits for its turn: as long as the stores wait for SQLite's lock.
TURN_TIMEOUT_SEC = 30.0


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on an autocommit connection
    (``isolation_level=None``); commits on success, rolls back on any error. One thread of
    the process at a time is inside one (:data:`_WRITERS`).

    A write lock still held by another connection, or by another thread of this process,
    when the busy timeout runs out (a writer that was stopped or hangs inside its own
    transaction) is a ``JournalError`` that names the database, not a bare
    ``sqlite3.OperationalError`` or a wait without end."""
    if not _WRITERS.acquire(timeout=TURN_TIMEOUT_SEC):
        raise _locked(db, TURN_TIMEOUT_SEC)
    try:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            # the primary code: an extended one (SQLITE_BUSY_RECOVERY, _BUSY_TIMEOUT) is
            # busy too
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in (
                sqlite3.SQLITE_BUSY,
                sqlite3.SQLITE_LOCKED,
            ):
                raise
            raise _locked(db) from exc
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        else:
            db.execute("COMMIT")
    finally:
        _WRITERS.release()


def _locked(db: sqlite3.Connection, waited: float | None = None) -> JournalError:
    (path,) = [row[2] for row in db.execute("PRAGMA database_list") if row[1] == "main"]
    if waited is None:
        waited = int(db.execute("PRAGMA busy_timeout").fetchone()[0]) / 1000
    return JournalError(
        f"{path or 'the database'} stayed locked by another writer for {waited:g} s",
        hint="a stopped or hung cairn process holds its write lock:"
        " find it with 'ps -o pid,stat,unit,args -u cairn' (state T is stopped)"
        " and continue or stop it",
    )


def migrate(db: sqlite3.Connection, migrations: Mapping[int, str], *, label: str) -> None:
    """Bring a database to the newest of ``migrations`` (version → SQL statements), in one
    transaction, recording each version in ``PRAGMA user_version``. A database newer than
    the code is refused; one another connection migrated meanwhile is left as it is."""
    latest = max(migrations)
    if db.execute("PRAGMA user_version").fetchone()[0] == latest:
        return  # current: no write lock to take (cairnd opens the journal per request)
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
