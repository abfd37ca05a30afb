"""Per-window search metrics: ``backend.stats.drain()`` once per training step.

Every ``search()`` call adds one :class:`CallRecord`; ``drain()`` turns the records since the
previous drain into metrics and starts a new window. Definitions (all over the window):

- ``search/requests``: number of ``search()`` calls (cache hits and shared calls included).
- ``search/success_rate`` / ``search/error_rate``: calls that returned ``ok=True`` / ``ok=False``,
  divided by ``search/requests``.
- ``search/429_rate``: calls that met at least one rate-limit signal (HTTP 429, Wikipedia
  ``maxlag``/``ratelimited``, Zhihu code 30001, every key cooling down), per call.
- ``search/timeout_rate``: calls that met at least one timeout (per attempt or overall), per call.
- ``search/results``: mean number of parsed items handed back per call (failures count 0).
  This is the same for every backend: DeepSeek counts evidence items, not raw web hits.
- ``search/latency``, ``search/latency_p50``, ``search/latency_p95``: mean and nearest-rank
  percentiles of the latency of calls that went to the network (waits and retries included;
  cache hits and shared calls excluded). Seconds, on the backend's clock.
- ``search/cache_hit_rate``: calls answered by the persistent cache, per call.
- ``search/deduplicated``: number of calls answered by another call's request: one in flight,
  or, on a backend that remembers its answers (offline runs), one that had finished.
- DeepSeek only: ``search/input_tokens``, ``search/cache_read_input_tokens``,
  ``search/output_tokens``, ``search/web_search_requests``: sums over the window, failed
  attempts included (they are billed too). ``search/no_web_search_rate``: calls answered
  without any web-search result (the search model wrote from memory; that text is discarded
  and the call returns no items), per call.
- Zhihu only: ``search/credential_failover_rate``: switches to another key caused by a rate
  limit, quota or rejected key, per call.

An empty window reports ``search/requests = 0`` and leaves out every per-call share (success,
error, 429, timeout, results, cache hits, and the backend's own shares): with nothing asked,
nothing succeeded or failed, and a plot leaves a gap there instead of drawing an outage.
The other metrics are 0.0.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Literal

from searchr1.core.types import ReportedUsage

# Metrics that are shares of the window's calls: undefined (left out) when it has none.
PER_CALL_SHARES = frozenset({
    "search/success_rate", "search/error_rate", "search/429_rate", "search/timeout_rate", "search/results",
    "search/cache_hit_rate", "search/no_web_search_rate", "search/credential_failover_rate",
})

Origin = Literal["network", "cache", "shared", "local"]

TOKEN_FIELDS = ("input_tokens", "cache_read_input_tokens", "output_tokens")


@dataclass
class CallRecord:
    """What one ``search()`` call did, as far as the metrics are concerned."""

    ok: bool
    items: int = 0
    latency: float = 0.0
    origin: Origin = "network"
    rate_limited: bool = False
    timed_out: bool = False
    failovers: int = 0
    attempts: int = 0
    usage: ReportedUsage = field(default_factory=ReportedUsage)
    searched: bool = True  # False: a successful answer that ran no web search (DeepSeek)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty list)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class SearchStats:
    """Thread-safe accumulator of :class:`CallRecord` for one backend."""

    def __init__(self, backend: str, *, token_metrics: bool = False, failover_metric: bool = False):
        self.backend = backend
        self.token_metrics = token_metrics
        self.failover_metric = failover_metric
        self._lock = threading.Lock()
        self._records: list[CallRecord] = []

    def record(self, record: CallRecord) -> None:
        with self._lock:
            self._records.append(record)

    def peek(self) -> dict[str, float]:
        """The current window's metrics, without resetting it."""
        with self._lock:
            records = list(self._records)
        return self._metrics(records)

    def drain(self) -> dict[str, float]:
        """The current window's metrics; the next window starts empty."""
        with self._lock:
            records, self._records = self._records, []
        return self._metrics(records)

    def _metrics(self, records: list[CallRecord]) -> dict[str, float]:
        n = len(records)
        per_call = 1.0 / n if n else 0.0
        network = sorted(r.latency for r in records if r.origin == "network")
        metrics: dict[str, float] = {
            "search/requests": float(n),
            "search/success_rate": sum(r.ok for r in records) * per_call,
            "search/error_rate": sum(not r.ok for r in records) * per_call,
            "search/429_rate": sum(r.rate_limited for r in records) * per_call,
            "search/timeout_rate": sum(r.timed_out for r in records) * per_call,
            "search/results": sum(r.items for r in records if r.ok) * per_call,
            "search/latency": (sum(network) / len(network)) if network else 0.0,
            "search/latency_p50": percentile(network, 0.50),
            "search/latency_p95": percentile(network, 0.95),
            "search/cache_hit_rate": sum(r.origin == "cache" for r in records) * per_call,
            "search/deduplicated": float(sum(r.origin == "shared" for r in records)),
        }
        if self.token_metrics:
            total = ReportedUsage()
            for r in records:
                total.add(r.usage)
            metrics["search/input_tokens"] = float(total.input_tokens)
            metrics["search/cache_read_input_tokens"] = float(total.cache_read_input_tokens)
            metrics["search/output_tokens"] = float(total.output_tokens)
            metrics["search/web_search_requests"] = float(total.web_search_requests)
            metrics["search/no_web_search_rate"] = sum(not r.searched for r in records) * per_call
        if self.failover_metric:
            metrics["search/credential_failover_rate"] = sum(r.failovers for r in records) * per_call
        if not n:  # shares of no calls: absent, not 0
            metrics = {k: v for k, v in metrics.items() if k not in PER_CALL_SHARES}
        return metrics

    def __repr__(self) -> str:
        return f"SearchStats(backend={self.backend!r}, window_calls={len(self._records)})"


class RecentSearchStats(SearchStats):
    """A :class:`SearchStats` whose window holds at most the last ``limit`` records (about
    ``2 * limit`` between trims): for a backend whose window nobody drains each step (a tool's
    page backend), so a long run does not keep every call it made."""

    def __init__(self, backend: str, *, limit: int = 10_000, **options: bool) -> None:
        super().__init__(backend, **options)
        self.limit = limit

    def record(self, record: CallRecord) -> None:
        with self._lock:
            self._records.append(record)
            if len(self._records) >= 2 * self.limit:
                del self._records[: len(self._records) - self.limit]
