"""cairn-egress RUN_ID: the run's only way out to its model providers.

The coordinator has no network (``PrivateNetwork=yes``); this process, run by
``cairn-egress@RUN_ID.service`` as user ``cairn`` (not for a run without model
providers: the unit's ``ConditionPathExists=!`` names a flag the broker makes for one),
has network and nothing else. It listens on ``/run/cairn/egress/<run>/egress.sock`` and
admits ``CONNECT host:port`` only to the provider endpoints frozen in the run's launch
description. TLS runs end to end between the coordinator's relay and the provider, so no
key or prompt passes here in clear text when the provider speaks HTTPS.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from urllib.parse import urlsplit

from cairn import journald, paths
from cairn.errors import CairnError
from cairn.journal.reader import JournalReader
from cairn.protocol.launch import LaunchDescription, ModelRoute
from cairn.protocol.names import is_run_id
from cairn.proxy import Allowlist, AllowlistProxy

log = logging.getLogger("cairn.egress")


def notify_ready() -> None:
    """Tell systemd a ``Type=notify`` service is ready (a no-op when not run by systemd)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(b"READY=1")


def endpoint(route: ModelRoute) -> tuple[str, int]:
    """The host and port the relay reaches ``route`` on."""
    url = urlsplit(route.base_url)
    if url.hostname is None:
        raise CairnError(f"provider {route.provider} has no host in {route.base_url}")
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def allowlist(desc: LaunchDescription) -> list[str]:
    entries = []
    for route in desc.routes.values():
        host, port = endpoint(route)
        entries.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return sorted(set(entries))


def serve(run_id: str) -> int:
    with JournalReader(paths.journal_path()) as journal:
        desc = journal.launch_description(run_id)
    entries = allowlist(desc)
    if not entries:
        log.info("run %s uses no model provider; nothing to serve", run_id)
        notify_ready()
        return 0
    path = paths.egress_socket(run_id)
    if path.is_socket():
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)  # the coordinator runs as the same user; nobody else
    listener.listen(64)
    log.info("egress for %s admits %s", run_id, ", ".join(entries))
    notify_ready()
    AllowlistProxy(listener, Allowlist(entries)).serve_forever()
    return 0


def main() -> None:
    journald.setup_logging()
    if len(sys.argv) != 2 or not is_run_id(sys.argv[1]):
        print("usage: cairn-egress flow_<32 hex>", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(serve(sys.argv[1]))
    except CairnError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
