"""``python cli.py retriever serve``: the official Search-R1 ``POST /retrieve`` API over a local
BM25 index, on uvicorn (ASGI) with a starlette app.

Request ``{"queries": [...], "topk": 3, "return_scores": true}``; answer
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (one list per query, best
first; without ``return_scores`` each hit is the document itself, as the official server does).
Every request's queries go to one :class:`~searchr1.bm25.batcher.QueryBatcher`, so concurrent
requests are answered in shared batches while the event loop keeps accepting. Malformed requests
get a 4xx with ``{"error": "..."}`` naming the field; ``GET /healthz`` says what is served.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
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
MAX_CONCURRENT_BODIES = 8  # bodies held in memory at once: at most 8 MiB
MAX_CONNECTIONS = 256  # uvicorn's limit_concurrency: a connection beyond gets 503
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
KEEP_ALIVE_TIMEOUT = 5  # seconds an idle keep-alive connection is kept


class PortTakenError(OSError):
    """The address to listen on is in use or cannot be bound; the message says which."""


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
    except RecursionError:
        raise RequestError(400, "body is not JSON this server reads (nested too deeply)") from None
    except json.JSONDecodeError as error:
        raise RequestError(400, f"body is not JSON ({error})") from None
    except ValueError as error:  # UnicodeDecodeError, or a number past int's digit limit
        why = "not UTF-8" if isinstance(error, UnicodeDecodeError) else "a number too long to read"
        raise RequestError(400, f"body is not JSON this server reads ({why})") from None
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
        raise RequestError(422, f"'topk' must be an integer from 1 to {MAX_TOPK}, got {_shown(topk)}")
    scores = payload.get("return_scores", False)
    if not isinstance(scores, bool):
        raise RequestError(422, f"'return_scores' must be true or false, got {_shown(scores)}")
    return queries, topk, scores


def _shown(value: Any) -> str:
    """A value a client sent, as a message quotes it: bounded (a 4,000-digit number, a deep list)."""
    text = repr(value) if not isinstance(value, (list, dict)) else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "..."


def make_app(index: BM25Index, batcher: QueryBatcher | None = None, *,
             max_concurrent_bodies: int = MAX_CONCURRENT_BODIES) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    batcher = batcher or QueryBatcher(index)
    reading: list[asyncio.Semaphore] = []  # made on the server's event loop, at the first request

    def refused(status: int, message: str) -> JSONResponse:
        # a body left unread is never skipped through: the connection ends with the answer
        return JSONResponse({"error": message}, status_code=status, headers={"connection": "close"})

    async def read_body(request: Request) -> bytes:
        """The body, read as it streams; :class:`RequestError` (413) once it passes the cap."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise RequestError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        if not reading:
            reading.append(asyncio.Semaphore(max_concurrent_bodies))
        async with reading[0]:
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise RequestError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
            return bytes(body)

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


def bounded_protocol(request_timeout: float = REQUEST_TIMEOUT) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline per request: from the connection's start (or a
    request's first byte after an answer) to the request's last byte. A client still sending
    headers or body at the deadline is dropped (uvicorn itself waits for headers forever)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    received = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)

    class BoundedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if self.conn.their_state not in received and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self.conn.their_state not in received:
                self._arm()
            super().data_received(data)
            if self.conn.their_state in received:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedH11Protocol


def make_server(index: BM25Index, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
                request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                max_concurrent_bodies: int = MAX_CONCURRENT_BODIES) -> Any:
    import uvicorn

    config = uvicorn.Config(make_app(index, max_concurrent_bodies=max_concurrent_bodies), host=host, port=port,
                            log_level=log_level, access_log=False, timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
                            lifespan="on", http=bounded_protocol(request_timeout), limit_concurrency=max_connections)
    return uvicorn.Server(config)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: any free port), or :class:`PortTakenError` saying in
    one line why not (the port is taken, the address is not this machine's)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise PortTakenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortTakenError(f"port {port} on {host} is taken (another server listens there); "
                                 "stop it or pick another --port") from None
        raise PortTakenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


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


def start_in_thread(index: BM25Index, *, host: str = "127.0.0.1", port: int = 0, **bounds: Any) -> RunningServer:
    """Serve ``index`` on ``host:port`` (0: any free port) from a daemon thread; ``bounds`` are
    :func:`make_server`'s (``request_timeout``, ``max_connections``, ``max_concurrent_bodies``)."""
    sock = listening_socket(host, port)
    server = make_server(index, host=host, port=sock.getsockname()[1], **bounds)
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
