"""The twin's HTTP face: pytrio 0.2.9's control API (JSON under ``/api/``) and actor API
(MessagePack events, a streamed JSON sampling body, a JSON heartbeat) on 127.0.0.1.

Stack: the standard library's ``ThreadingHTTPServer`` speaking HTTP/1.1 with keep-alive (one
thread per connection; a long-polled event holds its connection's thread, as it would hold a
socket on the real actor). No dependency, starts in milliseconds, and every byte pytrio reads
is written here explicitly. Each request is validated with pytrio's own protocol model for
that route (``extra="forbid"``), so a body the real service would reject is rejected here
too (422 ``validation_error``). Injected wire faults (:class:`~searchr1.twin.config.TwinFaults`)
are applied per operation before the backend sees the request.

Requests are untrusted (the default key is public): a route checks its key or actor token
before it reads a body; a body must declare its length (no chunked uploads), at most
``TwinSettings.max_body_bytes`` (413 otherwise, unread, and the connection is closed); the
bodies held at once, all requests together, stay within ``max_total_body_bytes`` (a body that
does not fit waits for room until its request's deadline, then gets 503); a request's
headers and body must arrive within ``request_timeout`` seconds of its first byte, and a
kept-alive connection waits at most ``idle_timeout`` seconds for its next request (one
watchdog thread drops a connection past either); at most ``max_connections`` connections
are served at once (a thread each), a connection beyond is closed at once. A body the JSON
decoder cannot take (nested too deeply, a number too long) is a 400; run ids and checkpoint
names are checked with pytrio's own rule and every path must stay inside the home
(:mod:`searchr1.twin.store`, 400 otherwise).

A sampler checkpoint's download URL points at ``/archives/<checkpoint>?sig=…`` on the same
server, which serves its PEFT adapter archive (:mod:`searchr1.twin.archive`) whole or from a
``Range`` offset, as an object store would.

Actor endpoints live under ``/actor/``: every run is served at the same actor address (so
pytrio reuses one HTTP client for all of them), each with its own JWT, which names the run a
request is for.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

import msgpack
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError
from pytrio.protocol.actor.events.event import EventEnvelope
from pytrio.protocol.actor.sampling_run.sample import SampleRequest
from pytrio.protocol.control.sampling_run.create import SamplingRunCreateRequest
from pytrio.protocol.control.service_session.close import ServiceSessionCloseRequest
from pytrio.protocol.control.service_session.create import ServiceSessionCreateRequest
from pytrio.protocol.control.training_run.create import TrainingRunCreateRequest
from pytrio.protocol.control.training_run.update import TrainingRunUpdateRequest

from searchr1.runtime.failures import STORAGE_FAILURE_CODE
from searchr1.basics.fileio import is_write_failure, write_failure_line
from searchr1.basics.json_types import JsonValue
from searchr1.twin.backend import ApiError, TwinBackend
from searchr1.twin.store import InvalidName
from searchr1.twin.config import SampleRequestInfo

JSON = "application/json"
MSGPACK = "application/msgpack"
ARCHIVE = "application/x-tar"
HEARTBEAT_MS = 60_000


LARGE_BODY_BYTES = 1 << 20  # after a body this large, freed memory is handed back to the system


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def _return_freed_memory() -> None:
    """Hand the memory of freed bodies back to the system. glibc keeps a freed large block in
    the arena of the thread that used it (each connection has a thread), so without this the
    RSS would grow with every connection that once held a large body, although nothing holds
    it any more. Elsewhere (no glibc) this does nothing."""
    if _TRIM is not None:
        _TRIM(0)


def _is_count(text: str) -> bool:
    """Whether ``text`` is a whole number written in ASCII digits (no sign, point or space)."""
    return text.isascii() and text.isdigit()


class Reply:
    """What a route answers (or, for sampling, a stream it writes itself)."""

    def __init__(self, status: int, body: object, content_type: str = JSON,
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body  # JSON or MessagePack data, or bytes sent as they are
        self.content_type = content_type
        self.headers = headers or {}


Model = TypeVar("Model", bound=BaseModel)


def _model(model: type[Model], data: object) -> Model:
    try:
        return model.model_validate(data)
    except RecursionError:
        raise ApiError(422, "validation_error", f"{model.__name__}: the body is nested too deeply") from None
    except PydanticValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(422, "validation_error", f"{model.__name__}.{where}: {first['msg']}") from None


def _dump(model: BaseModel) -> Mapping[str, object]:
    return model.model_dump(mode="json")


Route = tuple[str, re.Pattern[str], str, Callable[["_Handler", re.Match[str]], Reply | None]]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes; never wait for an ACK between
    server: _TwinHTTPServer
    rfile: io.BufferedReader  # socketserver's default rbufsize (-1) makes it buffered, so it can peek
    _call_number = 0
    _drop_answer = False
    _raw: bytes | None = None
    _length = 0
    _unread = False
    _reserved = 0  # bytes of the total body budget this request holds

    # --- plumbing -----------------------------------------------------------------------

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet: no request log
        return

    @property
    def backend(self) -> TwinBackend:
        return self.server.backend

    def setup(self) -> None:
        # a silent client lets go of its thread (socketserver reads this per handler, in setup())
        self.timeout = self.server.backend.settings.idle_timeout  # type: ignore[misc]  # typeshed: a ClassVar
        super().setup()

    def handle_one_request(self) -> None:
        """Wait (at most ``idle_timeout``) for a request's first byte; from then on its headers
        and body have ``request_timeout`` seconds (the watchdog drops the connection after)."""
        settings = self.server.backend.settings
        self.server.watch(self.connection, settings.idle_timeout)
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except OSError:  # a timeout, or the watchdog shut the connection
            self.close_connection = True
            return
        self.server.watch(self.connection, settings.request_timeout)
        try:
            super().handle_one_request()
        finally:
            self.server.watch(self.connection, None)
            self._raw = None  # the body's bytes go before its share of the budget does
            if self._reserved >= LARGE_BODY_BYTES:
                _return_freed_memory()
            self.server.release(self._reserved)
            self._reserved = 0

    def _declared_length(self) -> int:
        """The body's length as declared; refused before a byte of it is read."""
        if self.headers.get("Transfer-Encoding") is not None:
            raise ApiError(411, "length_required", "request bodies must carry a Content-Length "
                                                   "(no Transfer-Encoding)")
        values = [value.strip() for value in self.headers.get_all("Content-Length") or []]
        if not values:
            return 0
        if len(set(values)) != 1 or not _is_count(values[0]):
            raise ApiError(400, "invalid_content_length", f"Content-Length {values[0][:20]!r} is not a byte count")
        length, limit = int(values[0]), self.backend.settings.max_body_bytes
        if length > limit:
            raise ApiError(413, "payload_too_large", f"a body of {length} bytes; the twin accepts at most {limit}")
        return length

    def _body(self) -> bytes:
        """The request body (read once, after the route's key check, once the total body
        budget has room for it)."""
        if self._raw is None:
            if self._length and not self.server.reserve(self._length, self.server.deadline(self.connection)):
                raise ApiError(503, "twin.busy", f"the twin holds as many request bodies as it takes "
                                                 f"({self.backend.settings.max_total_body_bytes} bytes); retry")
            self._reserved = self._length
            data = self.rfile.read(self._length) if self._length else b""
            if len(data) != self._length:
                raise ConnectionError("the client sent less than its Content-Length")
            self._raw, self._unread = data, False
            self.server.watch(self.connection, None)  # the request is in: the route may take its time
        return self._raw

    def _json(self) -> JsonValue:
        raw = self._body()
        try:
            return json.loads(raw) if raw else {}
        except json.JSONDecodeError as error:
            raise ApiError(400, "invalid_json", f"the body is not JSON ({error.msg})") from None
        except RecursionError:
            raise ApiError(400, "invalid_json", "the body is not JSON the twin reads (nested too deeply)") from None
        except ValueError:  # not UTF-8, or a number past int's digit limit
            raise ApiError(400, "invalid_json", "the body is not JSON the twin reads (not UTF-8, or a number "
                                                "too long to read)") from None

    def _query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _page(self, default_limit: int) -> tuple[int, int]:
        """``limit`` and ``offset`` of a list call: whole numbers, not negative (400 otherwise)."""
        query = self._query()
        values = []
        for name, default in (("limit", default_limit), ("offset", 0)):
            text = query.get(name, str(default))
            if not _is_count(text):
                raise ApiError(400, "invalid_query", f"query parameter {name}={text[:20]!r} is not a whole number")
            values.append(int(text))
        return values[0], values[1]

    def _send(self, reply: Reply) -> None:
        if self._drop_answer:  # the request was handled; its answer is lost with the connection
            self.close_connection = True
            return
        if isinstance(reply.body, bytes):
            data = reply.body
        elif reply.content_type == MSGPACK:
            data = msgpack.packb(reply.body, use_bin_type=True)
        else:
            data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if self._unread:  # a body left unread cannot be skipped safely: this connection ends here
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _control_auth(self) -> None:
        self.backend.check_api_key(self.headers.get("X-API-Key"))

    def _actor_owner(self) -> str:
        return self.backend.actor_owner(self.headers.get("Authorization"))

    # --- dispatch -----------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        path = urlsplit(self.path).path
        self._raw, self._length, self._unread = None, 0, True
        try:
            self._length = self._declared_length()
        except ApiError as error:
            self._send(Reply(error.status, {"code": error.code, "message": error.message}))
            return
        self._unread = self._length > 0
        if not self._unread:
            self.server.watch(self.connection, None)  # headers in, no body: the request is in
        for route_method, pattern, operation, handler in ROUTES:  # noqa: B007 - the matched route's, used below
            match = pattern.fullmatch(path)
            if route_method == method and match:
                break
        else:  # answered without reading the body (nobody's key was checked for it)
            shown = path if len(path) <= 100 else path[:100] + "..."
            self._send(Reply(404, {"code": "not_found", "message": f"no route {method} {shown}"}))
            return
        faults = self.backend.settings.faults
        number = self._call_number = self.backend.count(operation)
        actor = path.startswith("/actor/")
        self._drop_answer = number in faults.dropped_connections.get(operation, ())
        status = faults.http_errors.get(operation, {}).get(number)
        if status is not None:
            self._body()
            message = f"injected HTTP {status} on {operation} call {number} (TwinFaults.http_errors)"
            self._send(Reply(status, {"code": "twin.injected_http_error", "message": message},
                             MSGPACK if actor and operation == "event_submit" else JSON))
            return
        try:
            reply = handler(self, match)
        except ApiError as error:
            self._send(Reply(error.status, {"code": error.code, "message": error.message}))
            return
        except InvalidName as error:
            self._send(Reply(400, {"code": "invalid_name", "message": str(error)}))
            return
        except (TimeoutError, ConnectionError):  # the client went silent or away mid-body
            self.close_connection = True
            return
        except OSError as error:
            if not is_write_failure(error):
                self._send(Reply(500, {"code": "twin.internal_error", "message": f"{type(error).__name__}: {error}"}))
                return
            # the twin's own disk is full (read-only, forbidden): 507, the path and the cause
            self._send(Reply(507, {"code": STORAGE_FAILURE_CODE, "message": f"the twin {write_failure_line(error)}"}))
            return
        except Exception as error:  # noqa: BLE001 - a twin bug answers 500 and never kills the server
            self._send(Reply(500, {"code": "twin.internal_error", "message": f"{type(error).__name__}: {error}"}))
            return
        if reply is not None:
            self._send(reply)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # --- control API --------------------------------------------------------------------

    def verify(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.verify()))

    def bootstrap(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.bootstrap(self._query().get("sdk_version", ""))))

    def model_list(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.models(*self._page(100))))

    def session_create(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        request = _model(ServiceSessionCreateRequest, self._json())
        return Reply(200, _dump(self.backend.create_session(request)))

    def session_get(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.get_session(m["sid"])))

    def session_renew(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        self._body()
        return Reply(200, _dump(self.backend.renew_session(m["sid"])))

    def session_close(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        request = _model(ServiceSessionCloseRequest, self._json())
        return Reply(200, self.backend.close_session(m["sid"], request))

    def training_create(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        request = _model(TrainingRunCreateRequest, self._json())
        return Reply(200, _dump(self.backend.create_training_run(m["sid"], request)))

    def training_update(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        request = _model(TrainingRunUpdateRequest, self._json())
        return Reply(200, _dump(self.backend.update_training_run(m["sid"], m["rid"], request)))

    def training_find(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        uri = self._query().get("checkpoint_uri", "")
        return Reply(200, _dump(self.backend.find_by_checkpoint_uri(uri)))

    def training_get(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.get_training_run(m["rid"])))

    def training_renew(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        self._body()
        return Reply(200, _dump(self.backend.renew_training_run(m["rid"])))

    def training_checkpoints(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.list_checkpoints(m["rid"], *self._page(200))))

    def checkpoint_list(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.list_checkpoints(None, *self._page(100))))

    def checkpoint_download_url(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.checkpoint_download_url(m["cid"])))

    def archive(self, m: re.Match[str]) -> Reply:
        """A checkpoint archive, whole or from a ``Range: bytes=N-`` offset (206), as an object
        store serves it; a range starting at the end is 416 with the total size."""
        data = self.backend.checkpoint_archive(m["cid"], self._query().get("sig", ""))
        wanted = self.headers.get("Range")
        if wanted is None:
            return Reply(200, data, ARCHIVE, {"Accept-Ranges": "bytes"})
        match = re.fullmatch(r"bytes=(\d+)-", wanted.strip())
        if match is None:
            raise ApiError(400, "invalid_range", f"Range {wanted[:40]!r} is not bytes=N-")
        start = int(match[1])
        if start >= len(data):
            return Reply(416, b"", ARCHIVE, {"Content-Range": f"bytes */{len(data)}"})
        return Reply(206, data[start:], ARCHIVE,
                     {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}", "Accept-Ranges": "bytes"})

    def sampling_create(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        request = _model(SamplingRunCreateRequest, self._json())
        return Reply(200, _dump(self.backend.create_sampling_run(m["sid"], request)))

    def sampling_get(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        return Reply(200, _dump(self.backend.get_sampling_run(m["id"])))

    def sampling_renew(self, m: re.Match[str]) -> Reply:
        self._control_auth()
        self._body()
        return Reply(200, _dump(self.backend.renew_sampling_run(m["id"])))

    def telemetry(self, _: re.Match[str]) -> Reply:
        self._control_auth()
        self._body()
        with self.backend._lock:
            self.backend.telemetry_batches += 1
        return Reply(200, {"accepted": True})

    # --- actor API ----------------------------------------------------------------------

    def event_submit(self, m: re.Match[str]) -> Reply:
        owner = self._actor_owner()
        raw = self._body()
        try:
            data = msgpack.unpackb(raw, raw=False)
        except Exception:  # noqa: BLE001 - any undecodable body is a bad request
            raise ApiError(400, "invalid_msgpack", "the event body is not MessagePack") from None
        envelope = _model(EventEnvelope, data)
        return Reply(200, self.backend.submit_event(owner, envelope), MSGPACK)

    def event_get(self, m: re.Match[str]) -> Reply:
        owner = self._actor_owner()
        prefer = self.headers.get("Prefer", "")
        wait = 0.0
        if prefer.startswith("wait="):
            try:
                wait = max(0.0, float(prefer.removeprefix("wait=")) - 1.0)  # answer before the client gives up
            except ValueError:
                raise ApiError(400, "invalid_prefer", f"Prefer header {prefer!r} is not wait=<seconds>") from None
        return Reply(200, self.backend.get_event(owner, m["event"], wait), MSGPACK)

    def heartbeat(self, m: re.Match[str]) -> Reply:
        self._actor_owner()
        self._body()
        return Reply(200, {"status": "ok", "heartbeat_ms": HEARTBEAT_MS})

    def sample(self, m: re.Match[str]) -> None:
        """Headers at once, then the JSON body as one chunk when the modelled time is up: the
        body is JSON-shaped and streaming is only pytrio's liveness signal."""
        owner = self._actor_owner()
        if m["id"] != owner:
            raise ApiError(404, "sampling_run_not_found", f"sampling run {m['id']} is not served at {owner}")
        request = _model(SampleRequest, self._json())
        faults = self.backend.settings.faults
        action: int | str | None = self._call_number in faults.sample_timeouts and "timeout"
        if not action and faults.sample_hook is not None:
            prompt = tuple(t for chunk in request.prompt.chunks for t in getattr(chunk, "tokens", ()))
            action = faults.sample_hook(SampleRequestInfo(self._call_number, prompt, request.num_samples,
                                                          int(request.sampling_params["max_tokens"])))
        if action == "timeout":
            self._start_stream()
            self.backend.wait(faults.sample_timeout_hold)  # no byte until the client gives up
            self.close_connection = True
            return None
        if isinstance(action, int) and not isinstance(action, bool):
            message = f"injected HTTP {action} on sample call {self._call_number} (TwinFaults.sample_hook)"
            raise ApiError(action, "twin.injected_http_error", message)
        self._drop_answer = self._drop_answer or action == "drop"
        body, ready_at = self.backend.sample(owner, request)
        if self._drop_answer:
            self.close_connection = True
            return None
        self._start_stream()
        if not self.backend.wait(ready_at - time.monotonic()):
            self.close_connection = True
            return None
        self._chunk(json.dumps(body).encode())
        self._chunk(b"")
        return None

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", JSON)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


_OPENAPI = "/api/openapi/v1"
ROUTES: list[Route] = [
    (method, re.compile(pattern), operation, handler)
    for method, pattern, operation, handler in [
        ("GET", f"{_OPENAPI}/api-key/verify", "api_key_verify", _Handler.verify),
        ("GET", "/api/sdk/bootstrap", "sdk_bootstrap", _Handler.bootstrap),
        ("GET", "/api/models", "model_list", _Handler.model_list),
        ("POST", f"{_OPENAPI}/service-sessions", "service_session_create", _Handler.session_create),
        ("GET", f"{_OPENAPI}/service-sessions/(?P<sid>[^/]+)", "service_session_get", _Handler.session_get),
        ("POST", f"{_OPENAPI}/service-sessions/(?P<sid>[^/]+)/renew", "service_session_renew", _Handler.session_renew),
        ("POST", f"{_OPENAPI}/service-sessions/(?P<sid>[^/]+)/close", "service_session_close", _Handler.session_close),
        ("POST", f"{_OPENAPI}/service-sessions/(?P<sid>[^/]+)/training-runs", "training_run_create",
         _Handler.training_create),
        ("PATCH", f"{_OPENAPI}/service-sessions/(?P<sid>[^/]+)/training-runs/(?P<rid>[^/]+)", "training_run_update",
         _Handler.training_update),
        ("POST", f"{_OPENAPI}/service-sessions/(?P<sid>[^/]+)/sampling-runs", "sampling_run_create",
         _Handler.sampling_create),
        ("GET", f"{_OPENAPI}/training-runs/by-checkpoint-uri", "training_run_find_by_checkpoint_uri",
         _Handler.training_find),
        ("GET", f"{_OPENAPI}/training-runs/(?P<rid>[^/]+)/checkpoints", "training_run_checkpoints",
         _Handler.training_checkpoints),
        ("GET", f"{_OPENAPI}/training-runs/(?P<rid>[^/]+)", "training_run_get", _Handler.training_get),
        ("GET", f"{_OPENAPI}/checkpoints", "checkpoint_list", _Handler.checkpoint_list),
        ("GET", f"{_OPENAPI}/checkpoints/(?P<cid>[^/]+/[^/]+/[^/]+)/download-url", "checkpoint_download_url",
         _Handler.checkpoint_download_url),
        ("GET", "/archives/(?P<cid>[^/]+/[^/]+/[^/]+)", "checkpoint_archive", _Handler.archive),
        ("POST", f"{_OPENAPI}/training-runs/(?P<rid>[^/]+)/renew", "training_run_renew", _Handler.training_renew),
        ("GET", f"{_OPENAPI}/sampling-runs/(?P<id>[^/]+)", "sampling_run_get", _Handler.sampling_get),
        ("POST", f"{_OPENAPI}/sampling-runs/(?P<id>[^/]+)/renew", "sampling_run_renew", _Handler.sampling_renew),
        ("POST", "/api/telemetry/event", "telemetry", _Handler.telemetry),
        ("POST", "/actor/v1/events", "event_submit", _Handler.event_submit),
        ("GET", "/actor/v1/events/(?P<event>[^/]+)", "event_get", _Handler.event_get),
        ("POST", "/actor/v1/client/heartbeat", "heartbeat", _Handler.heartbeat),
        ("POST", "/actor/v1/sampling-runs/(?P<id>[^/]+)/sample", "sample", _Handler.sample),
    ]
]


Request = socket.socket | tuple[bytes, socket.socket]  # socketserver's: a stream's socket, or a datagram's


def _connection(request: Request) -> socket.socket:
    """The socket of a request (a TCP server's request is its connection)."""
    return request if isinstance(request, socket.socket) else request[1]


class _TwinHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, port: int, backend: TwinBackend) -> None:
        self.backend = backend
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._deadlines: dict[socket.socket, float] = {}  # connection -> when the watchdog drops it
        self._budget = threading.Condition()
        self._budget_left = backend.settings.max_total_body_bytes
        self._closing = threading.Event()
        super().__init__(("127.0.0.1", port), _Handler)
        self._watchdog = threading.Thread(target=self._drop_late_connections, name=f"twin-watchdog-{port}",
                                          daemon=True)
        self._watchdog.start()

    # --- deadlines and the body budget --------------------------------------------------

    def watch(self, connection: socket.socket, seconds: float | None) -> None:
        """Drop ``connection`` unless it is unwatched again within ``seconds`` (None: unwatch)."""
        with self._connections_lock:
            if seconds is None:
                self._deadlines.pop(connection, None)
            else:
                self._deadlines[connection] = time.monotonic() + seconds

    def deadline(self, connection: socket.socket) -> float:
        with self._connections_lock:
            return self._deadlines.get(connection, time.monotonic() + self.backend.settings.request_timeout)

    def _drop_late_connections(self) -> None:
        tick = min(0.25, max(0.02, self.backend.settings.request_timeout / 10))
        while not self._closing.wait(tick):
            now = time.monotonic()
            with self._connections_lock:
                late = [connection for connection, when in self._deadlines.items() if when <= now]
                for connection in late:
                    del self._deadlines[connection]
            for connection in late:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def reserve(self, size: int, until: float) -> bool:
        """Take ``size`` bytes of the total body budget, waiting for room until ``until``."""
        with self._budget:
            while self._budget_left < size:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._budget.wait(left)
            self._budget_left -= size
            return True

    def release(self, size: int) -> None:
        if size:
            with self._budget:
                self._budget_left += size
                self._budget.notify_all()

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-request is normal; nothing is printed (socketserver
        would print a traceback to stderr, which is a user's terminal or a test's output)."""
        logging.getLogger(__name__).debug("twin connection from %s ended with an error", client_address,
                                          exc_info=True)

    def process_request(self, request: Request, client_address: object) -> None:
        with self._connections_lock:
            full = len(self._connections) >= self.backend.settings.max_connections
            if not full:
                self._connections.add(_connection(request))
        if full:  # no thread for it: closed at once (a client retries; a flood costs nothing)
            super().shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Request) -> None:
        with self._connections_lock:
            self._connections.discard(_connection(request))
            self._deadlines.pop(_connection(request), None)
        super().shutdown_request(request)

    def server_close(self) -> None:
        self._closing.set()
        super().server_close()

    def drop_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TwinHTTPServer:
    """A started server: ``url`` is ``http://127.0.0.1:<port>``; :meth:`stop` is idempotent."""

    def __init__(self, backend: TwinBackend, port: int = 0) -> None:
        self._server = _TwinHTTPServer(port, backend)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"twin-http-{self.port}", daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if threading.current_thread() is self._thread:  # shutdown() waits for this very loop
            threading.Thread(target=self._server.shutdown, daemon=True).start()
        else:
            self._server.shutdown()
        self._server.drop_connections()
        self._server.server_close()
