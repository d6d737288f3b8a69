"""The broker's own receipts: root-owned, readable by group cairn, never written by it."""

from __future__ import annotations

import os
import sqlite3
import time

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
)
"""


class ReceiptStore:
    def __init__(self) -> None:
        path = paths.broker_db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        os.chmod(path, 0o640)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(SCHEMA)

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
