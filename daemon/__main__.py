"""cairnd: socket-activated by cairn.socket; runs as the cairn user."""

from __future__ import annotations

import logging

from cairn import journald, paths
from cairn.daemon.server import serve
from cairn.journal import Journal
from cairn.sockets import listener


def main() -> None:
    journald.setup_logging()
    Journal(paths.journal_path(), create=True).close()  # create or migrate the schema
    sock = listener(paths.daemon_socket(), 0o666)
    logging.getLogger("cairn.daemon").info("cairnd ready")
    serve(sock)


if __name__ == "__main__":
    main()
