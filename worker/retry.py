"""When and how long the ``llm`` agent waits before repeating a model call.

A call is repeated when the answer says the same request may succeed later: HTTP 429 (a
rate limit), 408, any 5xx (the provider or the relay's way to it failed), or the relay's
socket refusing or dropping the connection (the coordinator restarting). A refusal for
the run's token budget or the provider account's quota (429 ``insufficient_quota``) and
every other 4xx end the call at once.

The wait is the answer's ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP-date)
when it has one, else exponential backoff with jitter; both are capped. The clock, the
waiter and the jitter source are injected so tests run without waiting.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime

RETRY_STATUSES = frozenset({408, 429})
QUOTA_CODE = "insufficient_quota"


def retryable_status(status: int, error_code: str | None) -> bool:
    """Whether a reply with ``status`` (and error ``code``) may succeed if sent again."""
    if status == 429 and error_code == QUOTA_CODE:
        return False
    return status in RETRY_STATUSES or 500 <= status <= 599


def retry_after(headers: dict[str, str], now: float) -> float | None:
    """Seconds the server asks to wait: ``retry-after-ms``, else ``Retry-After`` as
    seconds or an HTTP-date (relative to ``now``, never negative); None if absent or
    unreadable. ``headers`` has lower-case names."""
    millis = headers.get("retry-after-ms", "").strip()
    if millis:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = -1.0
        if 0 <= value < float("inf"):
            return value
    text = headers.get("retry-after", "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000" or no zone: HTTP dates are GMT anyway
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - now)
    return seconds if 0 <= seconds < float("inf") else None


@dataclass
class Backoff:
    """How many times a model call is tried and how long to wait between tries."""

    attempts: int = 5
    base: float = 1.0
    factor: float = 2.0
    cap: float = 60.0
    wait: Callable[[float], None] = time.sleep
    now: Callable[[], float] = time.time
    jitter: Callable[[], float] = field(default_factory=lambda: random.Random().random)  # noqa: S311

    def delay(self, retry: int, advised: float | None) -> float:
        """Seconds before retry number ``retry`` (1 for the first): the server's advice,
        else ``base * factor**(retry-1)`` with the upper half jittered; at most ``cap``."""
        if advised is not None:
            return min(self.cap, advised)
        ceiling = min(self.cap, self.base * self.factor ** (retry - 1))
        return ceiling * (0.5 + 0.5 * self.jitter())
