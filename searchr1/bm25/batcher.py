"""One worker thread per index that answers queries in batches.

Callers (the ``local`` backend's concurrent searches, the server's concurrent requests) submit
lists of queries; the worker takes everything waiting (up to ``max_batch`` queries) and runs it
as one :meth:`BM25Index.search` call, so concurrent callers share a call instead of queueing
for the CPU one by one. Results come back through futures, asyncio ones via :meth:`search`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from searchr1.bm25.index import BM25Index, Hit

_STOP = object()


class QueryBatcher:
    def __init__(self, index: BM25Index, *, max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.index = index
        self.max_batch = max_batch
        self.batches = 0  # calls made (for tests and the bench)
        self.largest_batch = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, queries: Sequence[str], k: int) -> Future[list[list[Hit]]]:
        future: Future[list[list[Hit]]] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the query batcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bm25-batcher", daemon=True)
                self._thread.start()
            self._queue.put((list(queries), k, future))
        return future

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return await asyncio.wrap_future(self.submit(queries, k))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(_STOP)
        if thread is not None:
            thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            size = len(item[0])
            stop = False
            while size < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)
                size += len(more[0])
            self._answer(batch)
            if stop:
                return

    def _answer(self, batch: list[tuple[list[str], int, Future]]) -> None:
        live = [(q, k, f) for q, k, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        queries = [query for q, _, _ in live for query in q]
        k = max(k for _, k, _ in live)
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(queries))
        try:
            hits = self.index.search(queries, k) if queries else []
        except Exception as error:  # noqa: BLE001 - handed to every waiting caller
            for _, _, future in live:
                future.set_exception(error)
            return
        position = 0
        for q, wanted, future in live:
            future.set_result([h[:wanted] for h in hits[position:position + len(q)]])
            position += len(q)
