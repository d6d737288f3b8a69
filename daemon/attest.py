"""Starting a run on its owner's word (ARCHITECTURE §7): cairnd shows the owner's CLI the
description it froze, over the attestation channel the CLI passed with its request, and
hands that channel to the broker, which pins the description only if the owner's own
process attests its hash. cairnd never writes the attestation and never reads it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from cairn.brokerclient import call_broker
from cairn.errors import PermissionDenied, Unavailable
from cairn.protocol.attestation import ATTESTATION_TIMEOUT_SEC, DESCRIPTION_LIMIT
from cairn.protocol.broker import BrokerReply
from cairn.protocol.launch import LaunchDescription

_channel: ContextVar[int | None] = ContextVar("attestation_channel", default=None)


@contextmanager
def serving(channel: int | None) -> Iterator[None]:
    """Make ``channel`` (or None) the attestation channel of the request being served."""
    token = _channel.set(channel)
    try:
        yield
    finally:
        _channel.reset(token)


def require_channel() -> int:
    """The attestation channel of the request being served; a request that may start a
    run and carries none is refused before anything is recorded."""
    channel = _channel.get()
    if channel is None:
        raise PermissionDenied(
            "a run is started only on its owner's attestation, and this request carries none",
            hint="use the cairn CLI of the installed package",
        )
    return channel


def start_attested(desc: LaunchDescription, *, timeout: float = 120.0) -> BrokerReply:
    """Show the owner ``desc`` and have the broker pin it on the owner's attestation, then
    carry out the run's pending ``launch-v1`` intents."""
    channel = require_channel()
    data = desc.model_dump_json().encode() + b"\n"
    if len(data) > DESCRIPTION_LIMIT:
        raise PermissionDenied(f"the description of {desc.run_id} is too large to attest")
    with socket.socket(fileno=os.dup(channel)) as sock:
        sock.settimeout(ATTESTATION_TIMEOUT_SEC)
        try:
            sock.sendall(data)
        except OSError as exc:
            raise Unavailable(
                f"the owner's CLI did not take the description of {desc.run_id}: {exc}"
            ) from exc
    return call_broker("launch-v1", desc.run_id, timeout=timeout, attestation=channel)
