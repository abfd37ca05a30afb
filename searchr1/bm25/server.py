"""``python cli.py retriever serve``: the official Search-R1 ``POST /retrieve`` API over a local
BM25 index, on uvicorn (ASGI) with a starlette app.

Request ``{"queries": [...], "topk": 3, "return_scores": true}``; answer
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (one list per query, best
first; without ``return_scores`` each hit is the document itself, as the official server does).
Every request's queries go to one :class:`~searchr1.bm25.batcher.QueryBatcher`, so concurrent
requests are answered in shared batches while the event loop keeps accepting. Malformed requests
get a 4xx with ``{"error": "..."}`` naming the field; ``GET /healthz`` says what is served.

Beside it, ``POST /page`` (ours, not the official server's) reads a page as ``open_page`` does:
request ``{"page": "Eiffel Tower", "offset": 0, "window": 4}`` (``page`` a title or a passage id,
one pair of quotes dropped; ``offset`` default 0, at most :data:`MAX_OFFSET`; ``window`` default
4, at most :data:`MAX_WINDOW`); answer ``{"result": [{"id", "contents"}, ...], "total": n}``: the
page's passages from ``offset`` on, at most ``window``, in corpus order, and how many the page
has (0: no such page). The lookup runs in a worker thread (a cold page is a disk read).

Requests are untrusted (the server may listen on 0.0.0.0), so every resource is bounded:

* a body is read as it streams and refused with 413 once it passes :data:`MAX_BODY_BYTES`,
  with or without a Content-Length (the connection is then closed, the rest never read);
* at most :data:`MAX_CONCURRENT_BODIES` bodies are read at once (the others wait, their bytes
  left in the socket), and at most :data:`MAX_CONNECTIONS` connections are served (beyond, 503);
* a request's headers and body must arrive within :data:`REQUEST_TIMEOUT` seconds of its first
  byte (of the connection opening, for the first), or the connection is dropped; an idle
  keep-alive connection is closed after :data:`KEEP_ALIVE_TIMEOUT` seconds;
* a body nested too deeply for the JSON decoder, or holding a number too long to convert, is a
  400 like any other body that is not JSON.

Given an ``api_key``, every request but ``GET /healthz`` must send ``Authorization: Bearer <key>``
(:class:`~searchr1.runtime.api_key.ApiKeyGuard`: 401 in OpenAI's error shape otherwise, before the
body is read).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Unpack

from searchr1.bm25.batcher import QueryBatcher
from searchr1.bm25.index import BM25Index
from searchr1.bm25.page_naming import PAGE_WINDOW, page_name, page_passages
from searchr1.runtime.api_key import ApiKeyGuard
from searchr1.runtime.http_bounds import (KEEP_ALIVE_TIMEOUT, REQUEST_TIMEOUT, RequestError, RunningServer,
                                          ServerBounds, bounded_protocol, decode_body, listening_socket,
                                          read_capped_body, refused, run_in_thread, shown)
from searchr1.basics.secrets import Secret

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

MAX_BODY_BYTES = 1 << 20
MAX_QUERIES = 1024
MAX_QUERY_CHARS = 4096
MAX_TOPK = 100
MAX_WINDOW = 100  # passages one /page answer holds at most
MAX_OFFSET = 10_000_000  # past any page of any corpus
MAX_CONCURRENT_BODIES = 8  # bodies held in memory at once: at most 8 MiB
MAX_CONNECTIONS = 256  # uvicorn's limit_concurrency: a connection beyond gets 503


def refuse_unknown_fields(payload: Mapping[str, object], known: set[str]) -> None:
    """A 422 naming the body's fields outside ``known`` (at most 5, each cut to 40 characters)."""
    unknown = sorted(set(payload) - known)
    if unknown:
        raise RequestError(422, f"unknown field(s): {', '.join(name[:40] for name in unknown[:5])}")


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body, or :class:`RequestError`."""
    payload = decode_body(body, MAX_BODY_BYTES)
    if not isinstance(payload, dict):
        raise RequestError(422, "body must be a JSON object with 'queries'")
    refuse_unknown_fields(payload, {"queries", "topk", "return_scores"})
    queries = payload.get("queries")
    if not isinstance(queries, list) or not queries:
        raise RequestError(422, "'queries' must be a non-empty list of strings")
    if len(queries) > MAX_QUERIES:
        raise RequestError(422, f"'queries' holds {len(queries)} queries; at most {MAX_QUERIES} per request")
    texts: list[str] = []
    for position, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(422, f"queries[{position}] is {type(query).__name__}, expected a string")
        if len(query) > MAX_QUERY_CHARS:
            raise RequestError(422, f"queries[{position}] is longer than {MAX_QUERY_CHARS} characters")
        texts.append(query)
    topk = payload.get("topk", 3)
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise RequestError(422, f"'topk' must be an integer from 1 to {MAX_TOPK}, got {shown(topk)}")
    scores = payload.get("return_scores", False)
    if not isinstance(scores, bool):
        raise RequestError(422, f"'return_scores' must be true or false, got {shown(scores)}")
    return texts, topk, scores


def parse_page_request(body: bytes) -> tuple[str, int, int]:
    """``(page, offset, window)`` of a ``/page`` body, or :class:`RequestError` naming the field."""
    payload = decode_body(body, MAX_BODY_BYTES)
    if not isinstance(payload, dict):
        raise RequestError(422, "body must be a JSON object with 'page'")
    refuse_unknown_fields(payload, {"page", "offset", "window"})
    page = payload.get("page")
    if not isinstance(page, str) or not page.strip():
        raise RequestError(422, f"'page' must be a non-blank string (a title or a passage id), got {shown(page)}")
    if len(page) > MAX_QUERY_CHARS:
        raise RequestError(422, f"'page' is longer than {MAX_QUERY_CHARS} characters")
    offset = payload.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise RequestError(422, f"'offset' must be an integer from 0 to {MAX_OFFSET}, got {shown(offset)}")
    window = payload.get("window", PAGE_WINDOW)
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
        raise RequestError(422, f"'window' must be an integer from 1 to {MAX_WINDOW}, got {shown(window)}")
    return page, offset, window


def make_app(index: BM25Index, batcher: QueryBatcher | None = None, *,
             max_concurrent_bodies: int = MAX_CONCURRENT_BODIES, api_key: Secret | None = None) -> Starlette:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    batcher = batcher or QueryBatcher(index)
    reading: list[asyncio.Semaphore] = []  # made on the server's event loop, at the first request

    async def read_body(request: Request) -> bytes:
        if not reading:
            reading.append(asyncio.Semaphore(max_concurrent_bodies))
        return await read_capped_body(request, reading[0], MAX_BODY_BYTES)

    async def retrieve(request: Request) -> Response:
        try:
            queries, topk, with_scores = parse_request(await read_body(request))
        except RequestError as error:
            return refused(error.status, str(error))
        except ClientDisconnect:  # the client went away (or was dropped) mid-body: nobody to answer
            return Response(status_code=400)
        hits = await batcher.search(queries, topk)
        result = [
            [({"document": {"id": h.id, "contents": h.contents}, "score": h.score} if with_scores
              else {"id": h.id, "contents": h.contents}) for h in query_hits]
            for query_hits in hits
        ]
        return JSONResponse({"result": result})

    async def page(request: Request) -> Response:
        try:
            name, offset, window = parse_page_request(await read_body(request))
        except RequestError as error:
            return refused(error.status, str(error))
        except ClientDisconnect:
            return Response(status_code=400)
        hits = await asyncio.to_thread(page_passages, index, page_name(name))
        return JSONResponse({"result": [{"id": h.id, "contents": h.contents} for h in hits[offset:offset + window]],
                             "total": len(hits)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "passages": len(index),
                             "corpus_sha256": index.manifest["corpus"]["sha256"],
                             "scorer": index.manifest["scorer"]})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]),
                            Route("/page", page, methods=["POST"]),
                            Route("/healthz", health, methods=["GET"])],
                    lifespan=lifespan, middleware=[Middleware(ApiKeyGuard, key=api_key)] if api_key is not None else [])
    app.state.batcher = batcher
    return app


def make_server(index: BM25Index, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
                request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                max_concurrent_bodies: int = MAX_CONCURRENT_BODIES, api_key: Secret | None = None) -> uvicorn.Server:
    import uvicorn

    app = make_app(index, max_concurrent_bodies=max_concurrent_bodies, api_key=api_key)
    config = uvicorn.Config(app, host=host, port=port,
                            log_level=log_level, access_log=False, timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
                            lifespan="on", http=bounded_protocol(request_timeout), limit_concurrency=max_connections)
    return uvicorn.Server(config)



def start_in_thread(index: BM25Index, *, host: str = "127.0.0.1", port: int = 0,
                    **bounds: Unpack[ServerBounds]) -> RunningServer:
    """Serve ``index`` on ``host:port`` (0: any free port) from a daemon thread; ``bounds`` are
    :func:`make_server`'s (``request_timeout``, ``max_connections``, ``max_concurrent_bodies``,
    ``api_key``).
    The running server's ``url`` is its ``/retrieve``."""
    sock = listening_socket(host, port)
    server = make_server(index, host=host, port=sock.getsockname()[1], **bounds)
    return run_in_thread(server, sock, "retriever-serve", "/retrieve")
