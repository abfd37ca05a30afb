"""``open_page`` over Wikipedia: a page's paragraphs, every read of it in a run from one revision.

A page is read in two Action API requests, each shaped as the MediaWiki documentation gives it
(https://www.mediawiki.org/wiki/API:Revisions and https://www.mediawiki.org/wiki/API:Parsing_wikitext):

1. resolve the name to a revision::

       GET api.php?action=query&format=json&formatversion=2&prop=revisions&titles=NAME
           &rvprop=ids|timestamp&redirects=1&maxlag=5
           [&rvlimit=1&rvdir=older&rvstart=AS_OF]    (with a pin date)
       -> {"query": {"normalized": [{"from", "to"}], "redirects": [{"from", "to"}],
                     "pages": [{"pageid", "ns", "title", "revisions": [{"revid", "parentid", "timestamp"}]}]}}

   ``redirects`` follows a redirect to its target (``title`` is the target's); a page that does
   not exist comes back as ``{"ns": 0, "title": ..., "missing": true}``, a title the wiki cannot
   hold as ``{"invalid": true, ...}``. Without a pin date the page's latest revision is the one
   named; with ``as_of`` (e.g. :data:`WIKI18_DUMP_DATE`, the date of the wiki-18 dump the paper's
   retriever indexes) it is the last revision at or before that time (``rvdir=older`` enumerates
   from ``rvstart`` back), and a page created later has none: a miss. Redirects are followed as
   they stand today, whatever the pin date.

2. parse that revision::

       GET api.php?action=parse&format=json&formatversion=2&oldid=REV&prop=text|revid
           &disableeditsection=1&disablelimitreport=1&maxlag=5
       -> {"parse": {"title", "pageid", "revid", "text": "<div class=\"mw-parser-output\">...</div>"}}

The passages are the page's paragraphs: the text of the HTML's ``<p>`` elements (stdlib
:mod:`html.parser`), leaving out tables (infoboxes), figures, styles, scripts, MathML and
citation markers (``<sup class="reference">``); whitespace is collapsed, empty paragraphs are
dropped, and a paragraph longer than an item's content limit is split at spaces. Each item names
its place and its revision: ``Eiffel Tower (passage 2 of 31, revision 1234567890)``; a redirect's
items carry its target's title.

Pinning: the first read of a name in a run resolves it; every later read of that name, or of the
title it resolved to, reads that same revision, and a name that missed stays a miss. The
passages of the last ``keep_pages`` revisions read are kept in memory, so reading on (another
``offset``) sends no request; a revision that fell out is parsed again by its id (the same text).
A read therefore counts two requests in ``attempts`` the first time (one for a miss), none after.

Everything else is the search client's (:class:`~searchr1.search.wikipedia.WikipediaApiBackend`
on :class:`~searchr1.search.base.HttpSearchBackend`): the User-Agent with the contact, ``maxlag``,
the shared start-rate limiter, ``Retry-After``, HTTP 403 as the same refusal that stops the run,
retries with backoff, timeouts, capped bodies (16 MiB here: a long article's HTML is large).
A missing page is ``ok=True`` with no items (the policy's miss); a failure is ``ok=False`` with a
one-line error, as for search. There is no persistent cache: it would outlive the pin.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import TypedDict, Unpack

from searchr1.core.tools import ToolCall
from searchr1.core.types import SearchItem, SearchResult
from searchr1.search.base import CONTENT_LIMIT, CallContext, Outcome, PayloadError, truncate
from searchr1.search.cache import normalise_query
from searchr1.bm25.page_naming import PAGE_WINDOW, page_name, page_offset
from searchr1.search.stats import RecentSearchStats
from searchr1.basics.unicode import valid_text
from searchr1.search.wikipedia import (WikipediaApiBackend, WikipediaApiOptions, WikipediaSearchBackend,
                                      mediawiki_params)

WIKI18_DUMP_DATE = "2018-12-20T00:00:00Z"  # the Wikipedia dump behind wiki-18
PAGE_MAX_BODY_BYTES = 16 * 1024 * 1024  # a long article's parsed HTML runs to a few MB
KEEP_PAGES = 256  # revisions whose passages stay in memory
SOURCE = "Wikipedia"
_ILLEGAL = re.compile(r"[<>\[\]|{}\x00-\x1f\x7f]")  # characters no MediaWiki title holds
_MAX_TITLE_BYTES = 255
_DISPLAYSTYLE = re.compile(r"^\{\\displaystyle\s*(.*)\}$", re.DOTALL)


@dataclass(frozen=True)
class Pin:
    """The page a name resolved to (redirects followed) and the revision every read of it sees."""

    title: str
    revision: int


def wiki_title(name: str) -> str:
    """The title to ask the API for: ``name`` without a ``#section``; ``""`` when no wiki title
    can be it (a character titles never hold, such as ``|``, which would name two pages, or more
    than 255 bytes)."""
    title = name.split("#", 1)[0].strip()
    if _ILLEGAL.search(title) or len(title.encode("utf-8", "replace")) > _MAX_TITLE_BYTES:
        return ""
    return title


def pin_timestamp(as_of: str) -> str:
    """``as_of`` (an ISO 8601 date or time; UTC unless it says otherwise) as the API's timestamp."""
    try:
        moment = datetime.fromisoformat(as_of.strip())
    except ValueError:
        raise ValueError(f"wikipedia pages: as_of must be an ISO 8601 date or time, got {as_of!r}") from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def revision_params(title: str, *, as_of: str | None = None, maxlag: int | None = 5) -> dict[str, str]:
    """Query parameters of the request that resolves ``title`` to its revision."""
    return mediawiki_params(
        action="query",
        format="json",
        formatversion=2,
        prop="revisions",
        titles=title,
        rvprop="ids|timestamp",
        rvlimit=1 if as_of else None,
        rvdir="older" if as_of else None,
        rvstart=as_of,
        redirects=True,
        maxlag=maxlag,
    )


def parse_params(revision: int, *, maxlag: int | None = 5) -> dict[str, str]:
    """Query parameters of the request that renders one revision's HTML."""
    return mediawiki_params(
        action="parse",
        format="json",
        formatversion=2,
        oldid=revision,
        prop="text|revid",
        disableeditsection=True,
        disablelimitreport=True,
        maxlag=maxlag,
    )


def parse_revision_payload(payload: object) -> Pin | None:
    """The pin a resolve answer names, or ``None`` for a page that is not there (missing,
    invalid, outside the article namespace, or without a revision at the pin date). Raises
    :class:`PayloadError` naming the field with the wrong shape."""
    if not isinstance(payload, dict):
        raise PayloadError(f"top level is {type(payload).__name__}, expected an object")
    query = payload.get("query")
    if query is None:
        return None
    if not isinstance(query, dict):
        raise PayloadError("query is not an object")
    pages = query.get("pages")
    if pages is None:
        return None  # e.g. an interwiki title: no page of this wiki
    if isinstance(pages, dict):  # formatversion=1: pages keyed by id
        pages = list(pages.values())
    if not isinstance(pages, list):
        raise PayloadError("query.pages is not a list")
    if not pages:
        return None
    page = pages[0]
    if not isinstance(page, dict):
        raise PayloadError("query.pages[0] is not an object")
    if "missing" in page or "invalid" in page or page.get("ns") != 0:
        return None
    revisions = page.get("revisions")
    if revisions is None or revisions == []:
        return None
    if not isinstance(revisions, list) or not isinstance(revisions[0], dict):
        raise PayloadError("query.pages[0].revisions is not a list of objects")
    revid = revisions[0].get("revid")
    if isinstance(revid, bool) or not isinstance(revid, int) or revid < 1:
        raise PayloadError("query.pages[0].revisions[0].revid is not a revision id")
    title = page.get("title")
    if not isinstance(title, str) or not title.strip():
        raise PayloadError("query.pages[0].title is not a string")
    return Pin(title.strip(), revid)


class _Paragraphs(HTMLParser):
    """Collects the text of ``<p>`` elements outside the subtrees a reader does not read."""

    SKIPPED_TAGS = frozenset({"table", "figure", "style", "script", "math"})
    SKIPPED_CLASSES = frozenset({"reference", "noprint", "mw-editsection", "mw-ref"})
    FORMULA_IMAGES = frozenset({"mwe-math-fallback-image-inline", "mwe-math-fallback-image-display"})
    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                      "track", "wbr"})
    CLOSES_P = frozenset({"address", "article", "aside", "blockquote", "div", "dl", "fieldset", "figure",
                          "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "main", "nav",
                          "ol", "pre", "section", "table", "ul"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._text: list[str] | None = None  # the open paragraph's pieces
        self._skip_tag: str | None = None
        self._skip_depth = 0

    def _close(self) -> None:
        if self._text is not None:
            text = " ".join("".join(self._text).split())
            if text:
                self.paragraphs.append(text)
            self._text = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is not None:
            self._skip_depth += tag == self._skip_tag
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag == "img" and classes & self.FORMULA_IMAGES and self._text is not None:
            alt = dict(attrs).get("alt") or ""
            match = _DISPLAYSTYLE.match(alt.strip())
            self._text.append(match.group(1) if match else alt)
            return
        if tag not in self.VOID and (tag in self.SKIPPED_TAGS or classes & self.SKIPPED_CLASSES):
            if tag in self.CLOSES_P:
                self._close()
            self._skip_tag, self._skip_depth = tag, 1
            return
        if tag == "p" or tag in self.CLOSES_P:
            self._close()
        if tag == "p":
            self._text = []
        elif tag == "br" and self._text is not None:
            self._text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if tag == "p":
            self._close()

    def handle_data(self, data: str) -> None:
        if self._skip_tag is None and self._text is not None:
            self._text.append(data)

    def close(self) -> None:
        super().close()
        self._close()


def split_passage(text: str, limit: int = CONTENT_LIMIT) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at spaces where there are any."""
    pieces: list[str] = []
    while len(text) > limit:
        cut = text.rfind(" ", 0, limit + 1)
        cut = cut if cut > 0 else limit
        pieces.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    if text:
        pieces.append(text)
    return pieces


def html_passages(html: str, limit: int = CONTENT_LIMIT) -> list[str]:
    """The passages of a page's parsed HTML: its paragraphs, in order, none longer than ``limit``."""
    parser = _Paragraphs()
    parser.feed(html)
    parser.close()
    return [piece for paragraph in parser.paragraphs for piece in split_passage(paragraph, limit)]


def parse_page_payload(payload: object, revision: int) -> list[str]:
    """The passages of a parse answer for ``revision``. Raises :class:`PayloadError` naming the
    field with the wrong shape, or when the answer is of another revision."""
    if not isinstance(payload, dict):
        raise PayloadError(f"top level is {type(payload).__name__}, expected an object")
    parsed = payload.get("parse")
    if not isinstance(parsed, dict):
        raise PayloadError("parse is not an object")
    revid = parsed.get("revid")
    if revid is not None and revid != revision:
        raise PayloadError(f"parse.revid is not the revision asked for ({revision})")
    text = parsed.get("text")
    if isinstance(text, dict):  # formatversion=1: {"*": html}
        text = text.get("*")
    if not isinstance(text, str):
        raise PayloadError("parse.text is not a string")
    return html_passages(text)


class PageOptions(TypedDict, total=False):
    """What :meth:`WikipediaPageBackend.beside` takes besides the search backend."""

    as_of: str | None
    window: int
    keep_pages: int


class WikipediaPageBackend(WikipediaApiBackend):
    """Runs ``open_page`` against the Wikipedia Action API (see the module docstring)."""

    name = "wikipedia-pages"

    def __init__(
        self,
        *,
        as_of: str | None = None,
        window: int = PAGE_WINDOW,
        keep_pages: int = KEEP_PAGES,
        max_body_bytes: int = PAGE_MAX_BODY_BYTES,
        **kwargs: Unpack[WikipediaApiOptions],
    ) -> None:
        if kwargs.get("cache") is not None:
            raise ValueError("wikipedia pages: no persistent cache (it would outlive the run's revision pins)")
        super().__init__(max_body_bytes=max_body_bytes, **kwargs)
        if window < 1:
            raise ValueError(f"open_page: window must be at least 1 passage, got {window}")
        if keep_pages < 1:
            raise ValueError(f"wikipedia pages: keep_pages must be at least 1, got {keep_pages}")
        self.stats = RecentSearchStats(self.name)  # no step drains a tool's window
        self.as_of = pin_timestamp(as_of) if as_of else None
        self.window = window
        self.keep_pages = keep_pages
        self._pins: dict[str, Pin | None] = {}  # a name or a resolved title -> its pin (None: a miss)
        self._kept: OrderedDict[int, tuple[SearchItem, ...]] = OrderedDict()  # revision -> passages

    @classmethod
    def beside(cls, search: WikipediaSearchBackend, **options: Unpack[PageOptions]) -> WikipediaPageBackend:
        """A page backend sharing ``search``'s HTTP client, limiter, contact, API URL, clock,
        backoff and retry settings (its client stays ``search``'s to close)."""
        return cls(api_url=search.api_url, contact=search.contact, maxlag=search.maxlag, limiter=search.limiter,
                   client=search._client, clock=search.clock, backoff=search.backoff,
                   max_retries=search.max_retries, timeout=search.timeout, total_timeout=search.total_timeout,
                   max_retry_after=search.max_retry_after, concurrency=search.concurrency,
                   remember=search.remember, **options)

    def request_params(self) -> dict[str, object]:
        return {**super().request_params(), "as_of": self.as_of}

    def pin(self, name: str) -> Pin | None:
        """The pin of ``name`` in this run (``None``: not resolved yet, or a miss)."""
        return self._pins.get(normalise_query(valid_text(name)))

    async def call(self, call: ToolCall) -> SearchResult:
        name = wiki_title(page_name(str(call.arguments["page"])))
        offset = page_offset(call.arguments)
        if not name:
            return SearchResult(ok=True)
        key = normalise_query(valid_text(name))
        if key in self._pins:
            pin = self._pins[key]
            if pin is None:
                return SearchResult(ok=True, cached=True)
            kept = self._recall(pin.revision)
            if kept is not None:
                return SearchResult(ok=True, items=self._window(pin, kept, offset), cached=True)
        result = await self.search(name)
        if not result.ok:
            return result
        pin = self._pins.get(key)
        return replace(result, items=() if pin is None else self._window(pin, result.items, offset))

    def _window(self, pin: Pin, passages: tuple[SearchItem, ...], offset: int) -> tuple[SearchItem, ...]:
        total = len(passages)
        return tuple(
            SearchItem(title=f"{passages[k].title} (passage {k + 1} of {total}, revision {pin.revision})",
                       content=truncate(passages[k].content), source=passages[k].source)
            for k in range(offset, min(total, offset + self.window)))

    def _recall(self, revision: int) -> tuple[SearchItem, ...] | None:
        kept = self._kept.get(revision)
        if kept is not None:
            self._kept.move_to_end(revision)
        return kept

    def _keep(self, revision: int, passages: tuple[SearchItem, ...]) -> None:
        self._kept[revision] = passages
        self._kept.move_to_end(revision)
        while len(self._kept) > self.keep_pages:
            self._kept.popitem(last=False)

    async def _run_attempts(self, ctx: CallContext) -> SearchResult:
        """Resolve the name (unless pinned), then parse its revision (unless kept): each stage with
        its own retries, within the call's one deadline; ``attempts`` counts both."""
        key = normalise_query(ctx.query)
        if key not in self._pins:
            resolved = await super()._run_attempts(ctx)
            if not resolved.ok:
                return resolved
        pin = self._pins.get(key)
        if pin is None:
            return SearchResult(ok=True, status=200)
        kept = self._recall(pin.revision)
        if kept is None:
            parsed = await super()._run_attempts(ctx)
            if not parsed.ok:
                return parsed
            kept = parsed.items
            self._keep(pin.revision, kept)
        return SearchResult(ok=True, items=kept, status=200)

    async def _attempt(self, ctx: CallContext) -> Outcome:
        key = normalise_query(ctx.query)
        if key not in self._pins:
            answer = await self._api_get(revision_params(ctx.query, as_of=self.as_of, maxlag=self.maxlag))
            if isinstance(answer, Outcome):
                return answer
            payload, status = answer
            pin = parse_revision_payload(payload)
            if pin is not None:  # a title read before keeps the revision it was read at
                pin = self._pins.setdefault(normalise_query(pin.title), pin)
            self._pins[key] = pin
            return Outcome.success((), status)
        pin = self._pins[key]
        assert pin is not None, "a miss is never parsed"
        answer = await self._api_get(parse_params(pin.revision, maxlag=self.maxlag))
        if isinstance(answer, Outcome):
            return answer
        payload, status = answer
        passages = parse_page_payload(payload, pin.revision)
        return Outcome.success(tuple(SearchItem(title=pin.title, content=text, source=SOURCE) for text in passages),
                               status)

    def __repr__(self) -> str:
        return (f"WikipediaPageBackend(api_url={self.request_params()['api_url']!r}, as_of={self.as_of!r}, "
                f"window={self.window})")
