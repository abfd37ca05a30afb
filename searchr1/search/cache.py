"""A persistent query cache (SQLite, standard library).

Keyed by backend name, normalised query and the backend's request parameters (so changing,
say, the DeepSeek model or the Wikipedia language never serves stale answers). Only
successful results are stored. An optional TTL ignores entries older than it. Lookups are
synchronous: a local SQLite read takes microseconds, far below any search round trip.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from searchr1.core.types import SearchItem, SearchResult

SCHEMA_VERSION = 1


def normalise_query(query: str) -> str:
    """The query as sent and as keyed: NFKC, whitespace runs collapsed, ends stripped.

    Case is kept: search engines (and DeepSeek's model) may treat case as meaningful.
    """
    return " ".join(unicodedata.normalize("NFKC", query).split())


def cache_key(backend: str, query: str, params: Mapping[str, object]) -> str:
    """Stable hex key for (backend, normalised query, request parameters)."""
    material = json.dumps(
        {"backend": backend, "query": normalise_query(query), "params": params},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _items_to_json(items: tuple[SearchItem, ...]) -> str:
    return json.dumps(
        [{"title": i.title, "content": i.content, "source": i.source, "url": i.url, "ident": i.ident}
         for i in items],
        ensure_ascii=False,
    )


def _items_from_json(text: str) -> tuple[SearchItem, ...]:
    return tuple(
        SearchItem(title=d["title"], content=d["content"], source=d.get("source"), url=d.get("url"),
                   ident=d.get("ident"))
        for d in json.loads(text)
    )


class QueryCache:
    """``get``/``put`` of successful :class:`SearchResult` items in one SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        ttl_seconds: float | None = None,
        wall_clock=time.time,
    ) -> None:
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError(f"search cache TTL must be > 0 seconds, got {ttl_seconds}")
        self.path = Path(path)
        self.ttl_seconds = ttl_seconds
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            if str(path) != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS search_cache ("
                " key TEXT PRIMARY KEY, backend TEXT NOT NULL, query TEXT NOT NULL,"
                " params TEXT NOT NULL, items TEXT NOT NULL, created REAL NOT NULL,"
                " schema INTEGER NOT NULL)"
            )
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"search cache {self.path}: cannot open SQLite database ({exc})") from exc

    def get(self, key: str) -> SearchResult | None:
        with self._lock:
            row = self._db.execute(
                "SELECT items, created FROM search_cache WHERE key = ? AND schema = ?",
                (key, SCHEMA_VERSION),
            ).fetchone()
        if row is None:
            return None
        items_json, created = row
        if self.ttl_seconds is not None and self._wall_clock() - created > self.ttl_seconds:
            return None
        return SearchResult(ok=True, items=_items_from_json(items_json), latency=0.0, cached=True)

    def put(
        self, key: str, *, backend: str, query: str, params: Mapping[str, object], result: SearchResult
    ) -> None:
        if not result.ok:
            return  # failures are never cached: the next call tries again
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO search_cache VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    backend,
                    normalise_query(query),
                    json.dumps(params, sort_keys=True, ensure_ascii=False),
                    _items_to_json(result.items),
                    self._wall_clock(),
                    SCHEMA_VERSION,
                ),
            )

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM search_cache").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"QueryCache(path={str(self.path)!r}, ttl_seconds={self.ttl_seconds})"
