"""Repeated queries and the requests they make: a backend that remembers its answers (offline
runs) sends each query once, however the calls interleave, so the usage a run counts does not
depend on timing. Live backends keep their meaning: a repeat shares a request only while it is
in flight (or finds the persistent cache)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from searchr1.run.usage import MeteredSearch, Usage
from searchr1.wiring.services import search_backend
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.options import SearchOptions
from searchr1.search.replay import ReplayBackend
from searchr1.search.singleflight import SingleFlight
from searchr1.search.testing import mock_backend

RESULTS = {"results": [{"title": "Canberra", "text": "Canberra is the capital of Australia."}]}
QUERIES = ("capital of Australia", "  capital of   Australia ", "Mona Lisa painter", "broken query")


async def ticks(count: int) -> None:
    """Let the event loop run ``count`` times: a delay measured in interleavings, not seconds."""
    for _ in range(count):
        await asyncio.sleep(0)


class Service:
    """Answers every query after ``latency`` loop ticks (``broken query`` with HTTP 400), and
    counts the requests it got."""

    def __init__(self, latency: int) -> None:
        self.fake = FakeSearchService("retriever", {})
        self.latency = latency
        self.requests = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        await ticks(self.latency)
        if b"broken" in request.content:
            return httpx.Response(400)
        return self.fake.render(RESULTS, request, "q")


# A call: which query, and after how many loop ticks it is made.
calls = st.lists(st.tuples(st.sampled_from(QUERIES), st.integers(0, 12)), min_size=1, max_size=12)


async def search_all(backend, schedule: list[tuple[str, int]]) -> tuple[Usage, list]:
    usage = Usage()
    metered = MeteredSearch(backend, usage)

    async def call(query: str, delay: int):
        await ticks(delay)
        return await metered.search(query)

    results = await asyncio.gather(*(call(query, delay) for query, delay in schedule))
    return usage, results


def distinct(schedule: list[tuple[str, int]]) -> int:
    """How many different queries the schedule asks (spacing aside)."""
    return len({" ".join(query.split()) for query, _ in schedule})


@given(schedule=calls, latency=st.integers(0, 6))
# a repeat made after the first call's request has finished, and one made while it is in flight
@example(schedule=[("capital of Australia", 0), ("capital of Australia", 12)], latency=1)
@example(schedule=[("capital of Australia", 0), ("capital of Australia", 0)], latency=1)
@example(schedule=[("broken query", 0), ("broken query", 12)], latency=0)
def test_a_remembering_backend_sends_each_query_once_however_the_calls_interleave(schedule, latency):
    service = Service(latency)

    async def run():
        async with mock_backend("retriever", service, remember=True, max_retries=0) as backend:
            usage, results = await search_all(backend, schedule)
            return usage, results, backend.stats.drain()

    usage, results, metrics = asyncio.run(run())
    searched = usage.search["retriever"]
    assert service.requests == searched.requests == searched.http_requests == distinct(schedule)
    assert searched.calls == len(schedule)
    assert metrics["search/deduplicated"] == len(schedule) - distinct(schedule)
    # every call of a query gets the first call's answer, failures included
    for (query, _), result in zip(schedule, results):
        assert result.ok == ("broken" not in query)
    assert sum(not result.cached for result in results) == distinct(schedule)


@pytest.mark.parametrize("gap", [0, 12])
def test_a_live_backend_shares_only_a_request_in_flight(gap):
    """Without remembering (and without a cache) a repeat made after the first request finished
    is a request of its own: what a live run sends, and counts."""
    service = Service(latency=1)
    schedule = [("capital of Australia", 0), ("capital of Australia", gap)]

    async def run():
        async with mock_backend("retriever", service, max_retries=0) as backend:
            return await search_all(backend, schedule)

    usage, _ = asyncio.run(run())
    assert service.requests == usage.search["retriever"].requests == (1 if gap == 0 else 2)


async def test_a_remembering_flight_keeps_values_but_not_exceptions():
    flights: SingleFlight[int] = SingleFlight(remember=True)
    runs = []

    async def work():
        runs.append(1)
        return 42

    assert await flights.run("k", work) == (42, False)
    assert await flights.run("k", work) == (42, True)
    assert runs == [1] and len(flights) == 0

    async def boom():
        runs.append(2)
        raise RuntimeError("bug")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await flights.run("e", boom)
    assert runs == [1, 2, 2]  # an exception is not an answer: the next call runs the work again


async def test_offline_backends_remember_and_live_ones_do_not():
    replayed = search_backend(SearchOptions(backend="deepseek"), offline=True)
    local = search_backend(SearchOptions(backend="local"), offline=True)
    live = search_backend(SearchOptions(backend="retriever", cache="off"), offline=False)
    try:
        assert isinstance(replayed, ReplayBackend) and replayed.backend.remember
        assert local.remember and local.cache is None  # in memory only: a second run starts empty
        assert not live.remember
        first = await replayed.search("capital of Australia")
        again = await replayed.search("capital of Australia")
        assert first.ok and first.attempts >= 1 and again.cached and again.attempts == 0
    finally:
        for backend in (replayed, local, live):
            await backend.aclose()
