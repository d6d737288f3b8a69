"""cairn-broker: the root broker, socket-activated by cairn-broker.socket."""

from __future__ import annotations

import logging
import os
import socket
import sys

from cairn import journald, paths
from cairn.broker.server import BrokerServer, listener_from_systemd


def main() -> None:
    journald.setup_logging()
    listener = listener_from_systemd()
    if listener is None:
        # Started by hand (tests): bind the socket ourselves, same permissions.
        path = paths.broker_socket()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o660)
        listener.listen(16)
    logging.getLogger("cairn.broker").info("broker ready")
    try:
        BrokerServer(listener).serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
