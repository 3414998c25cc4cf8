"""Sliding-window rate limiting for requests and tokens per minute.

A token bucket lets up to twice its rate through in some 60-second windows (a full bucket, then
the refill); providers count requests and tokens per window, so a judge that must stay under a
quota keeps a log instead: at most `limit` units are granted in any `period`-second window.

The limiter is usable from any thread and any event loop (a threading lock guards the log and
waiting is an `asyncio.sleep`), so one judge object can serve several `asyncio.run` calls.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from collections.abc import Callable


class Reservation:
    """Units granted by `SlidingWindowLimiter.acquire`; `settle` corrects an estimate afterwards."""

    __slots__ = ("_entry", "_limiter")

    def __init__(self, limiter: SlidingWindowLimiter, entry: list) -> None:
        self._limiter = limiter
        self._entry = entry

    @property
    def amount(self) -> float:
        return self._entry[1]

    def settle(self, actual: float) -> None:
        """Replaces the reserved amount by `actual` (e.g. the tokens the server reported using)."""
        if not isinstance(actual, (int, float)) or isinstance(actual, bool) or not math.isfinite(actual) or actual < 0:
            raise ValueError(f"actual must be a finite number >= 0, got {actual!r}")
        with self._limiter._lock:
            self._entry[1] = float(actual)


class SlidingWindowLimiter:
    """Grants at most `limit` units in any window of `period` seconds.

    `acquire(amount)` waits until the units granted in the last `period` seconds plus `amount`
    fit under `limit`. An amount larger than `limit` is granted once the window is empty (it
    could never fit; refusing would deadlock), so a single oversized request still goes through.
    """

    def __init__(
        self,
        limit: float,
        period: float = 60.0,
        *,
        argument: str = "limit",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
            raise ValueError(f"{argument} must be a positive number, got {limit!r}")
        if isinstance(period, bool) or not isinstance(period, (int, float)) or not math.isfinite(period) or period <= 0:
            raise ValueError(f"period must be a positive number of seconds, got {period!r}")
        self.limit = float(limit)
        self.period = float(period)
        self._clock = clock
        self._lock = threading.Lock()
        self._log: collections.deque[list] = collections.deque()  # [time granted, amount]

    def __repr__(self) -> str:
        return f"SlidingWindowLimiter(limit={self.limit:g}, period={self.period:g})"

    def _try_acquire(self, amount: float) -> Reservation | float:
        """A reservation, or how long to wait before trying again."""
        with self._lock:
            now = self._clock()
            while self._log and self._log[0][0] <= now - self.period:
                self._log.popleft()
            used = sum(entry[1] for entry in self._log)
            if used + amount <= self.limit or not self._log:
                entry = [now, float(amount)]
                self._log.append(entry)
                return Reservation(self, entry)
            # Wait until enough of the oldest grants leave the window.
            needed = used + amount - self.limit
            freed = 0.0
            for granted_at, granted in self._log:
                freed += granted
                if freed >= needed:
                    return max(granted_at + self.period - now, 0.0) + 1e-3
            return max(self._log[-1][0] + self.period - now, 0.0) + 1e-3

    async def acquire(self, amount: float = 1.0) -> Reservation:
        """Waits (asynchronously) until `amount` units fit in the window, then records them."""
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise ValueError(f"amount must be a finite number >= 0, got {amount!r}")
        while True:
            outcome = self._try_acquire(float(amount))
            if isinstance(outcome, Reservation):
                return outcome
            await asyncio.sleep(outcome)

    def in_window(self) -> float:
        """Units granted within the last `period` seconds."""
        with self._lock:
            now = self._clock()
            return sum(amount for granted_at, amount in self._log if granted_at > now - self.period)
