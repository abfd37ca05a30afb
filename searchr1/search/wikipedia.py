"""Wikipedia backend: one Action API request returns the top pages with plain-text intros.

``generator=search`` ranks pages, ``prop=extracts|info`` adds the lead section (``exintro``,
which is what allows more than one extract per request) and the page URL. Politeness: a
descriptive User-Agent (project name, version and URL, plus the user's contact from
``SEARCHR1_CONTACT``), ``maxlag``, at most 3 requests in flight and a start-rate limiter shared
by all concurrent calls (200 per minute by default), ``Retry-After`` honoured on HTTP 429 and
on ``maxlag`` errors (which arrive as HTTP 200, with a ``MediaWiki-API-Error`` header). No key
is needed.

Wikimedia answers HTTP 403 to clients it will not serve (typically a User-Agent without a way
to reach its operator). Retrying cannot help and every later search would fail the same way,
so a 403 raises :class:`WikipediaRefusedError` out of ``search()``: the run stops with one
line that says to set ``SEARCHR1_CONTACT``, instead of training on error observations.
"""

from __future__ import annotations

import logging
import re
from typing import Unpack

import httpx

from searchr1.search.base import (
    CLIENT_PRODUCT,
    PROJECT_URL,
    BackendOptions,
    CallContext,
    HttpSearchBackend,
    Outcome,
    PayloadError,
    PipelineOptions,
    SearchRefusedError,
    check_url,
    http_status_outcome,
    read_json,
    truncate,
)
from searchr1.search.limits import StartRateLimiter, parse_retry_after
from searchr1.basics.secrets import Secret, redact_url, url_secrets
from searchr1.basics.json_types import JsonValue
from searchr1.core.types import SearchItem

log = logging.getLogger("searchr1.search")

DEFAULT_API_URL = "https://en.wikipedia.org/w/api.php"
CONTACT_ENV = "SEARCHR1_CONTACT"
CONTACT_PLACEHOLDER = "<CONTACT>"  # what recordings show instead of the user's contact
MAXLAG_DEFAULT_WAIT = 5.0  # seconds, when a maxlag error carries no Retry-After
RATE_LIMIT_CODES = {"maxlag", "ratelimited"}
API_ERROR_HEADER = "mediawiki-api-error"


class WikipediaRefusedError(SearchRefusedError):
    """Wikimedia refused the client (HTTP 403); names ``SEARCHR1_CONTACT``, never its value."""

    def __init__(self, *, contact_set: bool) -> None:
        if contact_set:
            advice = (
                f"the User-Agent already carries the contact from {CONTACT_ENV} (or "
                "--wikipedia-contact); make sure it is an e-mail address or URL where you can be "
                "reached, and see https://w.wiki/4wJS"
            )
        else:
            advice = (
                f"Wikimedia requires a way to reach you in the User-Agent: export "
                f"{CONTACT_ENV}=you@example.org (or pass --wikipedia-contact)"
            )
        super().__init__(f"Wikipedia refused the search client (HTTP 403); {advice}")
        self.contact_set = contact_set


def user_agent(contact: str | None) -> str:
    """``<client>/<version> (<project URL>[; <contact>]) <library>/<version>``, the format
    Wikimedia's User-Agent policy asks for."""
    library = "httpx/" + ".".join(httpx.__version__.split(".")[:2])
    reach = f"{PROJECT_URL}; {contact}" if contact else PROJECT_URL
    return f"{CLIENT_PRODUCT} ({reach}) {library}"


def mediawiki_params(**params: str | int | float | bool | None) -> dict[str, str]:
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


def api_error(payload: object) -> tuple[str, str] | None:
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


def parse_wikipedia_payload(payload: object, *, limit: int = 3) -> tuple[SearchItem, ...]:
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


class WikipediaApiOptions(PipelineOptions, total=False):
    """The options of :class:`WikipediaApiBackend` but ``max_body_bytes`` (which the page backend
    sets itself; :class:`WikipediaOptions` has them all)."""

    concurrency: int
    timeout: float
    max_retries: int
    api_url: str
    contact: str | None
    maxlag: int | None
    rate_limit_per_minute: float
    limiter: StartRateLimiter | None


class WikipediaOptions(WikipediaApiOptions, total=False):
    max_body_bytes: int


class WikipediaApiBackend(HttpSearchBackend):
    """What every client of the Action API shares: the User-Agent with the contact, ``maxlag``,
    the start-rate limiter (pass ``limiter`` to share one between clients), ``Retry-After`` on
    HTTP 429 and on ``maxlag``/``ratelimited`` errors, and HTTP 403 as
    :class:`WikipediaRefusedError`. Subclasses build the request and read the payload
    (:meth:`_api_get`)."""

    name = "wikipedia"

    def __init__(
        self,
        *,
        api_url: str = DEFAULT_API_URL,
        contact: str | None = None,
        maxlag: int | None = 5,
        rate_limit_per_minute: float = 200.0,
        limiter: StartRateLimiter | None = None,
        concurrency: int = 3,
        timeout: float = 15.0,
        **kwargs: Unpack[BackendOptions],
    ) -> None:
        super().__init__(concurrency=concurrency, timeout=timeout, **kwargs)
        self.api_url = check_url(api_url, "wikipedia api_url")
        contact = contact.strip() if isinstance(contact, str) else None
        if contact and any(ch in contact for ch in "()\r\n"):
            raise ValueError(
                f"wikipedia: the contact must not contain parentheses or line breaks ({CONTACT_ENV})"
            )
        self.contact = contact or None
        self.maxlag = maxlag
        self.limiter = limiter or StartRateLimiter(rate_limit_per_minute, clock=self.clock)
        self.headers = {"User-Agent": user_agent(contact), "Accept": "application/json"}

    def request_params(self) -> dict[str, object]:
        return {"api_url": redact_url(self.api_url)}

    def secrets(self) -> tuple[Secret, ...]:
        return url_secrets(self.api_url)

    def private_values(self) -> dict[str, Secret]:
        return {CONTACT_PLACEHOLDER: Secret(self.contact)} if self.contact else {}

    async def _before_attempt(self, ctx: CallContext) -> None:
        await self.limiter.acquire()

    async def _api_get(self, params: dict[str, str]) -> Outcome | tuple[JsonValue, int]:
        """One GET of the API: ``(payload, HTTP status)``, or the :class:`Outcome` of a failure
        (an HTTP error, an API error envelope; rate limits pause the shared limiter)."""
        async with self._client.stream("GET", self.api_url, params=params, headers=self.headers) as response:
            if response.status_code == 403:
                raise WikipediaRefusedError(contact_set=self.contact is not None)
            status = http_status_outcome(response)
            if status is not None:
                if status.rate_limited and status.retry_after:
                    self.limiter.pause_for(status.retry_after)
                return status
            header_code = response.headers.get(API_ERROR_HEADER)
            try:
                payload = await read_json(response, self.max_body_bytes)
            except (ValueError, UnicodeDecodeError):
                if header_code is None:
                    raise
                payload = {"error": {"code": header_code}}  # the header names the error anyway
            error = api_error(payload)
            if error is None and header_code is not None:
                error = (header_code, "")
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
            return payload, response.status_code


class WikipediaSearchBackend(WikipediaApiBackend):
    name = "wikipedia"

    def __init__(self, *, limit: int = 3, exchars: int = 1200, **kwargs: Unpack[WikipediaOptions]) -> None:
        super().__init__(**kwargs)
        if not 1 <= limit <= 50:
            raise ValueError(f"wikipedia: limit must be 1..50, got {limit}")
        if not 1 <= exchars <= 1200:
            raise ValueError(f"wikipedia: exchars must be 1..1200 (TextExtracts' range), got {exchars}")
        self.limit = limit
        self.exchars = exchars

    def request_params(self) -> dict[str, object]:
        return {**super().request_params(), "limit": self.limit, "exchars": self.exchars}

    def replay_options(self) -> dict[str, object]:
        return {**super().replay_options(), **self.request_params(), "maxlag": self.maxlag}

    async def _attempt(self, ctx: CallContext) -> Outcome:
        params = search_params(ctx.query, limit=self.limit, exchars=self.exchars, maxlag=self.maxlag)
        answer = await self._api_get(params)
        if isinstance(answer, Outcome):
            return answer
        payload, status = answer
        return Outcome.success(parse_wikipedia_payload(payload, limit=self.limit), status)
