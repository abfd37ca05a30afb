"""Wikipedia backend: one Action API request returns the top pages with plain-text intros.

``generator=search`` ranks pages, ``prop=extracts|info`` adds the lead section (``exintro``,
which is what allows more than one extract per request) and the page URL. Politeness: a
descriptive User-Agent with a contact, ``maxlag``, at most 3 requests in flight and a start-rate
limiter shared by all concurrent calls (200 per minute by default), ``Retry-After`` honoured on
HTTP 429 and on ``maxlag`` errors (which arrive as HTTP 200). No key is needed.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx

from searchr1.search.base import (
    CLIENT_PRODUCT,
    CallContext,
    HttpSearchBackend,
    Outcome,
    PayloadError,
    check_url,
    http_status_outcome,
    read_json,
    truncate,
)
from searchr1.search.limits import StartRateLimiter, parse_retry_after
from searchr1.search.types import SearchItem

log = logging.getLogger("searchr1.search")

DEFAULT_API_URL = "https://en.wikipedia.org/w/api.php"
CONTACT_ENV = "SEARCHR1_CONTACT"
UNSET_CONTACT = "contact unset: export SEARCHR1_CONTACT"
MAXLAG_DEFAULT_WAIT = 5.0  # seconds, when a maxlag error carries no Retry-After
RATE_LIMIT_CODES = {"maxlag", "ratelimited"}


def user_agent(contact: str | None) -> str:
    """``<client>/<version> (<contact>) <library>/<version>``, as Wikimedia's policy asks."""
    library = "httpx/" + ".".join(httpx.__version__.split(".")[:2])
    return f"{CLIENT_PRODUCT} ({contact or UNSET_CONTACT}) {library}"


def mediawiki_params(**params: Any) -> dict[str, str]:
    """Render API parameters, keeping MediaWiki's boolean rule in mind.

    A boolean parameter is true whenever it is present, whatever its value, so ``True``
    becomes ``"1"`` and ``False``/``None`` leave the key out (``exintro=false`` would mean true).
    """
    out: dict[str, str] = {}
    for key, value in params.items():
        if value is None or value is False:
            continue
        out[key] = "1" if value is True else str(value)
    return out


def search_params(
    query: str, *, limit: int = 3, exchars: int = 1200, maxlag: int | None = 5
) -> dict[str, str]:
    """Query parameters of one search + extracts request."""
    return mediawiki_params(
        action="query",
        format="json",
        formatversion=2,
        generator="search",
        gsrsearch=query,
        gsrlimit=limit,
        gsrnamespace=0,
        prop="extracts|info",
        exintro=True,
        explaintext=True,
        exchars=exchars,
        exlimit=limit,
        inprop="url",
        redirects=True,
        maxlag=maxlag,
    )


def api_error(payload: Any) -> tuple[str, str] | None:
    """``(code, info)`` of an API error envelope (either error format), else ``None``."""
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict):
        return str(error.get("code") or "unknown"), str(error.get("info") or "")
    errors = payload.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        return str(errors[0].get("code") or "unknown"), str(errors[0].get("text") or "")
    return None


def parse_wikipedia_payload(payload: Any, *, limit: int = 3) -> tuple[SearchItem, ...]:
    """The search hits of a ``query`` response, best first, pages without text dropped.

    ``query.pages`` is not in rank order; each page's ``index`` is its 1-based rank. A
    response without ``query`` means no hits. ``formatversion=1`` (pages keyed by id) is
    accepted too. Raises :class:`PayloadError` naming the field that has the wrong shape.
    """
    if not isinstance(payload, dict):
        raise PayloadError(f"top level is {type(payload).__name__}, expected an object")
    query = payload.get("query")
    if query is None:
        return ()
    if not isinstance(query, dict):
        raise PayloadError("query is not an object")
    pages = query.get("pages")
    if pages is None:
        return ()
    if isinstance(pages, dict):
        pages = list(pages.values())
    if not isinstance(pages, list):
        raise PayloadError("query.pages is not a list")
    ranked: list[tuple[float, int, SearchItem]] = []
    for position, page in enumerate(pages):
        if not isinstance(page, dict):
            raise PayloadError(f"query.pages[{position}] is not an object")
        extract = page.get("extract")
        if extract is None or extract == "":
            continue
        if not isinstance(extract, str):
            raise PayloadError(f"query.pages[{position}].extract is not a string")
        title = page.get("title")
        if title is not None and not isinstance(title, str):
            raise PayloadError(f"query.pages[{position}].title is not a string")
        index = page.get("index")
        rank = float(index) if isinstance(index, (int, float)) and not isinstance(index, bool) else 1e9
        url = page.get("fullurl") or page.get("canonicalurl")
        content = truncate(extract)
        if not content:
            continue
        item = SearchItem(
            title=(title or "Untitled").strip() or "Untitled",
            content=content,
            source="Wikipedia",
            url=url if isinstance(url, str) else None,
        )
        ranked.append((rank, position, item))
    ranked.sort(key=lambda entry: (entry[0], entry[1]))
    return tuple(item for _, _, item in ranked[:limit])


_SAFE_CODE = re.compile(r"[^A-Za-z0-9_-]")


class WikipediaSearchBackend(HttpSearchBackend):
    name = "wikipedia"

    def __init__(
        self,
        *,
        api_url: str = DEFAULT_API_URL,
        contact: str | None = None,
        limit: int = 3,
        exchars: int = 1200,
        maxlag: int | None = 5,
        rate_limit_per_minute: float = 200.0,
        limiter: StartRateLimiter | None = None,
        concurrency: int = 3,
        timeout: float = 15.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(concurrency=concurrency, timeout=timeout, **kwargs)
        if not 1 <= limit <= 50:
            raise ValueError(f"wikipedia: limit must be 1..50, got {limit}")
        if not 1 <= exchars <= 1200:
            raise ValueError(f"wikipedia: exchars must be 1..1200 (TextExtracts' range), got {exchars}")
        self.api_url = check_url(api_url, "wikipedia api_url")
        self.contact = contact
        self.limit = limit
        self.exchars = exchars
        self.maxlag = maxlag
        self.limiter = limiter or StartRateLimiter(rate_limit_per_minute, clock=self.clock)
        self.headers = {"User-Agent": user_agent(contact), "Accept": "application/json"}

    def request_params(self) -> dict[str, Any]:
        return {"api_url": self.api_url, "limit": self.limit, "exchars": self.exchars}

    async def _before_attempt(self, ctx: CallContext) -> None:
        await self.limiter.acquire()

    async def _attempt(self, ctx: CallContext) -> Outcome:
        params = search_params(ctx.query, limit=self.limit, exchars=self.exchars, maxlag=self.maxlag)
        async with self._client.stream("GET", self.api_url, params=params, headers=self.headers) as response:
            status = http_status_outcome(response)
            if status is not None:
                if status.rate_limited and status.retry_after:
                    self.limiter.pause_for(status.retry_after)
                if response.status_code == 403:
                    status.error = "HTTP 403 (refused; check the User-Agent contact)"
                return status
            payload = await read_json(response, self.max_body_bytes)
            error = api_error(payload)
            if error is not None:
                code = _SAFE_CODE.sub("", error[0])[:40] or "unknown"
                if code in RATE_LIMIT_CODES:
                    wait = parse_retry_after(response.headers.get("retry-after"))
                    wait = MAXLAG_DEFAULT_WAIT if wait is None else wait
                    self.limiter.pause_for(wait)
                    return Outcome.retry(
                        f"Wikipedia API {code}", response.status_code, retry_after=wait, rate_limited=True
                    )
                return Outcome.fail(f"Wikipedia API error ({code})", response.status_code)
            return Outcome.success(parse_wikipedia_payload(payload, limit=self.limit), response.status_code)
