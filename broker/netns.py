"""Per-run network namespaces for ``allowlist`` agents (root, pyroute2).

The namespace has only ``lo`` and no route anywhere. Its one way out is the allowlist
proxy (:mod:`cairn.proxy`), whose listening socket is created inside the namespace on
``127.0.0.1:PROXY_PORT`` while the proxy process itself stays in the host's namespace.
No veth pair is needed, so no host address is exposed to the agent: a veth's host end
would make every host service on a wildcard address reachable unless a firewall closed
it again. Agent units join the namespace with ``NetworkNamespacePath=``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pyroute2 import NetNS, netns

from cairn.errors import BrokerRefused
from cairn.paths import RUN_ID_RE

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
PROXY_PORT = 3128


def netns_name(run_id: str) -> str:
    if not RUN_ID_RE.fullmatch(run_id):
        raise BrokerRefused(f"invalid run id {run_id!r}")
    return f"cairn-{run_id}"


def netns_path(run_id: str) -> Path:
    return NETNS_DIR / netns_name(run_id)


def proxy_environment(port: int = PROXY_PORT) -> dict[str, str]:
    """What an allowlist agent's tools read to find the proxy."""
    url = f"http://127.0.0.1:{port}"
    return {
        "HTTPS_PROXY": url,
        "HTTP_PROXY": url,
        "https_proxy": url,
        "http_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
    }


def create_netns(run_id: str) -> Path:
    """Create the run's namespace with ``lo`` up (idempotent); return its path."""
    name = netns_name(run_id)
    if name not in netns.listnetns():
        netns.create(name)
        log.info("created network namespace %s", name)
    ns = NetNS(name)
    try:
        (lo,) = ns.link_lookup(ifname="lo")
        ns.link("set", index=lo, state="up")
        links = [link.get_attr("IFLA_IFNAME") for link in ns.get_links()]
    finally:
        ns.close()
    if links != ["lo"]:
        raise BrokerRefused(f"network namespace {name} has unexpected links: {links}")
    return netns_path(run_id)


def remove_netns(run_id: str) -> bool:
    """Remove the run's namespace if it exists; True if it did."""
    name = netns_name(run_id)
    if name not in netns.listnetns():
        return False
    netns.remove(name)
    log.info("removed network namespace %s", name)
    return True
