"""The broker's own receipts and pins: root-owned, readable by group cairn, never written
by it."""

from __future__ import annotations

import os
import sqlite3
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
    def __init__(self) -> None:
        path = paths.broker_db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        os.chmod(path, 0o640)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def get(self, run_id: str, intent_id: str) -> Receipt | None:
        row = self.db.execute(
            "SELECT body FROM receipts WHERE run_id=? AND intent_id=?", (run_id, intent_id)
        ).fetchone()
        return None if row is None else Receipt.model_validate_json(row[0])

    def for_run(self, run_id: str) -> list[Receipt]:
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
        self.db.execute(
            "INSERT INTO receipts (intent_id, run_id, kind, body, at) VALUES (?,?,?,?,?)",
            (intent.intent_id, intent.run_id, intent.kind, receipt.model_dump_json(), receipt.at),
        )
        return receipt

    def pin(self, run_id: str) -> Pin | None:
        row = self.db.execute(
            "SELECT run_id, owner_uid, owner_gid, launch_hash, project_dev, project_ino,"
            " description FROM pins WHERE run_id=?",
            (run_id,),
        ).fetchone()
        return None if row is None else Pin(*row)

    def put_pin(self, pin: Pin, *, pid: int) -> None:
        """Record a first pin; a run is pinned once (:meth:`repin` moves it)."""
        self.db.execute(
            "INSERT INTO pins (run_id, owner_uid, owner_gid, launch_hash, project_dev,"
            " project_ino, description, pinned_at, attested_pid) VALUES (?,?,?,?,?,?,?,?,?)",
            (*pin, time.time(), pid),
        )

    def repin(self, old: Pin, new: Pin, *, pid: int) -> None:
        """Move a pinned run to ``new`` (its owner attested an upgrade); the hashes it
        was pinned to before stay listed."""
        self.db.execute(
            "UPDATE pins SET launch_hash=?, description=?, pinned_at=?, attested_pid=?,"
            " previous=json_insert(previous, '$[#]', ?) WHERE run_id=? AND launch_hash=?",
            (new.launch_hash, new.description, time.time(), pid, old.launch_hash,
             old.run_id, old.launch_hash),
        )
