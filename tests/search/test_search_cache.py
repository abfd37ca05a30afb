"""Persistent cache, single-flight, concurrency cap and per-window stats."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.search.cache import QueryCache, cache_key, normalise_query
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.singleflight import SingleFlight
from searchr1.core.types import ReportedUsage
from searchr1.search.stats import CallRecord, SearchStats, percentile
from searchr1.search.testing import mock_backend
from searchr1.core.types import SearchItem, SearchResult

RESULTS = {"results": [{"title": "Canberra", "text": "Canberra is the capital of Australia."}]}


class Counting:
    """A handler that answers every query with RESULTS (or a given status) and counts requests."""

    def __init__(self, backend: str, statuses=(), delay: float = 0.0):
        self.service = FakeSearchService(backend, {})
        self.statuses = list(statuses)
        self.calls = 0
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if self.statuses:
            return httpx.Response(self.statuses.pop(0))
        return self.service.render(RESULTS, request, "q")


@pytest.mark.parametrize("name", ["wikipedia", "zhihu", "deepseek", "retriever"])
async def test_concurrent_identical_queries_share_one_request(name):
    handler = Counting(name, delay=0.01)
    async with mock_backend(name, handler) as backend:
        results = await asyncio.gather(*(backend.search("capital of Australia") for _ in range(8)))
    assert handler.calls == 1
    assert all(r.ok and r.items == results[0].items for r in results)
    assert sum(r.cached for r in results) == 7  # the followers made no request
    metrics = backend.stats.drain()
    assert metrics["search/requests"] == 8 and metrics["search/deduplicated"] == 7
    assert metrics["search/success_rate"] == 1.0


async def test_whitespace_variants_share_the_flight_and_the_cache(tmp_path):
    handler = Counting("retriever", delay=0.01)
    cache = QueryCache(tmp_path / "cache.sqlite")
    async with mock_backend("retriever", handler, cache=cache) as backend:
        await asyncio.gather(
            backend.search("capital of  Australia"), backend.search(" capital of Australia ")
        )
        again = await backend.search("capital\tof Australia")
    assert handler.calls == 1 and again.cached


async def test_cached_query_makes_no_request_even_after_restart(tmp_path):
    path = tmp_path / "cache.sqlite"
    first = Counting("wikipedia")
    async with mock_backend("wikipedia", first, cache=QueryCache(path)) as backend:
        live = await backend.search("capital of Australia")
    second = Counting("wikipedia")
    async with mock_backend("wikipedia", second, cache=QueryCache(path)) as backend:
        replayed = await backend.search("capital of Australia")
        metrics = backend.stats.drain()
    assert first.calls == 1 and second.calls == 0
    assert replayed.cached and replayed.items == live.items and replayed.latency == 0.0
    assert metrics["search/cache_hit_rate"] == 1.0 and metrics["search/results"] == 1.0
    assert metrics["search/latency"] == 0.0  # cache hits are not network latency


async def test_failures_are_not_cached(tmp_path):
    handler = Counting("retriever", statuses=[503])
    async with mock_backend(
        "retriever", handler, cache=QueryCache(tmp_path / "c.sqlite"), max_retries=0
    ) as backend:
        failed = await backend.search("q")
        succeeded = await backend.search("q")
        cached = await backend.search("q")
    assert not failed.ok and succeeded.ok and not succeeded.cached and cached.cached
    assert handler.calls == 2


async def test_cache_key_covers_request_parameters(tmp_path):
    path = tmp_path / "c.sqlite"
    handler = Counting("deepseek")
    async with mock_backend("deepseek", handler, cache=QueryCache(path), model="deepseek-flash") as backend:
        await backend.search("q")
    async with mock_backend(
        "deepseek", handler, cache=QueryCache(path), model="deepseek-v4-flash"
    ) as backend:
        await backend.search("q")
    assert handler.calls == 2


def test_cache_ttl_expires_entries(tmp_path):
    now = [1000.0]
    cache = QueryCache(tmp_path / "c.sqlite", ttl_seconds=60, wall_clock=lambda: now[0])
    result = SearchResult(ok=True, items=(SearchItem("t", "c", "Wikipedia", "u"),))
    cache.put("k", backend="wikipedia", query="q", params={}, result=result)
    now[0] += 59
    assert cache.get("k").items == result.items
    now[0] += 2
    assert cache.get("k") is None
    cache.put("f", backend="wikipedia", query="q", params={}, result=SearchResult(ok=False, error="HTTP 500"))
    assert cache.get("f") is None


def test_cache_rejects_a_file_that_is_not_sqlite(tmp_path):
    bad = tmp_path / "not.sqlite"
    bad.write_text("this is not a database" * 100)
    with pytest.raises(ValueError, match=r"not\.sqlite"):
        QueryCache(bad).get("k")


@given(st.text(max_size=40))
def test_query_normalisation_is_idempotent(text):
    once = normalise_query(text)
    assert normalise_query(once) == once
    assert once == once.strip() and "  " not in once


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_cache_keys_differ_when_normalised_queries_differ(a, b):
    same = normalise_query(a) == normalise_query(b)
    assert (cache_key("wikipedia", a, {}) == cache_key("wikipedia", b, {})) == same


async def test_concurrency_cap_is_enforced_inside_the_backend():
    handler = Counting("retriever", delay=0.02)
    async with mock_backend("retriever", handler, concurrency=4) as backend:
        results = await asyncio.gather(*(backend.search(f"query {n}") for n in range(40)))
    assert all(r.ok for r in results) and handler.calls == 40
    assert handler.max_in_flight == 4


async def test_single_flight_shares_exceptions_and_survives_a_cancelled_leader():
    flights: SingleFlight[int] = SingleFlight()
    release = asyncio.Event()
    runs = []

    async def work():
        runs.append(1)
        await release.wait()
        return 42

    leader = asyncio.ensure_future(flights.run("k", work))
    await asyncio.sleep(0)
    follower = asyncio.ensure_future(flights.run("k", work))
    await asyncio.sleep(0)
    leader.cancel()
    release.set()
    assert await follower == (42, True)
    assert runs == [1] and len(flights) == 0

    async def boom():
        raise RuntimeError("bug")

    outcomes = await asyncio.gather(flights.run("e", boom), flights.run("e", boom), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)


# ----------------------------------------------------------------------------- stats

COMMON = {
    "search/requests",
    "search/success_rate",
    "search/error_rate",
    "search/429_rate",
    "search/timeout_rate",
    "search/results",
    "search/latency",
    "search/latency_p50",
    "search/latency_p95",
    "search/cache_hit_rate",
    "search/deduplicated",
}
TOKENS = {
    "search/input_tokens",
    "search/cache_read_input_tokens",
    "search/output_tokens",
    "search/web_search_requests",
    "search/no_web_search_rate",
}


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("wikipedia", set()),
        ("retriever", set()),
        ("deepseek", TOKENS),
        ("zhihu", {"search/credential_failover_rate"}),
    ],
)
async def test_metric_names_per_backend(name, extra):
    async with mock_backend(name, Counting(name)) as backend:
        await backend.search("q")
        assert set(backend.stats.drain()) == COMMON | extra


def test_drain_reports_the_window_and_resets_it():
    stats = SearchStats("deepseek", token_metrics=True)
    stats.record(CallRecord(ok=True, items=3, latency=1.0, usage=ReportedUsage(100, 20, 30, 1)))
    stats.record(CallRecord(ok=False, latency=3.0, rate_limited=True, usage=ReportedUsage(50, 0, 0, 0)))
    stats.record(CallRecord(ok=True, items=2, origin="cache"))
    stats.record(CallRecord(ok=True, items=2, origin="shared"))
    first = stats.drain()
    assert first["search/requests"] == 4
    assert first["search/success_rate"] == 0.75 and first["search/error_rate"] == 0.25
    assert first["search/429_rate"] == 0.25 and first["search/timeout_rate"] == 0.0
    assert first["search/results"] == (3 + 2 + 2) / 4
    assert first["search/latency"] == 2.0  # network calls only
    assert first["search/cache_hit_rate"] == 0.25 and first["search/deduplicated"] == 1
    assert (first["search/input_tokens"], first["search/cache_read_input_tokens"]) == (150, 20)
    assert (first["search/output_tokens"], first["search/web_search_requests"]) == (30, 1)
    second = stats.drain()
    assert second["search/requests"] == 0
    assert all(value == 0.0 for value in second.values())
    # shares of no calls are absent, not 0 (a plot would draw an outage)
    assert set(first) - set(second) == {"search/success_rate", "search/error_rate", "search/429_rate",
                                        "search/timeout_rate", "search/results", "search/cache_hit_rate",
                                        "search/no_web_search_rate"}


def test_peek_does_not_reset():
    stats = SearchStats("wikipedia")
    stats.record(CallRecord(ok=True, items=1, latency=0.5))
    assert stats.peek()["search/requests"] == 1 and stats.drain()["search/requests"] == 1


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([], 0.5, 0.0),
        ([7.0], 0.95, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
        ([float(v) for v in range(1, 101)], 0.95, 95.0),
        ([float(v) for v in range(1, 21)], 0.95, 19.0),
    ],
)
def test_percentile_is_nearest_rank(values, fraction, expected):
    assert percentile(values, fraction) == expected


async def test_latency_percentiles_come_from_network_calls():
    delays = iter([0.0, 1.0, 2.0, 3.0])

    class Slow(Counting):
        async def __call__(self, request):
            backend.clock.advance(next(delays))
            return self.service.render(RESULTS, request, "q")

    backend = mock_backend("retriever", Slow("retriever"))
    async with backend:
        for n in range(4):
            await backend.search(f"q{n}")
    metrics = backend.stats.drain()
    assert metrics["search/latency"] == pytest.approx(1.5)
    assert metrics["search/latency_p50"] == pytest.approx(1.0)
    assert metrics["search/latency_p95"] == pytest.approx(3.0)
