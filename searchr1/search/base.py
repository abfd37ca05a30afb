"""What every HTTP search backend shares: the call pipeline around one backend-specific attempt.

``search(query)`` = normalise → cache lookup → single-flight → retry loop → stats, cache.
With ``remember=True`` (offline runs) the single-flight also keeps every answer it got, failures
included, for the backend's lifetime: a query is sent once, and every other call of it is
answered by that request, whether it is still in flight or has finished.
Each retry-loop iteration takes a concurrency slot (the semaphore), runs the backend's
``_attempt`` under a wall-clock limit, and turns every network, HTTP, timeout, decoding and
schema failure into an :class:`Outcome`. Nothing of that kind escapes ``search()``; only
programming errors (and harness errors such as a cassette miss) propagate.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sqlite3
import ssl
import zlib
from dataclasses import dataclass, field, replace
from typing import ClassVar, Self, TypedDict

import httpx

from searchr1 import __version__
from searchr1.basics.wording import plural
from searchr1.core.errors import UserError
from searchr1.basics.json_types import JsonValue
from searchr1.basics.jsonl import JsonInputError, Surrogates, decode_json
from searchr1.search.cache import QueryCache, cache_key, normalise_query
from searchr1.search.clock import Clock, RealClock
from searchr1.search.limits import Backoff, parse_retry_after
from searchr1.basics.secrets import Secret, redact, redact_known, redact_url, sanitise_error
from searchr1.search.singleflight import SingleFlight
from searchr1.search.stats import CallRecord, SearchStats
from searchr1.core.types import ReportedUsage, SearchItem, SearchResult
from searchr1.basics.unicode import valid_text

log = logging.getLogger("searchr1.search")

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
CLIENT_PRODUCT = f"searchr1/{__version__}"
# Where the operators of a searchr1 client can be read about (Wikimedia's User-Agent policy
# asks for a URL or an e-mail; the user's own contact comes from SEARCHR1_CONTACT).
PROJECT_URL = "https://github.com/searchr1/searchr1"
CONTENT_LIMIT = 1200  # characters of one item's content (Wikipedia's exchars maximum)


class PayloadError(ValueError):
    """The service answered, but not in its documented shape (names the part at fault)."""


class ResponseTooLarge(Exception):
    """A response body grew past the backend's ``max_body_bytes``."""


class LineTooLong(ResponseTooLarge):
    """One line of a streamed body grew past the backend's line limit."""


class SearchRefusedError(UserError, RuntimeError):
    """The service refuses this client outright (e.g. Wikimedia's HTTP 403 for a User-Agent
    without contact). Not a search failure the policy should read: it propagates out of
    ``search()`` so a run stops at once with this one-line message instead of training on
    error observations."""


@dataclass
class Outcome:
    """The result of one attempt. ``items`` set means success; otherwise ``error`` says what
    went wrong and ``retryable`` whether another attempt may help."""

    items: tuple[SearchItem, ...] | None = None
    error: str | None = None
    status: int | None = None
    retryable: bool = False
    retry_after: float | None = None  # the server's requested wait, seconds
    rate_limited: bool = False  # counts towards search/429_rate
    failover: bool = False  # retry at once with another credential (no retry consumed)

    @classmethod
    def success(cls, items: tuple[SearchItem, ...], status: int | None = 200) -> Outcome:
        return cls(items=tuple(items), status=status)

    @classmethod
    def fail(cls, error: str, status: int | None = None) -> Outcome:
        return cls(error=error, status=status)

    @classmethod
    def retry(cls, error: str, status: int | None = None, *, retry_after: float | None = None,
              rate_limited: bool = False, failover: bool = False) -> Outcome:
        return cls(error=error, status=status, retryable=True, retry_after=retry_after, rate_limited=rate_limited,
                   failover=failover)


@dataclass
class CallContext:
    """Mutable state of one network-going ``search()`` call (shared by its attempts)."""

    query: str
    started: float
    deadline: float
    attempts: int = 0
    failovers: int = 0
    rate_limited: bool = False
    timed_out: bool = False
    searched: bool = True  # False: the service answered without running a search (DeepSeek)
    usage: ReportedUsage = field(default_factory=ReportedUsage)


def check_url(url: str, what: str) -> str:
    """A clear construction-time error for a URL httpx could not use."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(redact(f"{what}: invalid URL {redact_url(str(url))!r} ({exc})")) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{what}: expected an http(s) URL with a host, got {redact_url(url)!r}")
    return url


def truncate(text: str, limit: int = CONTENT_LIMIT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


IDENT_LIMIT = 64  # characters of a passage id shown to the model


def passage_ident(value: object) -> str | None:
    """A passage id as the model may read it (``Id:`` in an observation): a string or integer of
    at most 64 printable characters with no whitespace inside; anything else is no id at all, so
    a corpus or server cannot put a line break or a page of text into the prompt this way."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()
    if not text or len(text) > IDENT_LIMIT or not text.isprintable() or any(ch.isspace() for ch in text):
        return None
    return text


async def read_body(response: httpx.Response, max_bytes: int) -> bytes:
    """The (decoded) body, refusing to buffer more than ``max_bytes``."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ResponseTooLarge(int(declared))
    size = 0
    chunks: list[bytes] = []
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise ResponseTooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes | str) -> JsonValue:
    """Parse JSON from outside by the rules of every file we read (:mod:`searchr1.basics.jsonl`:
    strict UTF-8, bounded nesting and integers), every lone surrogate mended to U+FFFD.
    Raises ``json.JSONDecodeError`` when it is not such JSON."""
    try:
        return decode_json(raw, where="response", surrogates=Surrogates.MEND)
    except JsonInputError as error:
        raise json.JSONDecodeError(str(error), raw if isinstance(raw, str) else "", 0) from None


async def read_json(response: httpx.Response, max_bytes: int) -> JsonValue:
    """Parse a JSON body (:func:`parse_json`); raises ``json.JSONDecodeError``/``UnicodeDecodeError``
    when it is not JSON."""
    return parse_json(await read_body(response, max_bytes))


def http_status_outcome(response: httpx.Response) -> Outcome | None:
    """The generic meaning of a non-2xx status (``None`` for 2xx)."""
    code = response.status_code
    if 200 <= code < 300:
        return None
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    if code == 429:
        return Outcome.retry("HTTP 429 (rate limited)", 429, retry_after=retry_after, rate_limited=True)
    if code >= 500:
        return Outcome.retry(f"HTTP {code}", code, retry_after=retry_after)
    return Outcome.fail(f"HTTP {code}", code)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context every backend's client shares (httpx's default: certifi's
    roots, the environment's SSL_CERT_FILE/SSL_CERT_DIR read once). Building one reads the CA
    bundle, tens of milliseconds, which each new client would otherwise pay again."""
    return httpx.create_ssl_context()


class PipelineOptions(TypedDict, total=False):
    """The keyword options of :class:`HttpSearchBackend` that a backend passes on as given (with
    ``max_retries`` and ``max_body_bytes`` in :class:`BackendOptions`)."""

    total_timeout: float | None
    deadline: float | None
    max_retry_after: float
    client: httpx.AsyncClient | None
    transport: httpx.AsyncBaseTransport | None
    clock: Clock | None
    cache: QueryCache | None
    backoff: Backoff | None
    remember: bool


class BodyLimitOptions(PipelineOptions, total=False):
    """The options passed on by a backend that sets its own ``max_retries``."""

    max_body_bytes: int


class BackendOptions(BodyLimitOptions, total=False):
    """Every keyword option of :class:`HttpSearchBackend` but ``concurrency`` and ``timeout``."""

    max_retries: int


class HttpSearchBackend:
    """Base class of the four backends. Subclasses set ``name`` and implement ``_attempt``
    (and ``request_params``, the request settings that change answers, for the cache key)."""

    name: ClassVar[str] = "base"
    token_metrics: ClassVar[bool] = False
    failover_metric: ClassVar[bool] = False

    def __init__(
        self,
        *,
        concurrency: int,
        timeout: float,
        max_retries: int = 2,
        total_timeout: float | None = None,
        deadline: float | None = None,
        max_retry_after: float = 120.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
        cache: QueryCache | None = None,
        backoff: Backoff | None = None,
        remember: bool = False,
    ) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"{self.name}: concurrency must be an integer >= 1, got {concurrency!r}")
        if not timeout or timeout <= 0:
            raise ValueError(f"{self.name}: timeout must be > 0 seconds, got {timeout!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"{self.name}: max_retries must be an integer >= 0, got {max_retries!r}")
        if total_timeout is not None and total_timeout <= 0:
            raise ValueError(f"{self.name}: total_timeout must be > 0 seconds, got {total_timeout!r}")
        if deadline is not None and deadline <= 0:
            raise ValueError(f"{self.name}: deadline must be > 0 seconds, got {deadline!r}")
        if client is not None and transport is not None:
            raise ValueError(f"{self.name}: pass either client or transport, not both")
        self.concurrency = concurrency
        # ``timeout`` is httpx's limit per operation (connect, each read, each write): a stream
        # that keeps sending is never cut by it. ``total_timeout`` is the wall-clock limit of
        # one attempt, the whole body or stream included (default: ``timeout``, except where a
        # backend streams long answers). ``deadline`` bounds one call, retries and waits included.
        self.timeout = float(timeout)
        self.total_timeout = float(total_timeout) if total_timeout is not None else self.default_total_timeout()
        self.max_retries = max_retries
        self.deadline = (
            float(deadline) if deadline is not None else self.total_timeout * (max_retries + 1) + 10.0
        )
        self.max_retry_after = max_retry_after
        self.max_body_bytes = max_body_bytes
        self.clock: Clock = clock or RealClock()
        self.cache = cache
        self.backoff = backoff or Backoff()
        self.stats = SearchStats(
            self.name, token_metrics=self.token_metrics, failover_metric=self.failover_metric
        )
        self._semaphore = asyncio.Semaphore(concurrency)
        # Remembering, how many calls are sent no longer depends on how they interleave.
        self.remember = remember
        self._flights: SingleFlight[SearchResult] = SingleFlight(remember=remember)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            transport=transport,
            verify=tls_context(),
            timeout=httpx.Timeout(self.timeout),
            follow_redirects=False,
            # Fixed headers (no library version) keep recorded cassettes stable across upgrades.
            headers={"Accept-Encoding": "gzip", "User-Agent": CLIENT_PRODUCT},
        )

    # ----------------------------------------------------------------- subclass hooks

    def default_total_timeout(self) -> float:
        """The per-attempt wall-clock limit when none is given."""
        return self.timeout

    def request_params(self) -> dict[str, object]:
        """Settings that change the answer to a query (part of the cache key)."""
        return {}

    def replay_options(self) -> dict[str, object]:
        """Constructor options that shape the requests (URLs, model, counts): stored in a
        recorded cassette so that replaying it needs only the backend name and the path."""
        return {"max_retries": self.max_retries}

    def secrets(self) -> tuple[Secret, ...]:
        """Keys this backend holds (masked in any server-provided text)."""
        return ()

    def private_values(self) -> dict[str, Secret]:
        """Personal values (not keys) that recordings must replace by the given placeholder."""
        return {}

    async def _before_attempt(self, ctx: CallContext) -> None:
        """Runs inside the concurrency slot, before the attempt's timer starts."""

    async def _attempt(self, ctx: CallContext) -> Outcome:
        raise NotImplementedError

    # ----------------------------------------------------------------- public API

    async def search(self, query: str) -> SearchResult:
        """Search for ``query``. The request carries the query as typed (ends stripped): a
        search engine may care about full-width punctuation or spacing. The NFKC-normalised
        form only keys the cache and the single-flight, so equivalent spellings share them.
        A call answered by another call's request (in flight, or remembered) is returned with
        ``cached=True``, ``attempts=0`` and no usage: it sent nothing."""
        if not isinstance(query, str):
            raise TypeError(f"{self.name}.search: query must be str, got {type(query).__name__}")
        query = valid_text(query)
        text = normalise_query(query)
        if not text:
            self.stats.record(CallRecord(ok=False, origin="local"))
            return SearchResult(ok=False, error="empty query")
        typed = query.strip()
        key = cache_key(self.name, text, self.request_params())
        if self.cache is not None:
            try:
                hit = self.cache.get(key)
            except sqlite3.Error as exc:
                log.warning("%s: search cache read failed (%s); searching", self.name, type(exc).__name__)
                hit = None
            if hit is not None:
                self.stats.record(CallRecord(ok=True, items=len(hit.items), origin="cache"))
                return hit
        result, shared = await self._flights.run(key, lambda: self._fetch(typed, text, key))
        if shared:
            self.stats.record(CallRecord(ok=result.ok, items=len(result.items), origin="shared"))
            return replace(result, cached=True, attempts=0, usage=None)  # another call's request
        return result

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(concurrency={self.concurrency}, timeout={self.timeout:g}, "
            f"max_retries={self.max_retries}, cache={'on' if self.cache else 'off'})"
        )

    # ----------------------------------------------------------------- the pipeline

    async def _fetch(self, typed: str, text: str, key: str) -> SearchResult:
        started = self.clock.now()
        ctx = CallContext(query=typed, started=started, deadline=started + self.deadline)
        result = await self._run_attempts(ctx)
        result = replace(result, latency=self.clock.now() - started, attempts=ctx.attempts, usage=ctx.usage)
        self.stats.record(
            CallRecord(
                ok=result.ok,
                items=len(result.items),
                latency=result.latency,
                origin="network",
                rate_limited=ctx.rate_limited,
                timed_out=ctx.timed_out,
                failovers=ctx.failovers,
                attempts=ctx.attempts,
                usage=ctx.usage,
                searched=ctx.searched,
            )
        )
        if not result.ok:
            log.warning("%s search failed after %s: %s", self.name, plural(ctx.attempts, "attempt"), result.error)
        elif self.cache is not None:
            try:
                self.cache.put(
                    key, backend=self.name, query=text, params=self.request_params(), result=result
                )
            except sqlite3.Error as exc:
                log.warning("%s: search cache write failed (%s)", self.name, type(exc).__name__)
        return result

    def _max_failovers(self) -> int:
        return 0

    def _scrub(self, items: tuple[SearchItem, ...]) -> tuple[SearchItem, ...]:
        """Items with every known key and personal value masked: a page that echoes the request
        (a key in a URL, the contact in a User-Agent) must not show it to the model."""
        secrets = (*self.secrets(), *self.private_values().values())
        if not secrets:
            return items
        return tuple(
            SearchItem(
                title=redact_known(item.title, secrets),
                content=redact_known(item.content, secrets),
                source=redact_known(item.source, secrets) if item.source is not None else None,
                url=redact_known(item.url, secrets) if item.url is not None else None,
            )
            for item in items
        )

    async def _run_attempts(self, ctx: CallContext) -> SearchResult:
        retries = 0
        while True:
            outcome = await self._guarded_attempt(ctx)
            ctx.attempts += 1
            ctx.rate_limited |= outcome.rate_limited
            if outcome.items is not None:
                return SearchResult(ok=True, items=self._scrub(outcome.items), status=outcome.status)
            if not outcome.retryable:
                return self._failure(outcome, ctx)
            if outcome.failover and ctx.failovers < self._max_failovers():
                ctx.failovers += 1
                log.info("%s: %s; switching credential", self.name, outcome.error)
                continue
            retries += 1
            if retries > self.max_retries:
                return self._failure(outcome, ctx)
            # The server's requested wait wins over our own backoff schedule.
            delay = outcome.retry_after if outcome.retry_after is not None else self.backoff.delay(retries)
            if delay > self.max_retry_after:
                return self._failure(outcome, ctx, note=f"server asked to wait {delay:.0f} s")
            if self.clock.now() + delay >= ctx.deadline:
                return self._failure(outcome, ctx, note="call deadline reached")
            log.info(
                "%s: %s; retry %d/%d in %.2f s", self.name, outcome.error, retries, self.max_retries, delay
            )
            await self.clock.sleep(delay)

    def _failure(self, outcome: Outcome, ctx: CallContext, note: str | None = None) -> SearchResult:
        error = outcome.error or "unknown error"
        details = [d for d in (note, f"{ctx.attempts} attempts" if ctx.attempts > 1 else None) if d]
        if details:
            error = f"{error} ({'; '.join(details)})"
        return SearchResult(ok=False, status=outcome.status, error=sanitise_error(error, self.secrets()))

    async def _guarded_attempt(self, ctx: CallContext) -> Outcome:
        async with self._semaphore:
            await self._before_attempt(ctx)
            remaining = ctx.deadline - self.clock.now()
            if remaining <= 0:
                ctx.timed_out = True
                return Outcome.fail("request timeout (call deadline reached)")
            limit = min(self.total_timeout, remaining)
            try:
                async with asyncio.timeout(limit):
                    return await self._attempt(ctx)
            except httpx.TimeoutException as exc:
                ctx.timed_out = True
                return Outcome.retry(f"request timeout ({self._httpx_timeout_note(exc)})")
            except TimeoutError:
                ctx.timed_out = True
                if limit < self.total_timeout:  # no time left for another attempt either
                    return Outcome.fail("request timeout (call deadline reached)")
                return Outcome.retry(f"request timeout (total limit of {self.total_timeout:g} s reached)")
            except (httpx.DecodingError, zlib.error):
                return Outcome.fail("response decoding error (bad compressed body)")
            except (httpx.TransportError, OSError, EOFError) as exc:  # refused, reset, cut off, ...
                return Outcome.retry(f"network error ({type(exc).__name__})")
            except httpx.HTTPError as exc:  # e.g. too many redirects
                return Outcome.fail(f"HTTP client error ({type(exc).__name__})")
            except LineTooLong:
                return Outcome.fail(f"event stream line too long (> {getattr(self, 'max_line_bytes', 0)} bytes)")
            except ResponseTooLarge:
                return Outcome.fail(f"response too large (> {self.max_body_bytes} bytes)")
            except (json.JSONDecodeError, UnicodeDecodeError):
                return Outcome.fail("invalid JSON response")
            except PayloadError as exc:
                return Outcome.fail(sanitise_error(f"unexpected response schema: {exc}", self.secrets()))

    def _httpx_timeout_note(self, exc: httpx.TimeoutException) -> str:
        """Which per-operation limit fired, in words."""
        if isinstance(exc, httpx.ReadTimeout):
            return f"no data for {self.timeout:g} s"
        if isinstance(exc, httpx.ConnectTimeout):
            return f"no connection within {self.timeout:g} s"
        if isinstance(exc, httpx.WriteTimeout):
            return f"could not send for {self.timeout:g} s"
        return f"{type(exc).__name__} after {self.timeout:g} s"
