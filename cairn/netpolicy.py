"""Agent network modes and allowlist entries: one definition for review, broker and units.

Static review (:mod:`cairn.workflow.review`) accepts an agent's ``network=`` and
``allowlist=`` with these rules, and the root broker (:mod:`cairn.broker.units`) checks the
run's review against the same rules before it starts the allowlist proxy, so a workflow
that passes review is never refused at agent start for its network declaration.

An allowlist entry is what the proxy (:mod:`cairn.proxy`) reads: ``host`` (ports 80 and
443), ``host:port`` (that port only) or ``*.domain`` (every subdomain of ``domain``, ports
80 and 443). A host is one or more DNS labels of ASCII letters, digits and inner hyphens,
each at most 63 characters, at most 253 characters in all; IPv4 literals fit that form. A
port is 1 to 65535. ``*.domain:port`` is refused: the proxy matches subdomains on ports 80
and 443 only, so the port would never be reached. Letters may be upper or lower case (the
proxy compares them case-insensitively); nothing else is allowed, no whitespace either.

Imports only the standard library: the root broker imports this module.
"""

from __future__ import annotations

import re
from typing import Literal, TypeGuard

NetworkMode = Literal["none", "allowlist", "host"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "allowlist", "host")

MAX_HOST_LENGTH = 253
MAX_PORT = 65535
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
# Explicit ASCII classes, no re.IGNORECASE: with it, [a-z] would also match 'K' (U+212A).
ALLOWLIST_ENTRY = re.compile(
    rf"\*\.(?P<domain>{_HOST})|(?P<host>{_HOST})(?::(?P<port>[0-9]{{1,5}}))?"
)


def is_allowlist_entry(entry: object) -> TypeGuard[str]:
    """True when ``entry`` is an allowlist entry review and broker both accept, exactly as
    given (no stripping): ``host``, ``host:port`` or ``*.domain``."""
    if not isinstance(entry, str):
        return False
    match = ALLOWLIST_ENTRY.fullmatch(entry)
    if match is None:
        return False
    host = match["domain"] or match["host"]
    if len(host) > MAX_HOST_LENGTH:
        return False
    port = match["port"]
    return port is None or 1 <= int(port) <= MAX_PORT


PROXY_PORT = 3128  # the allowlist proxy's port inside the run's namespace, on its loopback


def proxy_environment(port: int = PROXY_PORT) -> dict[str, str]:
    """What an allowlist agent's tools read to find the proxy (:mod:`cairn.proxy`)."""
    url = f"http://127.0.0.1:{port}"
    return {
        "HTTPS_PROXY": url,
        "HTTP_PROXY": url,
        "https_proxy": url,
        "http_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
    }
