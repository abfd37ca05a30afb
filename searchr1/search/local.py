"""Local backend: BM25 in this process over an index built by ``python cli.py index build``.

No network and no key: a search is a query of the memory-mapped index (:mod:`searchr1.bm25`),
answered in batches by one worker thread, so concurrent searches share a call. Everything
around it is the common pipeline of :class:`~searchr1.search.base.HttpSearchBackend`: the
cache (keyed by the corpus's sha256 and the settings), single-flight, stats, the call deadline.
Passages become items the way the retriever backend reads the official server's documents
(first line the title, the rest the text, ``source="wiki-18"`` for the Title:/Content: layout).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from searchr1.search.base import BackendOptions, CallContext, HttpSearchBackend, Outcome, passage_ident, truncate
from searchr1.search.retriever import DEFAULT_SOURCE, split_contents
from searchr1.core.types import SearchItem

if TYPE_CHECKING:
    from searchr1.bm25.index import BM25Index

INDEX_ENV = "SEARCHR1_INDEX"


class LocalSearchBackend(HttpSearchBackend):
    name = "local"

    def __init__(
        self,
        *,
        index: str | os.PathLike[str] | BM25Index,
        topk: int = 3,
        source: str = DEFAULT_SOURCE,
        concurrency: int = 64,
        timeout: float = 30.0,
        max_batch: int = 256,
        **kwargs: Unpack[BackendOptions],
    ) -> None:
        from searchr1.bm25.batcher import QueryBatcher
        from searchr1.bm25.index import BM25Index

        if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
            raise ValueError(f"local: topk must be an integer >= 1, got {topk!r}")
        if not source:
            raise ValueError("local: source label must be non-empty (it selects the Title:/Content: layout)")
        opened = index if isinstance(index, BM25Index) else BM25Index(Path(index))
        super().__init__(concurrency=concurrency, timeout=timeout, **kwargs)
        self.index = opened
        self.topk = topk
        self.source = source
        self._batcher = QueryBatcher(opened, max_batch=max_batch)

    def request_params(self) -> dict[str, object]:
        manifest = self.index.manifest
        return {"corpus_sha256": manifest["corpus"]["sha256"], "scorer": manifest["scorer"], "topk": self.topk}

    def replay_options(self) -> dict[str, object]:
        return {**super().replay_options(), "index": str(self.index.directory), "topk": self.topk,
                "source": self.source}

    async def _attempt(self, ctx: CallContext) -> Outcome:
        (hits,) = await self._batcher.search([ctx.query], self.topk)
        items = []
        for hit in hits:
            title, text = split_contents(hit.contents)
            if text:
                items.append(SearchItem(title=title or "Untitled", content=truncate(text), source=self.source,
                                        ident=passage_ident(hit.id)))
        return Outcome.success(tuple(items), None)

    async def aclose(self) -> None:
        self._batcher.close()
        await super().aclose()

    def __repr__(self) -> str:
        return (f"LocalSearchBackend(index={str(self.index.directory)!r}, passages={len(self.index)}, "
                f"topk={self.topk}, cache={'on' if self.cache else 'off'})")
