"""The HTTP server of ``serve``: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /healthz``.

It faces untrusted clients with the bounds every server of ours has
(:mod:`searchr1.runtime.http_bounds`): a body is read as it streams and refused past
:data:`~searchr1.serve.chat_api.MAX_BODY_BYTES`, a request must arrive within a deadline, at most
a few bodies are read and :data:`~searchr1.serve.model.MAX_CONCURRENT_COMPLETIONS` completions
sampled at once, and connections beyond ``max_connections`` get 503. A request this server
cannot honour is a 4xx in OpenAI's error shape (``{"error": {"message", "type", "param"}}``)
naming the field; a failure of the sampler or the search service is a 502 saying which, never
a 500. Given an ``api_key``, every request but ``GET /healthz`` must send it
(:class:`~searchr1.runtime.api_key.ApiKeyGuard`: 401 otherwise). Each request is one line on the
``searchr1.serve.access`` logger (:mod:`~searchr1.serve.access_log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Unpack

from searchr1.runtime.api_key import ApiKeyGuard
from searchr1.runtime.http_bounds import (KEEP_ALIVE_TIMEOUT, REQUEST_TIMEOUT, RequestError, RunningServer,
                                          ServerBounds, bounded_protocol, decode_body, listening_socket,
                                          read_capped_body, run_in_thread)
from searchr1.basics.secrets import Secret
from searchr1.serve.access_log import AccessLog
from searchr1.serve.chat_api import MAX_BODY_BYTES, ChatRequest, FieldError, Reply, chunks, completion, \
    parse_chat_request, sse
from searchr1.serve.model import ChatModel

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from uvicorn import Server

MAX_CONCURRENT_BODIES = 8
MAX_CONNECTIONS = 64
log = logging.getLogger("searchr1.serve")


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "service_unavailable"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status, headers={"connection": "close"} if status < 500 else None)


def make_app(model: ChatModel, *, max_concurrent_bodies: int = MAX_CONCURRENT_BODIES,
             api_key: Secret | None = None) -> Starlette:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    reading: list[asyncio.Semaphore] = []  # made on the server's event loop, at the first request

    async def read_request(request: Request) -> ChatRequest:
        if not reading:
            reading.append(asyncio.Semaphore(max_concurrent_bodies))
        body = await read_capped_body(request, reading[0], MAX_BODY_BYTES)
        parsed = parse_chat_request(decode_body(body, MAX_BODY_BYTES))
        if model.check_question is not None:
            try:
                model.check_question(parsed.question)
            except Exception as error:  # the policy cannot answer it: the client's to change
                position = next(i for i, m in enumerate(parsed.messages) if m["role"] == "user")
                raise FieldError(f"messages[{position}].content", str(getattr(error, "message", error))) from None
        return parsed

    async def answer(parsed: ChatRequest) -> Reply:
        from searchr1.runtime.failures import describe_failure

        try:
            return await (model.agent(parsed) if parsed.agent else model.turn(parsed))
        except Exception as error:  # the sampler or a tool's service failed; the request was fine
            log.warning("completion failed: %s", describe_failure(error))
            raise RequestError(502, f"the model could not answer: {describe_failure(error)}") from None

    async def chat(request: Request) -> Response:
        try:
            parsed = await read_request(request)
            reply = await answer(parsed)
        except FieldError as error:
            return error_response(error.status, str(error), error.field)
        except RequestError as error:
            return error_response(error.status, str(error))
        except ClientDisconnect:
            return Response(status_code=400)
        if parsed.stream:
            events = sse(chunks(reply, model.name, include_usage=parsed.include_usage))
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(completion(reply, model.name))

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": model.name, "object": "model", "created": 0,
                                                          "owned_by": "searchr1", "policy": model.policy}]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": model.name, "policy": model.policy,
                             "tools": list(model.rollout.tools)})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        closing = getattr(model.search, "aclose", None)
        if closing is not None:
            await closing()

    guard = [Middleware(ApiKeyGuard, key=api_key)] if api_key is not None else []
    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"]),
                             Route("/healthz", health, methods=["GET"])], lifespan=lifespan,
                     middleware=[Middleware(AccessLog, secrets=(api_key,) if api_key else ()), *guard])


def make_server(model: ChatModel, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
                request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                max_concurrent_bodies: int = MAX_CONCURRENT_BODIES, api_key: Secret | None = None) -> Server:
    import uvicorn

    app = make_app(model, max_concurrent_bodies=max_concurrent_bodies, api_key=api_key)
    config = uvicorn.Config(app, host=host, port=port,
                            log_level=log_level, access_log=False,  # AccessLog writes ours
                            timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
                            lifespan="on", http=bounded_protocol(request_timeout), limit_concurrency=max_connections,
                            loop="asyncio")
    return uvicorn.Server(config)



def start_in_thread(model: ChatModel, *, host: str = "127.0.0.1", port: int = 0,
                    **bounds: Unpack[ServerBounds]) -> RunningServer:
    """Serve ``model`` from a daemon thread (tests); the running server's ``url`` is its ``/v1``."""
    sock = listening_socket(host, port)
    server = make_server(model, host=host, port=sock.getsockname()[1], **bounds)
    return run_in_thread(server, sock, "chat-serve", "/v1")
