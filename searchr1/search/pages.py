"""``open_page`` over the local BM25 index: a page's passages in corpus order; and
:func:`page_backend_for`, the page backend that reads the corpus a search backend searches.

A call names a page by its title, as search results show it (``Title: Paris``), or by the id of
one of its passages. The answer is the page's passages from ``offset`` on, at most
:data:`PAGE_WINDOW` of them; the rollout fits them to the observation budget as it fits search
results. Each item says where it stands in the page (``Paris (passage 2 of 5)``), so the model
knows which ``offset`` reads on. A page that does not exist, or an offset past its end, is an
answer with nothing in it (the policy's miss, not a tool failure: it stays in the reward).

How a call names a page and its offset, and the page's passages in the index, are
:mod:`searchr1.bm25.page_naming`'s (every page backend reads a call the same way). The index
finds a page through its title and id tables (:mod:`searchr1.bm25.pages`) without scanning the
corpus; the lookup runs in a worker thread, since a cold memory-mapped page of a 21M-passage
index is a disk read.

The other page backends: :mod:`searchr1.search.wikipedia_pages` (the Action API, each page
pinned to one revision) and :mod:`searchr1.search.retriever_pages` (``POST /page`` of
``retriever serve``).
"""

from __future__ import annotations

import asyncio
import time

from searchr1.bm25.corpus import split_contents
from searchr1.bm25.index import BM25Index, Hit
from searchr1.bm25.page_naming import PAGE_WINDOW, page_name, page_offset, page_passages
from searchr1.core.tools import ToolBackend, ToolCall
from searchr1.core.types import SearchItem, SearchResult
from searchr1.search.tool import SearchBackend
from searchr1.search.base import truncate
from searchr1.search.retriever import DEFAULT_SOURCE


def page_backend_for(search: SearchBackend) -> ToolBackend:
    """The ``open_page`` backend over the corpus ``search`` searches: the local index's pages,
    Wikipedia's pages (through the same client, limiter and contact), or the pages of the
    retriever's server (``POST /page`` beside its ``/retrieve``). A replayed backend's pages are
    replayed from its cassette. Raises ``ValueError`` for a backend without pages."""
    from searchr1.search.local import LocalSearchBackend
    from searchr1.search.replay import ReplayBackend
    from searchr1.search.retriever import RetrieverSearchBackend
    from searchr1.search.wikipedia import WikipediaSearchBackend

    inner = search.backend if isinstance(search, ReplayBackend) else search
    if isinstance(inner, LocalSearchBackend):
        return LocalPageBackend(inner.index, source=inner.source)
    if isinstance(inner, WikipediaSearchBackend):
        from searchr1.search.wikipedia_pages import WikipediaPageBackend

        return WikipediaPageBackend.beside(inner)
    if isinstance(inner, RetrieverSearchBackend):
        from searchr1.search.retriever_pages import RetrieverPageBackend

        return RetrieverPageBackend.beside(inner)
    raise ValueError(f"no page backend for the {search.name} search backend")


class LocalPageBackend:
    """Runs ``open_page`` against an opened :class:`~searchr1.bm25.index.BM25Index`."""

    name = "local"

    def __init__(self, index: BM25Index, *, source: str = DEFAULT_SOURCE, window: int = PAGE_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"open_page: window must be at least 1 passage, got {window}")
        self.index = index
        self.source = source
        self.window = window

    def passages(self, name: str) -> list[Hit]:
        """Every passage of the page ``name`` names: a passage id's page, else the page of that title."""
        return page_passages(self.index, name)

    async def call(self, call: ToolCall) -> SearchResult:
        started = time.perf_counter()
        offset = page_offset(call.arguments)
        hits = await asyncio.to_thread(self.passages, page_name(str(call.arguments["page"])))
        items = []
        for position in range(offset, min(len(hits), offset + self.window)):
            title, text = split_contents(hits[position].contents)
            items.append(SearchItem(title=f"{title} (passage {position + 1} of {len(hits)})",
                                    content=truncate(text), source=self.source))
        return SearchResult(ok=True, items=tuple(items), latency=time.perf_counter() - started, attempts=1)

    def __repr__(self) -> str:
        return f"LocalPageBackend(index={str(self.index.directory)!r}, window={self.window})"
