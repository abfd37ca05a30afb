"""Time as the search layer sees it: a monotonic ``now()`` and an awaitable ``sleep()``.

Backends, the rate limiter and the retry loop take a clock instead of calling ``time`` and
``asyncio.sleep`` directly, so that replayed runs and tests can use virtual time: waiting for a
``Retry-After`` of 30 s then costs nothing, and the latency it adds is still reported.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return "RealClock()"


class VirtualClock:
    """Time that only moves when someone sleeps, and then instantly.

    ``sleep(d)`` yields to the event loop once and moves the clock to ``now_at_call + d``
    unless it is already later, so concurrent sleepers end up at the latest wake-up time
    (as they would in real time) rather than at the sum of their sleeps.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        wake_at = self._now + max(0.0, seconds)
        await asyncio.sleep(0)
        self._now = max(self._now, wake_at)

    def advance(self, seconds: float) -> None:
        """Move time forward without sleeping (for tests)."""
        if seconds < 0:
            raise ValueError(f"VirtualClock.advance: seconds must be >= 0, got {seconds}")
        self._now += seconds

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now:.3f})"
