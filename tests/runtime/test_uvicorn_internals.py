"""What ``runtime/http_bounds.py``'s ``BoundedH11Protocol`` relies on in uvicorn's private h11
protocol, checked on the installed uvicorn: the class and where it lives, the three methods it
overrides and their parameters, the attributes it reads (``loop``, ``conn``, ``transport``), that a
``Config(http=...)`` takes the class as it is, and the deadline working through them. A uvicorn that
changes any of these fails here with a line saying which, before a server of ours misbehaves;
pyproject.toml's bound on uvicorn moves only after this passes on the newer release."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from importlib.metadata import version

import h11
import pytest

from searchr1.runtime.http_bounds import bounded_protocol

UVICORN = f"uvicorn {version('uvicorn')}"
OVERRIDDEN = {"connection_made": ["self", "transport"], "data_received": ["self", "data"],
              "connection_lost": ["self", "exc"]}


def h11_protocol() -> type:
    try:
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError as error:
        pytest.fail(f"{UVICORN}: uvicorn.protocols.http.h11_impl.H11Protocol is gone ({error}); "
                    "BoundedH11Protocol subclasses it")
    return H11Protocol


def test_the_methods_the_bounded_protocol_overrides_are_uvicorns_with_the_same_parameters():
    base = h11_protocol()
    assert issubclass(base, asyncio.Protocol), f"{UVICORN}: H11Protocol is no longer an asyncio.Protocol"
    for name, parameters in OVERRIDDEN.items():
        method = base.__dict__.get(name)
        assert callable(method), f"{UVICORN}: H11Protocol defines no {name} of its own; BoundedH11Protocol extends it"
        found = list(inspect.signature(method).parameters)
        assert found == parameters, f"{UVICORN}: H11Protocol.{name}{tuple(found)}, BoundedH11Protocol expects {parameters}"


class FakeTransport(asyncio.Transport):
    """Enough of a socket transport for uvicorn's protocol: no peer, nothing written anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.written = bytearray()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: dict[str, object], receive: Callable[[], Awaitable[dict[str, object]]],
               send: Callable[[dict[str, object]], Awaitable[None]]) -> None:
    """A bare ASGI app: 200, "ok"."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_attributes_the_deadline_reads_are_there_and_it_drops_only_an_unfinished_request():
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    deadline = 0.05
    config = Config(app=_app, http=bounded_protocol(deadline), lifespan="off", log_level="error")
    config.load()
    assert issubclass(config.http_protocol_class, h11_protocol()), \
        f"{UVICORN}: Config(http=cls) no longer serves with the class it is given"

    async def connection(data: bytes) -> tuple[FakeTransport, bool]:
        loop = asyncio.get_running_loop()
        # as uvicorn's Server.startup makes each connection's protocol
        protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        transport = FakeTransport()
        protocol.connection_made(transport)
        for name, kind in (("loop", asyncio.AbstractEventLoop), ("conn", h11.Connection)):
            assert isinstance(getattr(protocol, name, None), kind), \
                f"{UVICORN}: H11Protocol.{name} is not a {kind.__name__}; BoundedH11Protocol reads it"
        assert protocol.transport is transport, f"{UVICORN}: H11Protocol.transport is not the connection's transport"
        protocol.data_received(data)
        await asyncio.sleep(deadline * 6)
        dropped = transport.closed  # before connection_lost, which closes the transport itself
        protocol.connection_lost(None)
        return transport, dropped

    async def both() -> tuple[tuple[FakeTransport, bool], tuple[FakeTransport, bool]]:
        unfinished = await connection(b"GET / HTTP/1.1\r\nHost: x\r\n")  # headers never end
        whole = await connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return unfinished, whole

    (unfinished, unfinished_dropped), (whole, whole_dropped) = asyncio.run(both())
    assert unfinished_dropped and not unfinished.written  # dropped at the deadline, never answered
    assert whole.written.startswith(b"HTTP/1.1 200") and not whole_dropped  # answered and kept alive
