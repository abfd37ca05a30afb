"""The twin against clients that would exhaust it: bodies the JSON decoder cannot take, many
bodies at once, more connections than it has threads for, clients that send one header line at
a time or trickle a body. Every body gets a 4xx (never a 500), the bodies held at once stay
within the total budget, connections past the cap get no thread, and slow clients are dropped
within the request deadline."""

from __future__ import annotations

import select
import socket
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.twin import start_twin
from slow_clients import seconds_until_dropped

CONTROL = "/api/openapi/v1"
DEADLINE = 0.6  # request_timeout of the twins below (seconds)


@pytest.fixture(scope="module")
def twin(tmp_path_factory, tokenizer):
    with start_twin(home=tmp_path_factory.mktemp("bounds") / "home", tokenizer=tokenizer, policy="toy",
                    max_body_bytes=1 << 20, max_total_body_bytes=1 << 20, request_timeout=DEADLINE,
                    idle_timeout=5.0, max_connections=16) as started:
        yield started


def port(twin) -> int:
    return int(twin.base_url.rsplit(":", 1)[1])


def post(twin, path: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(twin.base_url + path, content=body,
                      headers={"X-API-Key": twin.api_key, "Content-Type": "application/json", **headers})


ROUTES = [f"{CONTROL}/service-sessions", f"{CONTROL}/service-sessions/s-1/training-runs",
          f"{CONTROL}/service-sessions/s-1/sampling-runs", "/api/telemetry/event"]


@pytest.mark.parametrize("body", [
    b"[" * 200_000,
    b'{"a": ' * 100_000,
    b'{"name": [' + b"[" * 2000 + b"]" * 2000 + b"]}",
    b'{"ttl_seconds": ' + b"9" * 5000 + b"}",
    b"\xff\xfe{}",
], ids=["open-brackets", "deep-objects", "deep-valid", "5000-digit-int", "not-utf8"])
def test_a_body_the_decoder_cannot_take_gets_a_4xx(twin, body):
    response = post(twin, f"{CONTROL}/service-sessions", body)
    assert 400 <= response.status_code < 500, response.text
    assert httpx.get(twin.base_url + "/api/models", headers={"X-API-Key": twin.api_key}).status_code == 200


json_text = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=3), max_leaves=10)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=st.binary(max_size=200) | json_text.map(lambda v: repr(v).encode()))
def test_any_body_to_any_control_route_gets_a_status_below_500(twin, route, body):
    """Invariant: whatever an authenticated client posts, the twin answers below 500."""
    assert post(twin, route, body).status_code < 500


def test_a_body_waits_while_others_hold_the_whole_budget(twin):
    """A body that does not fit the total budget is not read until the one holding it lets go
    (here: a client stalled mid-body, dropped at the deadline)."""
    size = 1 << 20
    with socket.create_connection(("127.0.0.1", port(twin))) as stalled:
        stalled.sendall(f"POST {CONTROL}/service-sessions HTTP/1.1\r\nHost: x\r\nX-API-Key: {twin.api_key}\r\n"
                        f"Content-Length: {size}\r\n\r\n{{".encode())
        time.sleep(0.2)  # the stalled body holds the budget
        started = time.monotonic()
        response = post(twin, f"{CONTROL}/service-sessions", b" " * (size - 2) + b"{}")
        waited = time.monotonic() - started
    assert response.status_code in (422, 503), response.text
    assert waited > DEADLINE * 0.5  # it was not read beside the stalled one


@pytest.mark.parametrize("first, then", [
    (b"POST /api/telemetry/event HTTP/1.1\r\n", b"X-Slow: 1\r\n"),
    (b"POST /api/telemetry/event HTTP/1.1\r\nHost: x\r\nX-API-Key: twin-local-key\r\nContent-Length: 100\r\n\r\n{",
     None),
    (b"POST /api/telemetry/event HTTP/1.1\r\nHost: x\r\nX-API-Key: twin-local-key\r\nContent-Length: 100000\r\n\r\n",
     b" "),
], ids=["one-header-line-at-a-time", "short-body", "trickled-body"])
def test_a_slow_client_is_dropped_within_the_request_deadline(twin, first, then):
    assert seconds_until_dropped(("127.0.0.1", port(twin)), first, then, limit=8.0) < DEADLINE + 1.0


def test_connections_past_the_cap_get_no_thread_and_are_closed_at_once(twin):
    before = threading.active_count()
    held = [socket.create_connection(("127.0.0.1", port(twin))) for _ in range(40)]
    try:
        time.sleep(0.3)
        during = threading.active_count()
        closed = 0
        readable, _, _ = select.select(held, [], [], 0.05)  # a connection closed by the twin reads as EOF
        for connection in readable:
            try:
                closed += connection.recv(1) == b""
            except OSError:
                closed += 1
    finally:
        for connection in held:
            connection.close()
    assert during - before <= 16 + 2
    assert closed >= 40 - 16


def test_twin_serve_on_a_taken_port_is_one_line(tmp_path):
    from click.testing import CliRunner

    from searchr1.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        number = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["twin", "serve", "--home", str(tmp_path / "home"), "--port", str(number)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"Error: port {number} on 127.0.0.1 is taken (another server listens there); stop it or pick another --port"]
