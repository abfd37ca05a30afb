"""``open_page`` over the local BM25 index: a page's passages in corpus order.

A call names a page by its title, as search results show it (``Title: Paris``), or by the id of
one of its passages. The answer is the page's passages from ``offset`` on, at most
:data:`PAGE_WINDOW` of them; the rollout fits them to the observation budget as it fits search
results. Each item says where it stands in the page (``Paris (passage 2 of 5)``), so the model
knows which ``offset`` reads on. A page that does not exist, or an offset past its end, is an
answer with nothing in it (the policy's miss, not a tool failure: it stays in the reward).

The index finds a page through its title and id tables (:mod:`searchr1.bm25.pages`) without
scanning the corpus; the lookup runs in a worker thread, since a cold memory-mapped page of a
21M-passage index is a disk read.
"""

from __future__ import annotations

import asyncio
import time

from searchr1.bm25.corpus import split_contents
from searchr1.bm25.index import BM25Index, Hit
from searchr1.core.tools import ToolCall
from searchr1.core.types import SearchItem, SearchResult
from searchr1.search.base import truncate
from searchr1.search.retriever import DEFAULT_SOURCE

PAGE_WINDOW = 4  # passages one call returns at most (about 400 words of wiki-18)


def page_name(text: str) -> str:
    """The page a call names, as the model wrote it: trimmed, one pair of quotes dropped."""
    name = text.strip()
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1].strip()
    return name


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
        by_id = self.index.passage_of_id(name)
        return self.index.page(split_contents(by_id.contents)[0] if by_id is not None else name)

    async def call(self, call: ToolCall) -> SearchResult:
        started = time.perf_counter()
        offset = call.arguments.get("offset", 0)
        offset = offset if isinstance(offset, int) and not isinstance(offset, bool) else 0
        hits = await asyncio.to_thread(self.passages, page_name(str(call.arguments["page"])))
        items = []
        for position in range(offset, min(len(hits), offset + self.window)):
            title, text = split_contents(hits[position].contents)
            items.append(SearchItem(title=f"{title} (passage {position + 1} of {len(hits)})",
                                    content=truncate(text), source=self.source))
        return SearchResult(ok=True, items=tuple(items), latency=time.perf_counter() - started, attempts=1)

    def __repr__(self) -> str:
        return f"LocalPageBackend(index={str(self.index.directory)!r}, window={self.window})"
