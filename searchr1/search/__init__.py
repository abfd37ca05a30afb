"""The search environment: five backends (four services, and BM25 over a local index) behind one
interface, with caching, limits, per-step stats and cassette record/replay.

Typical use::

    from searchr1.search import create_search_backend, open_replay_backend

    async with create_search_backend("wikipedia") as backend:      # live
        result = await backend.search("The Little Prince author")
        metrics = backend.stats.drain()                              # once per step

    async with open_replay_backend("wikipedia", "cassettes/wikipedia/demo.yaml") as backend:
        ...                                                          # offline, virtual time
"""

# Each name is imported from its module on first use (PEP 562), so importing one part of the
# search layer (say searchr1.search.cache) loads no transport,
# vcrpy or yaml.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names as mypy sees them; at run time each is imported on first use
    from searchr1.search.base import HttpSearchBackend, SearchRefusedError
    from searchr1.search.cache import QueryCache, normalise_query
    from searchr1.search.clock import RealClock, VirtualClock
    from searchr1.search.env import MissingApiKeyError
    from searchr1.search.factory import (BACKEND_NAMES, DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT, HTTP_BACKEND_NAMES,
                                         create_search_backend)
    from searchr1.search.local import LocalSearchBackend
    from searchr1.search.replay import CassetteMissError, ReplayBackend, open_replay_backend
    from searchr1.search.stats import SearchStats
    from searchr1.search.wikipedia import WikipediaRefusedError

_WHERE = {
    "HttpSearchBackend": "searchr1.search.base",
    "SearchRefusedError": "searchr1.search.base",
    "QueryCache": "searchr1.search.cache",
    "normalise_query": "searchr1.search.cache",
    "RealClock": "searchr1.search.clock",
    "VirtualClock": "searchr1.search.clock",
    "MissingApiKeyError": "searchr1.search.env",
    "BACKEND_NAMES": "searchr1.search.factory",
    "DEFAULT_CONCURRENCY": "searchr1.search.factory",
    "DEFAULT_TIMEOUT": "searchr1.search.factory",
    "HTTP_BACKEND_NAMES": "searchr1.search.factory",
    "LocalSearchBackend": "searchr1.search.local",
    "create_search_backend": "searchr1.search.factory",
    "CassetteMissError": "searchr1.search.replay",
    "ReplayBackend": "searchr1.search.replay",
    "open_replay_backend": "searchr1.search.replay",
    "SearchStats": "searchr1.search.stats",
    "WikipediaRefusedError": "searchr1.search.wikipedia",
}



def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

__all__ = [
    "BACKEND_NAMES",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TIMEOUT",
    "HTTP_BACKEND_NAMES",
    "CassetteMissError",
    "HttpSearchBackend",
    "LocalSearchBackend",
    "MissingApiKeyError",
    "QueryCache",
    "RealClock",
    "ReplayBackend",
    "SearchRefusedError",
    "SearchStats",
    "VirtualClock",
    "WikipediaRefusedError",
    "create_search_backend",
    "normalise_query",
    "open_replay_backend",
]
