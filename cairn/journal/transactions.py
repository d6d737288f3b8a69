"""The transaction and migration helpers any Cairn SQLite store uses (the journal's
writers, the schedule store). Readers never need them: the root broker's read-only journal
connection does not load this module."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from cairn.errors import JournalError

# A process's writers take turns here before they ask SQLite (cairnd serves each request
# on a thread of its own): a thread then waits for the one before it, not in a retry loop
# (:func:`_begin`). Other processes meet at SQLite's lock.
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
        _begin(db)
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        else:
            db.execute("COMMIT")
    finally:
        _WRITERS.release()


def _begin(db: sqlite3.Connection, pause: Callable[[float], object] = time.sleep) -> None:
    """``BEGIN IMMEDIATE``, waiting as long as ``db``'s busy timeout for another
    connection's write lock, but trying again every few milliseconds: SQLite's own busy
    handler sleeps ever longer between tries (after 53 ms of waiting it sleeps 25 ms, after
    228 ms 100 ms), so a lock held for 2 ms could cost a waiter 100 ms more."""
    timeout = int(db.execute("PRAGMA busy_timeout").fetchone()[0])
    deadline = time.monotonic() + timeout / 1000
    between = 0.0005
    db.execute("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # the primary code: an extended one (SQLITE_BUSY_RECOVERY, _BUSY_TIMEOUT)
                # is busy too
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in (
                    sqlite3.SQLITE_BUSY,
                    sqlite3.SQLITE_LOCKED,
                ):
                    raise
                if time.monotonic() >= deadline:
                    raise _locked(db, timeout / 1000) from exc
            pause(between)
            between = min(between * 2, 0.004)
    finally:
        db.execute(f"PRAGMA busy_timeout={timeout}")


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
