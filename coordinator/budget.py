"""The run's model budgets, apart from the relay: every coordinator holds them, and only a
run whose agents reach a model starts a relay (and loads its HTTP and TLS code).

Tokens are counted per run. Money is counted in micro-units (millionths) of the currency
the host's provider prices are in, per run and per owner per day; the day's total is the
journal's (``model_cost_days``), so runs of one owner share it, also across restarts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cairn.providers import MICROS_PER_CENT, money


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


@dataclass(frozen=True)
class Spent:
    """A spent money budget: which (``reason``, a clause) and what a person can do."""

    reason: str
    hint: str


class MoneyBudget:
    """The run's money budget and its owner's daily one (either may be None: no limit),
    shared by every relay of the run (thread-safe). ``spent_today`` reads what the owner
    has spent today over all runs, this one's charges included once recorded.

    A call first holds what it may cost at most (:meth:`hold`), so calls made at once
    cannot together pass the budget; the hold is given back (:meth:`release`) once the
    call's real cost is charged (:meth:`charge`)."""

    def __init__(
        self,
        limit_cents: int | None,
        used_micros: int = 0,
        *,
        daily_cents: int | None = None,
        spent_today: Callable[[], int] = lambda: 0,
    ) -> None:
        self.limit = None if limit_cents is None else limit_cents * MICROS_PER_CENT
        self.daily = None if daily_cents is None else daily_cents * MICROS_PER_CENT
        self.used = used_micros
        self.held = 0
        self.short = False  # the last call the money left could not pay
        self.spent_today = spent_today
        self._lock = threading.Lock()

    def charge(self, micros: int) -> None:
        with self._lock:
            self.used += micros

    def _left(self) -> int | None:
        """Micro-units still free (None: no limit applies); called under the lock."""
        left = []
        if self.limit is not None:
            left.append(self.limit - self.used - self.held)
        if self.daily is not None:
            left.append(self.daily - self.spent_today() - self.held)
        return max(0, min(left)) if left else None

    def hold(self, input_micros: int, output_price: float, tokens: int) -> tuple[int, int]:
        """Of ``tokens`` output tokens a call may produce, how many the money left buys
        once its input (``input_micros``) is paid, at ``output_price`` micro-units per
        token; and the micro-units held for it (the call's most), until :meth:`release`.
        (0, 0): the money left does not pay for the call."""
        with self._lock:
            left = self._left()
            if left is None:
                return tokens, 0
            cap = 0 if left <= input_micros else tokens if not output_price else \
                min(tokens, int((left - input_micros) / output_price))
            self.short = cap <= 0 and self.held == 0  # no call of this run holds money
            if cap <= 0:
                return 0, 0
            held = input_micros + math.ceil(cap * output_price)
            self.held += held
            return cap, held

    def release(self, held: int) -> None:
        with self._lock:
            self.held -= held

    def remaining(self) -> int | None:
        """Micro-units this run may still spend (None: no limit applies)."""
        with self._lock:
            return self._left()

    def spent(self) -> Spent | None:
        """Which budget is spent, or None while both have money left."""
        if self.limit is not None:
            with self._lock:
                if self.used >= self.limit:
                    return Spent(f"the run's model money budget ({money(self.limit)}) is spent",
                                 "launch again with a larger limits.model_cost_cents")
        if self.daily is not None and self.spent_today() >= self.daily:
            return Spent(
                f"the owner's daily model money budget ({money(self.daily)}) is spent",
                "it starts again tomorrow; the host sets it in /etc/cairn/admission.toml "
                "(max_daily_cost_cents_per_user)",
            )
        if self.short:
            return Spent("the model money left does not pay for a call",
                         "launch again with a larger limits.model_cost_cents, or, when the "
                         "owner's daily budget is what is left, tomorrow")
        return None
