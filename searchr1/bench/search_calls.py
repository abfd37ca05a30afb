"""Figure 4: search requests saved by single-flight and the query cache.

A scripted step (8 questions x 8 samples) in which groups repeat their first queries, as GRPO
groups do: three in four samples of a group open with the same query, and later turns draw
from three follow-up queries per question, so repeats arrive both at the same moment (for
single-flight) and later (for the cache). It runs through the real engine and the REAL search
stack: the Wikipedia backend (:func:`searchr1.search.testing.mock_backend`) with its SQLite
:class:`~searchr1.search.cache.QueryCache` and single-flight, over an ``httpx.MockTransport``
handler that answers every query and counts the requests that reach it, after the
:class:`~.workload.LatencyModel`'s search latency played back at ``SCALE`` (1 model second =
10 ms). Sampling is the real pytrio client against the offline twin serving the step's script.
Request counts do not depend on the machine; the makespan ratio is wall clock.

The baseline is the same step with neither (no cache, single-flight replaced by a pass-through),
which is the lab port's one request per ``search()`` call. Ideal: one request per distinct query.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from searchr1.core.rollout import rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.search.cache import QueryCache, normalise_query
from searchr1.search.fake_service import FakeSearchService, ScriptedResult
from searchr1.search.singleflight import SingleFlight
from searchr1.search.testing import mock_backend
from searchr1.wiring.services import scripted_sampling_client
from searchr1.bench.report import Figure, Measure
from searchr1.core.types import SamplingClient, SearchResult
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.bench.workload import (
    LatencyModel,
    Workload,
    WorkloadSpec,
    build_workload,
    quick_spec,
    searched_queries,
)


class CountingWikipedia:
    """An in-process Wikipedia API: three pages for any query, after the model's latency."""

    def __init__(self, model: LatencyModel) -> None:
        self.service = FakeSearchService("wikipedia", {})
        self.model = model
        self.requests = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        from searchr1.search.fake_service import wikipedia_query

        query = wikipedia_query(request)
        self.requests += 1
        await asyncio.sleep(self.model.scale * self.model.search(query))
        pages: list[ScriptedResult] = [{"title": f"{query.title()} ({k})", "text": f"Passage {k} about {query}. " * 12}
                                       for k in range(1, 4)]
        return self.service.render({"results": pages}, request, query)


class NoSingleFlight(SingleFlight[SearchResult]):
    """Stands in for the backend's ``SingleFlight``: every caller runs its own request."""

    async def run(self, key: str, work: Callable[[], Awaitable[SearchResult]]) -> tuple[SearchResult, bool]:
        return await work(), False


SCALE = 0.01  # wall seconds per model second of search latency


@dataclass
class StepSearches:
    """What one step's searches cost: the search() calls, the requests that reached the service,
    the calls that joined an in-flight request or hit the cache, the queries, and the step's wall time."""

    calls: int
    requests: int
    shared: int
    cache_hits: int
    queries: list[str]
    failed: int
    wall_seconds: float = 0.0


def _run_step(tokenizer: Qwen35Tokenizer, workload: Workload, model: LatencyModel, sampler: SamplingClient, *,
              cache: QueryCache | None, single_flight: bool) -> StepSearches:
    handler = CountingWikipedia(model)

    async def main() -> StepSearches:
        async with mock_backend("wikipedia", handler, cache=cache, timeout=120.0) as backend:
            if not single_flight:
                if not hasattr(backend, "_flights"):
                    raise RuntimeError("the search backend no longer has a _flights attribute to bypass")
                backend._flights = NoSingleFlight()
            trajectories = await rollout_batch_async(sampler, tokenizer, with_search(backend), workload.examples,
                                                     workload.config)
            stats = backend.stats.peek()
        queries = [q for t in trajectories for q in searched_queries(t)]
        return StepSearches(
            calls=int(stats["search/requests"]),
            requests=handler.requests,
            shared=int(stats["search/deduplicated"]),
            cache_hits=round(stats["search/cache_hit_rate"] * stats["search/requests"]),
            queries=queries,
            failed=sum(not s.ok for t in trajectories for s in t.calls),
        )

    started = time.perf_counter()
    outcome = asyncio.run(main())
    outcome.wall_seconds = time.perf_counter() - started
    return outcome


def search_calls_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False,
                        spec: WorkloadSpec | None = None) -> Figure:
    started = time.perf_counter()
    spec = spec or (quick_spec(WorkloadSpec(shared_queries=True)) if quick else WorkloadSpec(shared_queries=True))
    workload = build_workload(spec, seed + 404)
    model = LatencyModel(scale=SCALE, seed=seed, search_cap=20.0)
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-") as home, \
            scripted_sampling_client(workload.scenario, tokenizer) as sampler:
        cache = QueryCache(Path(home) / "search-cache.sqlite")
        try:
            ours = _run_step(tokenizer, workload, model, sampler, cache=cache, single_flight=True)
        finally:
            cache.close()
        lab_port_way = _run_step(tokenizer, workload, model, sampler, cache=None, single_flight=False)
    if lab_port_way.requests != lab_port_way.calls:
        raise AssertionError(
            f"without cache and single-flight every search() call should reach the service once, "
            f"got {lab_port_way.requests} requests for {lab_port_way.calls} calls"
        )
    if sorted(ours.queries) != sorted(lab_port_way.queries):
        raise AssertionError("the two runs searched different queries")
    distinct = len({normalise_query(q) for q in ours.queries})
    without = lab_port_way.requests
    saved = 1.0 - ours.requests / without
    ideal = 1.0 - distinct / without
    figure = Figure(
        number=4, name="search_calls", title="Search calls saved",
        measures=[
            Measure("requests_saved", "requests saved by single-flight + cache", 100.0 * saved,
                    100.0 * ideal, ">=", "%", target_source="bench", digits=1),
            Measure("requests_per_distinct_query", "requests / distinct query", ours.requests / distinct,
                    unit="x"),
            Measure("saved_by_single_flight", "  joined an in-flight request", 100.0 * ours.shared / without,
                    unit="%", digits=1),
            Measure("saved_by_cache", "  answered by the cache", 100.0 * ours.cache_hits / without,
                    unit="%", digits=1),
            Measure("step_speedup", "step makespan without / with (wall clock)",
                    lab_port_way.wall_seconds / ours.wall_seconds, unit="x"),
        ],
        details={
            "search_calls": without,
            "requests_with": ours.requests,
            "requests_without": without,
            "distinct_queries": distinct,
            "shared_in_flight": ours.shared,
            "cache_hits": ours.cache_hits,
            "failed_searches": ours.failed,
            "wall_seconds": {"with": ours.wall_seconds, "without": lab_port_way.wall_seconds},
            "search_latency_scale": SCALE,
            "backend": "wikipedia (real client, SQLite cache, single-flight) over httpx.MockTransport",
        },
        notes=[(f"{without} search() calls, {distinct} distinct queries: {ours.requests} requests with "
               f"single-flight + cache, {without} without (target: one request per distinct query)")],
    )
    figure.seconds = time.perf_counter() - started
    return figure
