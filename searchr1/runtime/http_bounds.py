"""What every server of ours shares to face untrusted clients: bounded bodies, a deadline per
request, one-line 4xx answers naming the field at fault, and a socket bound before it serves.

``retriever serve`` and ``serve`` both run uvicorn (ASGI) with a starlette app made of these:

* :func:`read_capped_body` reads a body as it streams, at most a few at once (a semaphore), and
  refuses it with 413 once it passes its cap, with or without a Content-Length;
* :func:`decode_body` turns a body into JSON or a 400 saying why not (not UTF-8, nested too
  deeply, a number too long to convert);
* :func:`bounded_protocol` drops a connection whose request is not whole within a deadline
  (uvicorn itself waits for headers forever);
* :func:`refused` answers ``{"error": "..."}`` and closes the connection, so an unread body is
  never skipped through;
* :func:`listening_socket` binds first, so a taken port is one line before anything starts.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from searchr1.basics.json_types import JsonValue
from searchr1.basics.secrets import Secret

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from uvicorn import Server

REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
KEEP_ALIVE_TIMEOUT = 5  # seconds an idle keep-alive connection is kept


class PortTakenError(OSError):
    """The address to listen on is in use or cannot be bound; the message says which."""


class RequestError(ValueError):
    """A request refused with ``status`` (a 4xx); the message names the field at fault."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def shown(value: object) -> str:
    """A value a client sent, as a message quotes it: bounded (a 4,000-digit number, a deep list)."""
    text = repr(value) if not isinstance(value, (list, dict)) else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "..."


def decode_body(body: bytes, max_bytes: int) -> JsonValue:
    """The JSON value of ``body``, or :class:`RequestError` (413 too large, 400 not JSON we read)."""
    if len(body) > max_bytes:
        raise RequestError(413, f"request body larger than {max_bytes} bytes")
    try:
        return json.loads(body)
    except RecursionError:
        raise RequestError(400, "body is not JSON this server reads (nested too deeply)") from None
    except json.JSONDecodeError as error:
        raise RequestError(400, f"body is not JSON ({error})") from None
    except ValueError as error:  # UnicodeDecodeError, or a number past int's digit limit
        why = "not UTF-8" if isinstance(error, UnicodeDecodeError) else "a number too long to read"
        raise RequestError(400, f"body is not JSON this server reads ({why})") from None


async def read_capped_body(request: Request, slots: asyncio.Semaphore, max_bytes: int) -> bytes:
    """A starlette request's body, read as it streams while holding one of ``slots``;
    :class:`RequestError` (413) once it passes ``max_bytes``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"request body larger than {max_bytes} bytes")
    async with slots:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise RequestError(413, f"request body larger than {max_bytes} bytes")
        return bytes(body)


def refused(status: int, message: str) -> JSONResponse:
    """The answer to a refused request: ``{"error": message}``, and the connection closed."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers={"connection": "close"})


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

        # asyncio.Protocol takes a BaseTransport; H11Protocol (whose signature this keeps) a Transport
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
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


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A socket bound to ``host:port`` (0: any free port) and listening, or :class:`PortTakenError`
    saying in one line why not (the port is taken, the address is not this machine's). Listening
    at once means a client that connects as soon as the address is printed is never refused.
    ``reuse_port`` sets ``SO_REUSEPORT``, so that more sockets of this process can listen on the
    same port (:func:`listening_sockets`)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise PortTakenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortTakenError(f"port {port} on {host} is taken (another server listens there); "
                                 "stop it or pick another --port") from None
        raise PortTakenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.listen(2048)  # from here a client's connection waits in the backlog until the server accepts it
    return sock


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets listening on one ``host:port`` (0: any free port), one per worker process.
    The kernel spreads new connections over them (``SO_REUSEPORT``, by a hash of the client's
    address and port), where one socket shared by every worker hands most connections to whichever
    worker wakes first. The port is first bound without ``SO_REUSEPORT``, so a port another server
    holds is refused (:class:`PortTakenError`) rather than shared with it."""
    probe = listening_socket(host, port)
    port = probe.getsockname()[1]
    probe.close()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(listening_socket(host, port, reuse_port=True))
    except PortTakenError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class ServerBounds(TypedDict, total=False):
    """A server's ``make_server`` settings past the address, as its ``start_in_thread`` hands them
    on (the chat server and the retriever server take the same ones)."""

    log_level: str
    request_timeout: float
    max_connections: int
    max_concurrent_bodies: int
    api_key: Secret | None


@dataclass
class RunningServer:
    """A server started in a thread of this process (tests, the bench): ``url`` is its
    endpoint; ``stop()`` shuts it down."""

    server: Server
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_in_thread(server: Server, sock: socket.socket, name: str, path: str) -> RunningServer:
    """Run a uvicorn ``server`` on the bound ``sock`` from a daemon thread, once it has started."""
    # uvicorn installs its signal handlers from the main thread only: this server leaves them alone
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the {name} server did not start")
        time.sleep(0.01)
    host, port = sock.getsockname()[:2]
    return RunningServer(server, thread, f"http://{host}:{port}{path}")
