"""cairn-broker: the root broker, socket-activated by cairn-broker.socket."""

from __future__ import annotations

import logging

from cairn import journald, paths
from cairn.broker.server import BrokerServer
from cairn.broker.verbs import carry_out
from cairn.protocol.base import build_loaded_models
from cairn.sockets import listener


def main() -> None:
    journald.setup_logging()
    sock = listener(paths.broker_socket(), 0o660)
    build_loaded_models()  # before the request threads use one
    logging.getLogger("cairn.broker").info("broker ready")
    BrokerServer(sock, carry_out).serve_forever()


if __name__ == "__main__":
    main()
