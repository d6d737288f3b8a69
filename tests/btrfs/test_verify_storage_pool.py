"""``verify-storage`` on a real pool: the broker's own receipts against what is on disk.
A subvolume replaced behind a receipt is foreign, one no receipt explains is named, and a
committed agent operation without a checkpoint receipt is reported. (The journal here is
a stand-in listing operations; reading the real one is tests/unit's.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import btrfsutil
import pytest

from cairn.broker import verbs
from cairn.broker.receipts import ReceiptStore
from cairn.protocol.broker import Intent, WCreated
from cairn.storage import Pool

pytestmark = pytest.mark.btrfs


def ops(*rows: tuple[str, str, str]) -> Any:
    listed = [SimpleNamespace(op_id=op_id, kind=kind, state=state) for op_id, kind, state in rows]
    return SimpleNamespace(list_ops=lambda _run_id: listed)


def test_verify_storage_names_foreign_unexplained_and_missing_checkpoints(
    broker_host: Pool, run_id: str
) -> None:
    pool = broker_host
    store = ReceiptStore()
    try:
        w = pool.w_path(run_id, "root", 1)
        made = pool.create_subvolume(w)
        store.put(Intent(intent_id="create-w.root.1", run_id=run_id, kind="create-w"),
                  WCreated(w=made))
        intent = Intent(intent_id="verify-storage", run_id=run_id, kind="verify-storage")
        journal = ops(("root-1", "agent", "committed"), ("root-2", "agent", "running"),
                      ("root-3", "shell", "committed"))
        ctx = verbs.IntentContext(intent, None, None, journal, store)  # type: ignore[arg-type]
        clean = verbs.verify_storage(ctx)
        assert clean.problems == ["root-1 is committed but has no checkpoint receipt"]
        assert clean.checked == 1

        btrfsutil.delete_subvolume(str(w))
        pool.create_subvolume(w)  # the same path, another subvolume
        stray = pool.w_path(run_id, "other", 1)
        pool.create_subvolume(stray)
        problems = verbs.verify_storage(ctx).problems
        assert any(p.startswith(f"foreign subvolume at {w}: ") for p in problems)
        assert f"subvolume {stray} has no receipt" in problems
    finally:
        store.close()
