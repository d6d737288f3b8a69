"""cairnd: socket-activated by cairn.socket; runs as the cairn user."""

from __future__ import annotations

import logging
import os
import socket

from cairn import journald, paths
from cairn.daemon.server import serve
from cairn.journal import Journal


def main() -> None:
    journald.setup_logging()
    Journal(paths.journal_path(), create=True).close()  # create or migrate the schema
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        listener = socket.socket(fileno=3)
    else:
        path = paths.daemon_socket()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o666)
        listener.listen(64)
    logging.getLogger("cairn.daemon").info("cairnd ready")
    serve(listener)


if __name__ == "__main__":
    main()
