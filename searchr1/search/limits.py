"""Politeness limits: a shared start-rate limiter, exponential backoff, ``Retry-After``.

The limiter bounds how many requests *start* in any 60-second window (Wikipedia asks for
about 200 per minute from identified clients); the concurrency cap (a semaphore in the
backend) bounds how many are in flight. Both take an injectable clock so they can be tested,
and replayed, in virtual time.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from searchr1.search.clock import Clock, RealClock

WINDOW_SECONDS = 60.0


class StartRateLimiter:
    """At most ``per_minute`` request starts in any half-open window ``[t, t + 60 s)``.

    Starts are spread evenly (one every ``60 / per_minute`` seconds) rather than allowed in a
    burst, and a log of the last ``per_minute`` start times guarantees the window bound
    exactly, whatever floating-point drift the spacing accumulates. ``pause_for`` (a server's
    ``Retry-After``) holds back every start, from every caller sharing the limiter, until the
    pause ends. Reservations are granted first come, first served.
    """

    def __init__(self, per_minute: float, clock: Clock | None = None) -> None:
        if not per_minute or per_minute <= 0:
            raise ValueError(f"rate limit must be > 0 requests per minute, got {per_minute!r}")
        self.per_minute = float(per_minute)
        self.clock = clock or RealClock()
        self._interval = WINDOW_SECONDS / self.per_minute
        self._capacity = max(1, int(self.per_minute))
        self._recent: deque[float] = deque(maxlen=self._capacity)
        self._next_start = float("-inf")
        self._paused_until = float("-inf")

    def reserve(self) -> float:
        """Book the earliest allowed start time (>= now) and return it; does not wait."""
        start = max(self.clock.now(), self._next_start, self._paused_until)
        if len(self._recent) == self._capacity:
            start = max(start, self._recent[0] + WINDOW_SECONDS)
        self._recent.append(start)
        self._next_start = start + self._interval
        return start

    async def acquire(self) -> float:
        """Wait until this caller may start a request; returns the granted start time."""
        while True:
            start = self.reserve()
            await self.clock.sleep(start - self.clock.now())
            if self.clock.now() >= self._paused_until:
                return start
            # A pause arrived while we waited: the booked slot is forfeited (that only makes
            # the limiter more conservative) and we queue again behind the pause.

    def pause_for(self, seconds: float) -> None:
        """Hold back all new starts for ``seconds`` from now (e.g. a ``Retry-After``)."""
        if seconds > 0:
            self._paused_until = max(self._paused_until, self.clock.now() + seconds)

    @property
    def paused_until(self) -> float:
        return self._paused_until

    def __repr__(self) -> str:
        return f"StartRateLimiter(per_minute={self.per_minute:g})"


@dataclass
class Backoff:
    """Delay before retry number ``attempt`` (1-based): ``base * factor**(attempt-1)``,
    capped, plus up to ``jitter`` of itself at random (``rng`` is injectable so replays are
    deterministic)."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.1
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def delay(self, attempt: int) -> float:
        if attempt < 1:
            raise ValueError(f"Backoff.delay: attempt is 1-based, got {attempt}")
        raw = min(self.cap, self.base * self.factor ** (attempt - 1))
        return raw * (1.0 + self.jitter * self.rng.random())


def parse_retry_after(value: str | None, *, now_epoch: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    Returns ``None`` for a missing or unparseable value, 0.0 for a date in the past.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        return max(0.0, seconds) if seconds == seconds else None  # NaN -> None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    reference = time.time() if now_epoch is None else now_epoch
    return max(0.0, when.timestamp() - reference)
