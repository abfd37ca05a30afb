"""``python cli.py retriever serve``: the official Search-R1 ``POST /retrieve`` API over a local
BM25 index, on uvicorn (ASGI) with a starlette app.

Request ``{"queries": [...], "topk": 3, "return_scores": true}``; answer
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (one list per query, best
first; without ``return_scores`` each hit is the document itself, as the official server does).
Every request's queries go to one :class:`~searchr1.bm25.batcher.QueryBatcher`, so concurrent
requests are answered in shared batches while the event loop keeps accepting. Malformed requests
get a 4xx with ``{"error": "..."}`` naming the field; ``GET /healthz`` says what is served.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass
from collections.abc import AsyncIterator
from typing import Any

from searchr1.bm25.batcher import QueryBatcher
from searchr1.bm25.index import BM25Index

MAX_BODY_BYTES = 1 << 20
MAX_QUERIES = 1024
MAX_QUERY_CHARS = 4096
MAX_TOPK = 100


class RequestError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body, or :class:`RequestError`."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(400, f"body is not JSON ({error})") from None
    if not isinstance(payload, dict):
        raise RequestError(422, "body must be a JSON object with 'queries'")
    unknown = sorted(set(payload) - {"queries", "topk", "return_scores"})
    if unknown:
        raise RequestError(422, f"unknown field(s): {', '.join(unknown)}")
    queries = payload.get("queries")
    if not isinstance(queries, list) or not queries:
        raise RequestError(422, "'queries' must be a non-empty list of strings")
    if len(queries) > MAX_QUERIES:
        raise RequestError(422, f"'queries' holds {len(queries)} queries; at most {MAX_QUERIES} per request")
    for position, query in enumerate(queries):
        if not isinstance(query, str):
            raise RequestError(422, f"queries[{position}] is {type(query).__name__}, expected a string")
        if len(query) > MAX_QUERY_CHARS:
            raise RequestError(422, f"queries[{position}] is longer than {MAX_QUERY_CHARS} characters")
    topk = payload.get("topk", 3)
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise RequestError(422, f"'topk' must be an integer from 1 to {MAX_TOPK}, got {topk!r}")
    scores = payload.get("return_scores", False)
    if not isinstance(scores, bool):
        raise RequestError(422, f"'return_scores' must be true or false, got {scores!r}")
    return queries, topk, scores


def make_app(index: BM25Index, batcher: QueryBatcher | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    batcher = batcher or QueryBatcher(index)

    async def retrieve(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return JSONResponse({"error": f"request body larger than {MAX_BODY_BYTES} bytes"}, status_code=413)
        try:
            queries, topk, with_scores = parse_request(await request.body())
        except RequestError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        hits = await batcher.search(queries, topk)
        result = [
            [({"document": {"id": h.id, "contents": h.contents}, "score": h.score} if with_scores
              else {"id": h.id, "contents": h.contents}) for h in query_hits]
            for query_hits in hits
        ]
        return JSONResponse({"result": result})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "passages": len(index),
                             "corpus_sha256": index.manifest["corpus"]["sha256"],
                             "scorer": index.manifest["scorer"]})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]),
                            Route("/healthz", health, methods=["GET"])],
                    lifespan=lifespan)
    app.state.batcher = batcher
    return app


def make_server(index: BM25Index, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> Any:
    import uvicorn

    config = uvicorn.Config(make_app(index), host=host, port=port, log_level=log_level,
                            access_log=False, timeout_keep_alive=30, lifespan="on")
    return uvicorn.Server(config)


@dataclass
class RunningServer:
    """A server started in a thread of this process (tests, the bench): ``url`` is its
    ``/retrieve``; ``stop()`` shuts it down."""

    server: Any
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(index: BM25Index, *, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Serve ``index`` on ``host:port`` (0: any free port) from a daemon thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = make_server(index, host=host, port=sock.getsockname()[1])
    server.config.install_signal_handlers = False  # uvicorn>=0.29 honours this on Server.run
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="retriever-serve", daemon=True)
    thread.start()
    import time

    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the retrieval server did not start")
        time.sleep(0.01)
    return RunningServer(server, thread, f"http://{host}:{sock.getsockname()[1]}/retrieve")
