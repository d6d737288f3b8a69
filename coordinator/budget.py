"""The run's model-token budget, apart from the relay: every coordinator holds one, and
only a run whose agents reach a model starts a relay (and loads its HTTP and TLS code)."""

from __future__ import annotations

import threading


class TokenBudget:
    """The run's model-token budget, shared by every relay of the run (thread-safe)."""

    def __init__(self, limit: int, used: int = 0) -> None:
        self.limit = limit
        self.used = used
        self._lock = threading.Lock()

    def remaining(self) -> int:
        with self._lock:
            return max(0, self.limit - self.used)

    def charge(self, tokens: int) -> None:
        with self._lock:
            self.used += tokens

    @property
    def exhausted(self) -> bool:
        return self.remaining() == 0
