"""``ScriptedSearch``: an in-memory search backend (query -> result) with optional latency and
a concurrency cap, for tests and benchmarks that do not need the HTTP layer.

(The scripted *policy* and its scenario format are the offline twin's: see
:mod:`searchr1.twin.scripted_policy` and :mod:`searchr1.twin.scenario`.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from searchr1.core.types import SearchResult


@dataclass
class SearchCall:
    query: str
    start: float
    end: float


class ScriptedSearch:
    """In-memory search backend: a fixed result per query, optional latency and a cap."""

    name = "scripted"

    def __init__(
        self,
        results: Mapping[str, SearchResult],
        *,
        default: SearchResult | None = None,
        latency: Callable[[str], float] | None = None,
        concurrency: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._results = dict(results)
        self._default = default
        self._latency = latency
        self._semaphore = asyncio.Semaphore(concurrency) if concurrency else None
        self._clock = clock
        self.calls: list[SearchCall] = []

    async def _search(self, query: str) -> SearchResult:
        start = self._clock()
        if self._latency is not None:
            await asyncio.sleep(self._latency(query))
        self.calls.append(SearchCall(query, start, self._clock()))
        result = self._results.get(query, self._default)
        if result is None:
            raise KeyError(f"ScriptedSearch has no result for query {query!r}")
        return result

    async def search(self, query: str) -> SearchResult:
        if self._semaphore is None:
            return await self._search(query)
        async with self._semaphore:
            return await self._search(query)
