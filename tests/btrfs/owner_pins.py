"""The pin a run's owner's attestation leaves in root's receipts, for tests that drive
the broker's verbs in this process."""

from __future__ import annotations

import os

from cairn import paths
from cairn.broker.receipts import Pin, ReceiptStore
from cairn.journal.reader import JournalReader


def pin_as_owner(run_id: str) -> None:
    """Pin ``run_id``'s journalled description in root's receipts as its owner's
    attestation does at launch (that path: tests/unit/test_broker_pins.py and the system
    tier); the owners here have no account on the host."""
    journal, store = JournalReader(paths.journal_path()), ReceiptStore()
    try:
        if store.pin(run_id) is not None:
            return
        desc = journal.launch_description(run_id)
        try:
            st = os.lstat(desc.project.root)
            dev, ino = st.st_dev, st.st_ino
        except FileNotFoundError:
            dev, ino = 0, 0
        store.put_pin(Pin(run_id, desc.owner_uid, desc.owner_gid, desc.launch_hash(), dev, ino,
                          desc.model_dump_json()), pid=os.getpid())
    finally:
        store.close()
        journal.close()
