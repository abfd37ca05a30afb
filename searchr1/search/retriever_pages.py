"""``open_page`` over a retrieval server that has the documents: ``POST /page`` of ``retriever serve``.

The official Search-R1 retrieval server answers only ``POST /retrieve``; ``retriever serve``
(:mod:`searchr1.bm25.server`) holds the index, so it also answers ``POST /page`` beside it::

    POST .../page  {"page": "Eiffel Tower", "offset": 4, "window": 4}
    -> {"result": [{"id": "9230", "contents": "\\"Eiffel Tower\\"\\nThe tower is ..."}, ...], "total": 31}

``page`` is a title or a passage id, read as the local backend reads it; ``result`` holds the
page's passages from ``offset`` on, at most ``window``, in corpus order, in the ``/retrieve``
document layout (quoted title on the first line); ``total`` is the page's length, 0 for a page
that is not there. The page URL is the retriever URL with its last path segment ``page``
(``http://host:8000/retrieve`` -> ``http://host:8000/page``).

Each call is one request (the server windows the page), through the retriever client's pipeline
(:class:`~searchr1.search.base.HttpSearchBackend`: retries, backoff, timeouts, single-flight,
capped bodies). Items read as the local backend's: ``Eiffel Tower (passage 5 of 31)``. A page
that is not there is ``ok=True`` with no items; a failure is ``ok=False`` with a one-line error.
A server without ``/page`` (HTTP 404 or 405: the official one) raises
:class:`RetrieverServesNoPagesError` at the first read, which stops the run with one line.
"""

from __future__ import annotations

import json
from typing import TypedDict, Unpack

import httpx

from searchr1.bm25.corpus import split_contents
from searchr1.core.tools import ToolCall
from searchr1.core.types import SearchItem, SearchResult
from searchr1.basics import invocation
from searchr1.search.base import (BackendOptions, CallContext, HttpSearchBackend, Outcome, PayloadError,
                                  SearchRefusedError, check_url, http_status_outcome, read_json, truncate)
from searchr1.bm25.page_naming import PAGE_WINDOW, page_name, page_offset
from searchr1.search.retriever import (DEFAULT_SOURCE, DEFAULT_URL, REFUSED_STATUSES, RetrieverRefusedError,
                                       RetrieverSearchBackend, key_headers)
from searchr1.basics.secrets import Secret, redact_url, url_secrets
from searchr1.search.stats import RecentSearchStats

NO_PAGES_STATUSES = (404, 405)


class RetrieverServesNoPagesError(SearchRefusedError):
    """The retrieval server has no ``POST /page`` (the official Search-R1 server has only
    ``/retrieve``); names the URL without its credentials."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(
            f"the retriever at {redact_url(url)} serves no pages (POST /page answered HTTP {status}; the official "
            f"Search-R1 server has only /retrieve): serve the index with "
            f"`{invocation.command('retriever serve --index DIR')}`, or drop open_page from --tools")
        self.status = status


def page_url(retrieve_url: str) -> str:
    """The ``/page`` URL beside a ``/retrieve`` URL: its last path segment replaced by ``page``."""
    url = httpx.URL(retrieve_url)
    head = url.path.rsplit("/", 1)[0] if "/" in url.path else ""
    return str(url.copy_with(path=f"{head}/page"))


def parse_page_answer(payload: object, *, offset: int, source: str = DEFAULT_SOURCE) -> tuple[SearchItem, ...]:
    """The items of a ``/page`` answer read from ``offset``. Raises :class:`PayloadError` naming
    the field with the wrong shape."""
    if not isinstance(payload, dict):
        raise PayloadError(f"top level is {type(payload).__name__}, expected an object")
    result, total = payload.get("result"), payload.get("total")
    if not isinstance(result, list):
        raise PayloadError("result is not a list")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise PayloadError("total is not a count")
    if result and offset + len(result) > total:
        raise PayloadError(f"result holds passages past total ({total})")
    items = []
    for position, document in enumerate(result):
        if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
            raise PayloadError(f"result[{position}] has no string 'contents'")
        title, text = split_contents(document["contents"])
        items.append(SearchItem(title=f"{title or 'Untitled'} (passage {offset + position + 1} of {total})",
                                content=truncate(text), source=source))
    return tuple(items)


class PageWindow(TypedDict, total=False):
    """What :meth:`RetrieverPageBackend.beside` takes besides the search backend."""

    window: int  # passages one read gives


class RetrieverPageBackend(HttpSearchBackend):
    """Runs ``open_page`` against ``POST /page`` of a retrieval server (see the module docstring)."""

    name = "retriever-pages"

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        source: str = DEFAULT_SOURCE,
        window: int = PAGE_WINDOW,
        api_key: Secret | None = None,
        concurrency: int = 32,
        timeout: float = 30.0,
        **kwargs: Unpack[BackendOptions],
    ) -> None:
        super().__init__(concurrency=concurrency, timeout=timeout, **kwargs)
        if window < 1:
            raise ValueError(f"open_page: window must be at least 1 passage, got {window}")
        self.stats = RecentSearchStats(self.name)  # no step drains a tool's window
        self.url = check_url(page_url(check_url(url, "retriever url")), "retriever page url")
        self.source = source
        self.window = window
        self.api_key = api_key

    @classmethod
    def beside(cls, search: RetrieverSearchBackend, **options: Unpack[PageWindow]) -> RetrieverPageBackend:
        """A page backend at the ``/page`` beside ``search``'s ``/retrieve``, sharing its HTTP
        client, key, clock, backoff and retry settings (its client stays ``search``'s to close)."""
        return cls(url=search.url, source=search.source, api_key=search.api_key, client=search._client,
                   clock=search.clock,
                   backoff=search.backoff, max_retries=search.max_retries, timeout=search.timeout,
                   total_timeout=search.total_timeout, max_retry_after=search.max_retry_after,
                   concurrency=search.concurrency, remember=search.remember, **options)

    def request_params(self) -> dict[str, object]:
        return {"url": redact_url(self.url), "window": self.window}

    def secrets(self) -> tuple[Secret, ...]:
        return (*url_secrets(self.url), *((self.api_key,) if self.api_key else ()))

    async def call(self, call: ToolCall) -> SearchResult:
        name = page_name(str(call.arguments["page"]))
        if not name:
            return SearchResult(ok=True)
        # One read is one request: the page and the offset travel as the pipeline's query text.
        return await self.search(json.dumps([name, page_offset(call.arguments)], ensure_ascii=False))

    async def _attempt(self, ctx: CallContext) -> Outcome:
        name, offset = json.loads(ctx.query)
        body = {"page": name, "offset": offset, "window": self.window}
        async with self._client.stream("POST", self.url, json=body, headers=key_headers(self.api_key)) as response:
            if response.status_code in REFUSED_STATUSES:
                raise RetrieverRefusedError(self.url, response.status_code, key_sent=self.api_key is not None)
            if response.status_code in NO_PAGES_STATUSES:
                raise RetrieverServesNoPagesError(self.url, response.status_code)
            status = http_status_outcome(response)
            if status is not None:
                return status
            payload = await read_json(response, self.max_body_bytes)
            return Outcome.success(parse_page_answer(payload, offset=offset, source=self.source),
                                   response.status_code)

    def __repr__(self) -> str:
        return f"RetrieverPageBackend(url={redact_url(self.url)!r}, window={self.window})"
