"""Rate limiter, backoff and Retry-After, on a fake clock."""

from __future__ import annotations

import asyncio
import bisect
import random

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.search.clock import VirtualClock
from searchr1.search.limits import Backoff, StartRateLimiter, parse_retry_after
from searchr1.search.testing import mock_backend


def max_starts_in_any_window(starts: list[float], window: float = 60.0) -> int:
    """Largest number of starts inside any half-open window [t, t + window)."""
    ordered = sorted(starts)
    best = 0
    for i, start in enumerate(ordered):
        j = bisect.bisect_left(ordered, start + window)
        best = max(best, j - i)
    return best


arrival_gaps = st.lists(st.floats(min_value=0.0, max_value=20.0, allow_nan=False), min_size=1, max_size=400)
pauses = st.lists(st.one_of(st.none(), st.floats(min_value=0.1, max_value=30.0)), min_size=0, max_size=400)


@settings(max_examples=80, deadline=None)
@given(rpm=st.integers(min_value=1, max_value=300), gaps=arrival_gaps, pause_plan=pauses)
def test_rate_limiter_never_exceeds_rpm_in_any_window(rpm, gaps, pause_plan):
    clock = VirtualClock()
    limiter = StartRateLimiter(rpm, clock=clock)
    starts = []
    for n, gap in enumerate(gaps):
        clock.advance(gap)
        if n < len(pause_plan) and pause_plan[n] is not None:
            limiter.pause_for(pause_plan[n])
        starts.append(limiter.reserve())
    assert max_starts_in_any_window(starts) <= rpm


@settings(max_examples=80, deadline=None)
@given(rpm=st.integers(min_value=1, max_value=300), gaps=arrival_gaps, pause_plan=pauses)
def test_rate_limiter_never_starts_before_arrival_or_before_a_pause_ends(rpm, gaps, pause_plan):
    clock = VirtualClock()
    limiter = StartRateLimiter(rpm, clock=clock)
    previous = float("-inf")
    for n, gap in enumerate(gaps):
        clock.advance(gap)
        pause_end = None
        if n < len(pause_plan) and pause_plan[n] is not None:
            limiter.pause_for(pause_plan[n])
            pause_end = clock.now() + pause_plan[n]
        start = limiter.reserve()
        assert start >= clock.now()
        assert start >= previous  # first come, first served
        if pause_end is not None:
            assert start >= pause_end
        previous = start


@settings(max_examples=40, deadline=None)
@given(rpm=st.integers(min_value=1, max_value=400), minutes=st.integers(min_value=1, max_value=6))
def test_saturated_rate_limiter_achieves_at_least_95_percent_of_rpm(rpm, minutes):
    clock = VirtualClock()
    limiter = StartRateLimiter(rpm, clock=clock)
    starts = [limiter.reserve() for _ in range(rpm * minutes * 2)]  # always more demand than supply
    horizon = 60.0 * minutes
    started = sum(1 for s in starts if s < horizon)
    assert started >= 0.95 * rpm * minutes
    assert max_starts_in_any_window(starts) <= rpm


async def test_concurrent_acquires_on_a_virtual_clock_respect_the_window():
    clock = VirtualClock()
    limiter = StartRateLimiter(120, clock=clock)
    granted = []

    async def one():
        start = await limiter.acquire()
        granted.append((start, clock.now()))

    await asyncio.gather(*(one() for _ in range(500)))
    starts = [s for s, _ in granted]
    assert max_starts_in_any_window(starts) <= 120
    assert all(now >= start for start, now in granted)  # nobody ran before its slot
    assert sum(1 for s in starts if s < 240.0) >= 0.95 * 120 * 4


def test_rate_limiter_rejects_nonpositive_rate():
    with pytest.raises(ValueError, match="requests per minute"):
        StartRateLimiter(0)


def test_backoff_grows_exponentially_and_is_capped():
    backoff = Backoff(base=1.0, factor=2.0, cap=5.0, jitter=0.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="1-based"):
        backoff.delay(0)


@given(attempt=st.integers(min_value=1, max_value=20), seed=st.integers(min_value=0, max_value=2**16))
def test_backoff_jitter_stays_within_its_fraction(attempt, seed):
    plain = Backoff(jitter=0.0).delay(attempt)
    jittered = Backoff(jitter=0.25, rng=random.Random(seed)).delay(attempt)
    assert plain <= jittered <= plain * 1.25


@pytest.mark.parametrize(
    ("header", "expected"),
    [("5", 5.0), (" 2.5 ", 2.5), ("0", 0.0), ("-3", 0.0), ("", None), (None, None), ("soon", None)],
)
def test_parse_retry_after_seconds(header, expected):
    assert parse_retry_after(header) == expected


def test_parse_retry_after_http_date_is_relative_to_now():
    # 2026-01-01T00:00:10Z, ten seconds after the reference time
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:10 GMT", now_epoch=1767225600.0) == pytest.approx(10.0)
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:10 GMT", now_epoch=1767225700.0) == 0.0


async def test_wikipedia_retry_after_holds_back_every_later_request():
    """A 429 with Retry-After 7 pauses the shared limiter: no request that starts after the 429
    was answered may start before 7 virtual seconds have passed."""
    clock = VirtualClock()
    log: list[tuple[str, float]] = []
    served_429 = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["gsrsearch"]
        log.append((query, clock.now()))
        if query == "first" and not served_429:
            served_429.append(clock.now())
            return httpx.Response(429, headers={"Retry-After": "7"})
        return httpx.Response(200, json={"batchcomplete": True})

    backend = mock_backend("wikipedia", handler, clock=clock)
    async with backend:
        results = await asyncio.gather(*(backend.search(q) for q in ["first", "second", "third", "fourth"]))
    assert all(r.ok for r in results)
    t429 = served_429[0]
    retry_times = [t for q, t in log if q == "first"]
    assert retry_times[1] >= t429 + 7
    order = [entry for entry in log]
    index_429 = order.index(("first", t429))
    assert all(t >= t429 + 7 for _, t in order[index_429 + 1 :])
    assert backend.stats.drain()["search/429_rate"] == pytest.approx(0.25)
