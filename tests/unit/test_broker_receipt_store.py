"""The broker's receipts store under a burst of request threads: one connection per
process, shared under a lock, so no thread waits on SQLite's busy timeout and none fails
with "database is locked" however slow each commit is; replaced when the file is."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn import paths
from cairn.broker import receipts
from cairn.broker.receipts import ReceiptStore
from cairn.protocol.broker import Intent, RunDeleted

THREADS = 32
PER_THREAD = 20


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CAIRN_ROOT", str(tmp_path))
    # A commit slower than the busy timeout, as on a loaded disk: any wait in SQLite
    # for another connection of this process fails at once.
    monkeypatch.setattr(ReceiptStore, "busy_timeout", 0.0)
    yield
    receipts.shared().close()


def delete_intent(thread: int, n: int) -> tuple[Intent, RunDeleted]:
    run_id = f"flow_{thread:032x}"
    intent = Intent(intent_id=f"delete-run.{n}", run_id=run_id, kind="delete-run")
    return intent, RunDeleted(deleted=[f"{run_id}/W/root.{n}"])


def burst(store_for_thread: Callable[[], ReceiptStore]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        try:
            for n in range(PER_THREAD):
                store = store_for_thread()
                intent, body = delete_intent(thread, n)
                assert store.get(intent.run_id, intent.intent_id) is None
                store.put(intent, body)
                assert store.for_run(intent.run_id)[-1].intent_id == intent.intent_id
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_a_burst_of_requests_on_the_shared_store_never_meets_a_locked_database() -> None:
    assert burst(receipts.shared) == []
    rows = receipts.shared().db.execute("SELECT count(*) FROM receipts").fetchone()[0]
    assert rows == THREADS * PER_THREAD


def test_a_connection_per_request_does_meet_it() -> None:
    """The failure the shared store removes, shown with the same burst."""
    opened: list[ReceiptStore] = []

    def fresh() -> ReceiptStore:
        opened.append(ReceiptStore())
        return opened[-1]

    errors = burst(fresh)
    for store in opened:
        store.close()
    assert any(isinstance(e, sqlite3.OperationalError) and "locked" in str(e) for e in errors)


def test_every_thread_gets_the_same_store_until_the_file_is_replaced(tmp_path: Path) -> None:
    seen: set[int] = set()
    threads = [threading.Thread(target=lambda: seen.add(id(receipts.shared())))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1
    first = receipts.shared()
    intent, body = delete_intent(1, 1)
    first.put(intent, body)

    os.rename(paths.broker_db_path(), tmp_path / "moved.db")
    replaced = receipts.shared()
    assert replaced is not first and replaced.get(intent.run_id, intent.intent_id) is None
