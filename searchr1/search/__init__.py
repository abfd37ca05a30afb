"""The search environment: four backends behind one interface, with caching, limits,
per-step stats and cassette record/replay.

Typical use::

    from searchr1.search import create_search_backend, open_replay_backend

    async with create_search_backend("wikipedia") as backend:      # live
        result = await backend.search("The Little Prince author")
        metrics = backend.stats.drain()                              # once per step

    async with open_replay_backend("wikipedia", "cassettes/wikipedia/demo.yaml") as backend:
        ...                                                          # offline, virtual time
"""

from searchr1.search.base import HttpSearchBackend, SearchRefusedError
from searchr1.search.cache import QueryCache, normalise_query
from searchr1.search.clock import RealClock, VirtualClock
from searchr1.search.env import MissingApiKeyError
from searchr1.search.factory import (
    BACKEND_NAMES,
    DEFAULT_CONCURRENCY,
    DEFAULT_TIMEOUT,
    create_search_backend,
)
from searchr1.search.replay import CassetteMissError, ReplayBackend, open_replay_backend
from searchr1.search.stats import SearchStats
from searchr1.search.types import (
    NO_RESULTS_TEXT,
    SearchBackend,
    SearchItem,
    SearchResult,
    format_observation,
    observation_candidates,
)
from searchr1.search.wikipedia import WikipediaRefusedError

__all__ = [
    "BACKEND_NAMES",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TIMEOUT",
    "NO_RESULTS_TEXT",
    "CassetteMissError",
    "HttpSearchBackend",
    "MissingApiKeyError",
    "QueryCache",
    "RealClock",
    "ReplayBackend",
    "SearchBackend",
    "SearchItem",
    "SearchRefusedError",
    "SearchResult",
    "SearchStats",
    "VirtualClock",
    "WikipediaRefusedError",
    "create_search_backend",
    "format_observation",
    "normalise_query",
    "observation_candidates",
    "open_replay_backend",
]
