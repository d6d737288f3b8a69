"""Runs as root pins them once their owner attested the launch (broker/pins.py), for
tests that record runs in the journal themselves and drive the broker's verbs in-process.
The attestation itself (the owner's channel, the kernel's word on who made it) is tested
in tests/unit/test_broker_pins.py, test_broker_socket.py and
tests/system/test_cairn_attacker.py."""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cairn import paths
from cairn.broker import verbs
from cairn.broker.receipts import Pin, ReceiptStore
from cairn.daemon import attest
from cairn.journal.reader import JournalReader
from cairn.protocol.broker import Receipt


def pin_as_attested(run_id: str) -> Pin:
    """The run's pin, made as the owner's attestation made it at launch."""
    store = ReceiptStore()
    reader = JournalReader(paths.journal_path())
    try:
        found = store.pin(run_id)
        if found is None:
            desc = reader.launch_description(run_id)
            try:  # a project that is gone is pinned as no directory: every check refuses
                st = os.lstat(desc.project.root)
                identity = (st.st_dev, st.st_ino)
            except FileNotFoundError:
                identity = (0, 0)
            found = Pin(run_id, desc.owner_uid, desc.owner_gid, desc.launch_hash(),
                        *identity, desc.model_dump_json())
            store.put_pin(found, pid=os.getpid())
        return found
    finally:
        reader.close()
        store.close()


def carry_out_attested(verb: str, run_id: str) -> list[Receipt]:
    """``verbs.carry_out`` of a run its owner attested at launch."""
    pin_as_attested(run_id)
    return verbs.carry_out(verb, run_id)


@contextmanager
def owner_channel() -> Iterator[queue.Queue[bytes]]:
    """cairnd serving requests that carry their owner's attestation channel (as the CLI
    passes it); yields what cairnd showed the owner there, one description a line."""
    mine, theirs = socket.socketpair()
    shown: queue.Queue[bytes] = queue.Queue()

    def owner() -> None:
        pending = b""
        while chunk := mine.recv(1 << 16):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                shown.put(line)

    reader = threading.Thread(target=owner, daemon=True)
    reader.start()
    with attest.serving(theirs.fileno()):
        yield shown
    theirs.close()
    reader.join(timeout=10)
    mine.close()
