"""Replaying recorded search traffic (vcrpy cassettes) through the real backends.

A cassette is served by :class:`CassetteTransport`, an httpx transport given to the backend's
own client, instead of vcrpy's process-wide patching: replay then cannot capture anybody
else's HTTP traffic (the PyTRIO SDK also speaks httpx) and several cassettes can be open at
once. vcrpy still does the loading and the matching (method, scheme, host, port, path, query
and body, ``record_mode="none"``, repeats allowed).

Repeats: when a request matches several recorded interactions (a 429 followed by its
successful retry), the least-played one is served, earliest first; replaying the same query
again therefore replays the same episode again.

A request missing from the cassette raises :class:`CassetteMissError` naming the query. That
is a harness error, not a search failure, so it propagates out of ``search()``.

``open_replay_backend`` uses a :class:`~searchr1.search.clock.VirtualClock` by default, so
``Retry-After`` waits and backoff cost no real time.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml
from vcr import matchers
from vcr.cassette import Cassette
from vcr.record_mode import RecordMode
from vcr.request import Request as VcrRequest
from vcr.serializers import yamlserializer

from searchr1.search.base import HttpSearchBackend
from searchr1.search.clock import Clock, VirtualClock
from searchr1.search.factory import check_backend_name, create_search_backend
from searchr1.search.limits import Backoff
from searchr1.search.types import SearchResult

MATCH_ON = (
    matchers.method,
    matchers.scheme,
    matchers.host,
    matchers.port,
    matchers.path,
    matchers.query,
    matchers.body,
)
PLACEHOLDER_KEY = "replay-placeholder-key"


class CassetteMissError(LookupError):
    """The cassette has no recorded response for a request (names the query when known)."""

    def __init__(self, *, cassette: str | Path, method: str, url: str, query: str | None = None) -> None:
        self.cassette = str(cassette)
        self.method = method
        self.url = url
        self.query = query
        subject = f"query {query!r}" if query is not None else "a request"
        super().__init__(
            f"cassette {self.cassette} has no recorded response for {subject} ({method} {url}). "
            "Add the query to the cassette's spec and run `python cli.py cassettes build`, "
            "or record it live with `python cli.py record`."
        )

    def with_query(self, query: str) -> CassetteMissError:
        return CassetteMissError(cassette=self.cassette, method=self.method, url=self.url, query=query)


class CassetteFormatError(ValueError):
    """A cassette file that cannot be used (names the file and the problem)."""


class _LeastPlayedCassette(Cassette):
    """Serve the least-played matching interaction (earliest first) instead of always the first."""

    def play_response(self, request):
        candidates = list(self._responses(request))
        if not candidates:
            return super().play_response(request)  # raises vcrpy's own "not found" error
        index, response = min(candidates, key=lambda pair: (self.play_counts[pair[0]], pair[0]))
        self.play_counts[index] += 1
        return response


def load_cassette(path: str | Path) -> Cassette:
    """Load a cassette for replay only (no recording, no patching)."""
    path = Path(path)
    if not path.is_file():
        raise CassetteFormatError(f"cassette {path} does not exist")
    try:
        cassette = _LeastPlayedCassette.load(
            path=str(path),
            serializer=yamlserializer,
            match_on=MATCH_ON,
            record_mode=RecordMode.NONE,
            allow_playback_repeats=True,
        )
    except (ValueError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise CassetteFormatError(f"cassette {path} cannot be loaded: {exc}") from exc
    if len(cassette) == 0:
        raise CassetteFormatError(f"cassette {path} holds no interactions")
    return cassette


def read_cassette_metadata(path: str | Path) -> dict[str, Any]:
    """The ``metadata`` mapping stored in a cassette ({} when there is none)."""
    path = Path(path)
    if not path.is_file():
        raise CassetteFormatError(f"cassette {path} does not exist")
    try:
        data = yamlserializer.deserialize(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CassetteFormatError(f"cassette {path} cannot be read: {exc}") from exc
    metadata = data.get("metadata") if isinstance(data, dict) else None
    return dict(metadata) if isinstance(metadata, Mapping) else {}


class CassetteTransport(httpx.AsyncBaseTransport):
    """An httpx transport that answers from a cassette and never touches the network."""

    def __init__(self, cassette: Cassette | str | Path) -> None:
        self.cassette = cassette if isinstance(cassette, Cassette) else load_cassette(cassette)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        wanted = VcrRequest(request.method, str(request.url), body, request.headers)
        if not self.cassette.can_play_response_for(wanted):
            raise CassetteMissError(cassette=self.cassette.path, method=request.method, url=str(request.url))
        recorded = self.cassette.play_response(wanted)
        message = recorded["status"].get("message") or ""
        return httpx.Response(
            recorded["status"]["code"],
            headers=[(name, value) for name, values in recorded["headers"].items() for value in values],
            stream=httpx.ByteStream(recorded["body"]["string"] or b""),
            extensions={"reason_phrase": message.encode("ascii", "replace")} if message else {},
            request=request,
        )


class ReplayBackend:
    """A backend answering from a cassette. Same interface as the backend it wraps
    (``name``, ``search``, ``stats``, ``aclose``, async context manager)."""

    def __init__(self, backend: HttpSearchBackend, cassette_path: str | Path) -> None:
        self.backend = backend
        self.name = backend.name
        self.stats = backend.stats
        self.cassette_path = Path(cassette_path)

    async def search(self, query: str) -> SearchResult:
        try:
            return await self.backend.search(query)
        except CassetteMissError as exc:
            raise exc.with_query(query) from None

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def __aenter__(self) -> ReplayBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"ReplayBackend({self.backend!r}, cassette={str(self.cassette_path)!r})"


def open_replay_backend(
    name: str,
    cassette_path: str | Path,
    *,
    clock: Clock | None = None,
    **options: Any,
) -> ReplayBackend:
    """A backend of kind ``name`` whose HTTP traffic is answered by the cassette.

    Options recorded in the cassette's metadata (e.g. ``max_retries``) apply unless
    overridden by ``options``. Keys are placeholders (as many as were used when recording),
    so no real key is needed. Time is virtual unless a ``clock`` is given. No cache unless
    ``cache=`` is passed (replayed answers must not leak into a live cache).
    """
    check_backend_name(name)
    metadata = read_cassette_metadata(cassette_path)
    recorded_backend = metadata.get("backend")
    if recorded_backend is not None and recorded_backend != name:
        raise CassetteFormatError(
            f"cassette {cassette_path} was recorded for {recorded_backend!r}, not {name!r}"
        )
    settings: dict[str, Any] = dict(metadata.get("options") or {})
    settings.update(options)
    if name == "zhihu":
        settings.setdefault(
            "keys", tuple(f"{PLACEHOLDER_KEY}-{i + 1}" for i in range(int(metadata.get("keys", 1))))
        )
    elif name == "deepseek":
        settings.setdefault("api_key", PLACEHOLDER_KEY)
    settings.setdefault("backoff", Backoff(rng=random.Random(0)))
    backend = create_search_backend(
        name,
        clock=clock or VirtualClock(),
        transport=CassetteTransport(cassette_path),
        **settings,
    )
    return ReplayBackend(backend, cassette_path)
