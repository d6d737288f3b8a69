"""cairnd: socket-activated by cairn.socket; runs as the cairn user."""

from __future__ import annotations

import logging
import threading
import time

from cairn import journald, paths
from cairn.daemon.expiry import run_timer
from cairn.daemon.interactions import start_coordinator
from cairn.daemon.reconcile import reconcile
from cairn.daemon.server import serve
from cairn.errors import CairnError
from cairn.journal.readwrite import Journal
from cairn.protocol.daemon import build_models
from cairn.sockets import listener


def main() -> None:
    journald.setup_logging()
    started_at = time.time()  # before any request: runs launched from now on are ours
    Journal(paths.journal_path(), create=True).close()  # create or migrate the schema
    sock = listener(paths.daemon_socket(), 0o666)
    build_models()  # before any thread uses one
    threading.Thread(target=reconcile_at_start, args=(started_at,), daemon=True).start()
    threading.Thread(
        target=run_timer, args=(time.time, start_coordinator, threading.Event()),
        name="approval-timer", daemon=True,
    ).start()
    logging.getLogger("cairn.daemon").info("cairnd ready")
    serve(sock)


def reconcile_at_start(started_at: float) -> None:
    journal = Journal(paths.journal_path())
    try:
        reconcile(journal, started_at=started_at)
    except CairnError as exc:
        logging.getLogger("cairn.daemon").error("reconciler: %s", exc)
    finally:
        journal.close()


if __name__ == "__main__":
    main()
