"""Fixtures shared by unit tests of more than one process."""

from __future__ import annotations

import queue
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

import attested  # noqa: E402


@pytest.fixture
def owner_channel() -> Iterator[queue.Queue[bytes]]:
    """cairnd serving requests that carry their owner's attestation channel."""
    with attested.owner_channel() as shown:
        yield shown
