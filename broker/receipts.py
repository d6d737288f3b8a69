"""The broker's own receipts and pins: root-owned, readable by group cairn, never written
by it."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import NamedTuple

from cairn import paths
from cairn.protocol.broker import BODY_OF_KIND, Intent, Receipt, ReceiptBody

SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    run_id    TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    kind      TEXT NOT NULL,
    body      TEXT NOT NULL,
    at        REAL NOT NULL,
    PRIMARY KEY (run_id, intent_id)
);
CREATE TABLE IF NOT EXISTS pins (
    run_id       TEXT PRIMARY KEY,
    owner_uid    INTEGER NOT NULL,
    owner_gid    INTEGER NOT NULL,
    launch_hash  TEXT NOT NULL,
    project_dev  INTEGER NOT NULL,
    project_ino  INTEGER NOT NULL,
    description  TEXT NOT NULL,
    pinned_at    REAL NOT NULL,
    attested_pid INTEGER NOT NULL,
    previous     TEXT NOT NULL DEFAULT '[]'
)
"""


class Pin(NamedTuple):
    """What root recorded when the run's owner attested its launch (ARCHITECTURE §7):
    every later verb acts on this description, not on the journal's."""

    run_id: str
    owner_uid: int
    owner_gid: int
    launch_hash: str
    project_dev: int
    project_ino: int
    description: str


class ReceiptStore:
    """Root's receipts and pins. One connection, safe to share between the broker's
    threads: every statement runs under the store's lock."""

    busy_timeout = 30.0  # seconds; only another process's connection can make it wait

    def __init__(self) -> None:
        self.path = paths.broker_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.db = sqlite3.connect(
            self.path, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False
        )
        os.chmod(self.path, 0o640)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        st = os.stat(self.path)
        self.identity = (st.st_dev, st.st_ino)

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def is_current(self) -> bool:
        """Whether the file this store has open is still the receipts database."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return self.path == paths.broker_db_path() and (st.st_dev, st.st_ino) == self.identity

    def get(self, run_id: str, intent_id: str) -> Receipt | None:
        with self.lock:
            row = self.db.execute(
                "SELECT body FROM receipts WHERE run_id=? AND intent_id=?", (run_id, intent_id)
            ).fetchone()
        return None if row is None else Receipt.model_validate_json(row[0])

    def for_run(self, run_id: str) -> list[Receipt]:
        with self.lock:
            rows = self.db.execute(
                "SELECT body FROM receipts WHERE run_id=? ORDER BY at", (run_id,)
            ).fetchall()
        return [Receipt.model_validate_json(r[0]) for r in rows]

    def put(self, intent: Intent, body: ReceiptBody) -> Receipt:
        if type(body) is not BODY_OF_KIND[intent.kind]:
            raise TypeError(f"a {intent.kind} receipt has no {type(body).__name__} body")
        receipt = Receipt(
            intent_id=intent.intent_id,
            run_id=intent.run_id,
            kind=intent.kind,
            data=body.wire(),
            at=time.time(),
        )
        with self.lock:
            self.db.execute(
                "INSERT INTO receipts (intent_id, run_id, kind, body, at) VALUES (?,?,?,?,?)",
                (intent.intent_id, intent.run_id, intent.kind, receipt.model_dump_json(),
                 receipt.at),
            )
        return receipt

    def pin(self, run_id: str) -> Pin | None:
        with self.lock:
            row = self.db.execute(
                "SELECT run_id, owner_uid, owner_gid, launch_hash, project_dev, project_ino,"
                " description FROM pins WHERE run_id=?",
                (run_id,),
            ).fetchone()
        return None if row is None else Pin(*row)

    def put_pin(self, pin: Pin, *, pid: int) -> None:
        """Record a first pin; a run is pinned once (:meth:`repin` moves it)."""
        with self.lock:
            self.db.execute(
                "INSERT INTO pins (run_id, owner_uid, owner_gid, launch_hash, project_dev,"
                " project_ino, description, pinned_at, attested_pid) VALUES (?,?,?,?,?,?,?,?,?)",
                (*pin, time.time(), pid),
            )

    def repin(self, old: Pin, new: Pin, *, pid: int) -> None:
        """Move a pinned run to ``new`` (its owner attested an upgrade); the hashes it
        was pinned to before stay listed."""
        with self.lock:
            self.db.execute(
                "UPDATE pins SET launch_hash=?, description=?, pinned_at=?, attested_pid=?,"
                " previous=json_insert(previous, '$[#]', ?) WHERE run_id=? AND launch_hash=?",
                (new.launch_hash, new.description, time.time(), pid, old.launch_hash,
                 old.run_id, old.launch_hash),
            )


_shared: ReceiptStore | None = None
_shared_lock = threading.Lock()


def shared() -> ReceiptStore:
    """The broker process's one receipts store, opened on first use (again if the file
    was replaced). One connection for all request threads, so they queue on its lock
    and never on SQLite's busy timeout: with a connection per request, a launch burst
    on a slow disk failed a launch with "database is locked"."""
    global _shared  # noqa: PLW0603  (one store per broker process, made on first use)
    with _shared_lock:
        if _shared is None or not _shared.is_current():
            if _shared is not None:
                _shared.close()
            _shared = ReceiptStore()
        return _shared
