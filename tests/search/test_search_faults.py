"""Fault injection through httpx.MockTransport: every failure becomes ok=False (or a retried
success) in the right stats bucket, never an exception. No cassette is active here."""

from __future__ import annotations

import asyncio
import gzip
import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.search.clock import RealClock
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.testing import mock_backend
from searchr1.core.observation.text import format_observation
from searchr1.search.retriever import RetrieverRefusedError
from searchr1.search.wikipedia import WikipediaRefusedError

BACKENDS = ["wikipedia", "zhihu", "deepseek", "retriever"]
GOOD = [{"results": [{"title": "Good", "text": "good text"}]}]


class Script:
    """Handler that plays the given actions in order (then keeps playing the last one).
    An action is an exception to raise, or a callable request -> response."""

    def __init__(self, backend: str, *actions):
        self.backend = backend
        self.actions = list(actions)
        self.calls = 0
        self.good = FakeSearchService(backend, {})

    def __call__(self, request: httpx.Request) -> httpx.Response:
        action = self.actions[min(self.calls, len(self.actions) - 1)]
        self.calls += 1
        if isinstance(action, BaseException):
            raise action
        if action == "good":
            return self.good.render(GOOD[0], request, "q")
        return action(request)


def status(code, **headers):
    return lambda request: httpx.Response(code, headers=headers, content=b"")


def html_page(request):
    return httpx.Response(
        200, headers={"content-type": "text/html"}, content=b"<html><body>Oops</body></html>"
    )


def bad_gzip(request):
    return httpx.Response(
        200,
        headers={"content-encoding": "gzip", "content-type": "application/json"},
        content=b"this is not gzip at all",
    )


def search(backend, query="q"):
    async def run():
        async with backend:
            return await backend.search(query)

    return asyncio.run(run())


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    ("failure", "error_text", "bucket", "retried"),
    [
        (httpx.ReadTimeout("slow"), "request timeout", "search/timeout_rate", True),
        (httpx.ConnectTimeout("slow"), "request timeout", "search/timeout_rate", True),
        (httpx.ConnectError("refused"), "network error (ConnectError)", None, True),
        (
            ConnectionResetError(104, "Connection reset by peer"),
            "network error (ConnectionResetError)",
            None,
            True,
        ),
        (httpx.RemoteProtocolError("peer closed"), "network error (RemoteProtocolError)", None, True),
    ],
)
def test_transport_failures_are_retried_then_reported(name, failure, error_text, bucket, retried):
    script = Script(name, failure)
    backend = mock_backend(name, script, max_retries=2)
    result = search(backend)
    assert not result.ok and result.items == ()
    assert result.error.startswith(error_text)
    assert script.calls == 3
    metrics = backend.stats.drain()
    assert metrics["search/error_rate"] == 1.0 and metrics["search/success_rate"] == 0.0
    if bucket:
        assert metrics[bucket] == 1.0
    assert format_observation(result).startswith("Search error: ")


@pytest.mark.parametrize("name", BACKENDS)
def test_transient_failures_then_success(name):
    script = Script(name, httpx.ReadTimeout("slow"), status(503), "good")
    backend = mock_backend(name, script, max_retries=2)
    result = search(backend)
    assert result.ok and [i.title for i in result.items] == ["Good"]
    metrics = backend.stats.drain()
    assert metrics["search/success_rate"] == 1.0 and metrics["search/timeout_rate"] == 1.0
    assert metrics["search/results"] == 1.0


@pytest.mark.parametrize("name", BACKENDS)
def test_429_storm_gives_up_after_bounded_retries(name):
    script = Script(name, status(429, **{"Retry-After": "2"}))
    backend = mock_backend(name, script, max_retries=3)
    result = search(backend)
    assert not result.ok and "rate limited" in result.error
    assert script.calls == 4
    assert backend.stats.drain()["search/429_rate"] == 1.0
    assert backend.clock.now() >= 3 * 2  # three honoured waits of Retry-After 2 (virtual time)


@pytest.mark.parametrize("name", BACKENDS)
def test_absurd_retry_after_is_not_slept(name):
    script = Script(name, status(429, **{"Retry-After": "86400"}))
    backend = mock_backend(name, script, max_retries=3)
    result = search(backend)
    assert not result.ok and "wait" in result.error
    assert backend.clock.now() < 60


@pytest.mark.parametrize("name", BACKENDS)
def test_non_retryable_4xx_is_reported_once(name):
    script = Script(name, status(400))
    backend = mock_backend(name, script, max_retries=3)
    result = search(backend)
    assert not result.ok and result.error.startswith("HTTP 400") and result.status == 400
    assert script.calls == 1


@pytest.mark.parametrize("name", ["wikipedia", "zhihu", "retriever"])
def test_html_instead_of_json(name):
    result = search(mock_backend(name, Script(name, html_page)))
    assert not result.ok and result.error == "invalid JSON response"


def test_html_instead_of_event_stream():
    result = search(mock_backend("deepseek", Script("deepseek", html_page)))
    assert not result.ok and "unexpected content type" in result.error


@pytest.mark.parametrize("name", BACKENDS)
def test_broken_gzip_body(name):
    result = search(mock_backend(name, Script(name, bad_gzip)))
    assert not result.ok and "decoding error" in result.error


@pytest.mark.parametrize("name", BACKENDS)
def test_valid_gzip_body_is_decoded(name):
    def gzipped(request):
        plain = FakeSearchService(name, {}).render(GOOD[0], request, "q")
        return httpx.Response(
            200, headers={**plain.headers, "content-encoding": "gzip"}, content=gzip.compress(plain.content)
        )

    result = search(mock_backend(name, Script(name, gzipped)))
    assert result.ok and [i.title for i in result.items] == ["Good"]


class EndlessStream(httpx.AsyncByteStream):
    def __init__(self, chunk: bytes, delay: float = 0.0, limit: int | None = None):
        self.chunk, self.delay, self.limit = chunk, delay, limit

    async def __aiter__(self):
        sent = 0
        while self.limit is None or sent < self.limit:
            if self.delay:
                await asyncio.sleep(self.delay)
            sent += 1
            yield self.chunk


@pytest.mark.parametrize("name", BACKENDS)
def test_huge_body_is_refused_without_buffering_it_all(name):
    content_type = "text/event-stream" if name == "deepseek" else "application/json"
    chunk = (b'data: {"type":"ping"}\n\n' * 2000) if name == "deepseek" else b" " * 65536
    script = Script(
        name,
        lambda request: httpx.Response(
            200, headers={"content-type": content_type}, stream=EndlessStream(chunk, limit=2000)
        ),
    )
    result = search(mock_backend(name, script, max_body_bytes=1_000_000))
    assert not result.ok and "too large" in result.error


@pytest.mark.parametrize("name", ["wikipedia", "retriever"])
def test_huge_declared_content_length_is_refused(name):
    script = Script(
        name,
        lambda request: httpx.Response(
            200,
            headers={"content-type": "application/json", "content-length": str(10**10)},
            stream=EndlessStream(b"{}", limit=1),
        ),
    )
    result = search(mock_backend(name, script, max_body_bytes=1_000_000))
    assert not result.ok and "too large" in result.error


@pytest.mark.parametrize("name", BACKENDS)
def test_stream_dying_mid_body_is_a_retryable_network_error(name):
    class Dying(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b'{"partial": '
            raise httpx.ReadError("connection lost")

    script = Script(
        name,
        lambda request: httpx.Response(
            200,
            headers={"content-type": "text/event-stream" if name == "deepseek" else "application/json"},
            stream=Dying(),
        ),
        "good",
    )
    result = search(mock_backend(name, script, max_retries=1))
    assert result.ok and script.calls == 2


def test_truncated_event_stream_is_a_failure_with_usage_counted():
    def truncated(request):
        full = FakeSearchService("deepseek", {}).render(GOOD[0], request, "q").content.decode()
        cut = full[: full.index("event: message_delta")]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=cut.encode())

    backend = mock_backend("deepseek", Script("deepseek", truncated))
    result = search(backend)
    assert not result.ok and "truncated" in result.error
    assert backend.stats.drain()["search/input_tokens"] > 0  # billed even though it failed


def test_sse_error_message_is_bounded_and_sanitised():
    message = "upstream exploded\n\x1b[31m" + "blah " * 500

    def error_event(request):
        body = (
            "event: error\ndata: "
            + json.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
            + "\n\n"
        )
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    result = search(mock_backend("deepseek", Script("deepseek", error_event)))
    assert not result.ok and result.error.startswith("DeepSeek stream error (api_error): upstream exploded")
    assert len(result.error) <= 200 and "\n" not in result.error and "\x1b" not in result.error


@pytest.mark.slow  # waits out each backend's wall-clock limit
@pytest.mark.parametrize("name", BACKENDS)
def test_a_trickling_response_is_cut_at_the_wall_clock_limit(name):
    """httpx's per-read timeout never fires on a stream that sends a byte every 50 ms; the
    per-attempt wall-clock limit (``total_timeout``: = timeout, but its own setting for
    DeepSeek) must, and says so."""
    content_type = "text/event-stream" if name == "deepseek" else "application/json"
    chunk = b": keep-alive\n\n" if name == "deepseek" else b" "
    script = Script(
        name,
        lambda request: httpx.Response(
            200, headers={"content-type": content_type}, stream=EndlessStream(chunk, delay=0.05)
        ),
    )
    limits = {"total_timeout": 0.4} if name == "deepseek" else {}
    backend = mock_backend(name, script, timeout=0.4, max_retries=0, clock=RealClock(), **limits)
    started = time.monotonic()
    result = search(backend)
    elapsed = time.monotonic() - started
    assert not result.ok and result.error.startswith("request timeout (total limit of 0.4 s")
    assert elapsed < 2.0
    assert backend.stats.drain()["search/timeout_rate"] == 1.0


def test_total_deadline_bounds_retries_and_waits():
    script = Script("retriever", status(503, **{"Retry-After": "20"}))
    backend = mock_backend("retriever", script, max_retries=10, deadline=50.0)
    result = search(backend)
    assert not result.ok and "deadline" in result.error
    assert backend.clock.now() <= 50.0 and script.calls == 3


@pytest.mark.parametrize("name", ["wikipedia", "zhihu", "retriever"])  # deepseek ignores unknown events
def test_wrong_json_shape_is_a_schema_failure(name):
    def shaped(request):
        return httpx.Response(
            200, json={"Code": 0, "Data": {"Items": "nope"}, "query": {"pages": 5}, "result": {"x": 1}}
        )

    result = search(mock_backend(name, Script(name, shaped)))
    assert not result.ok and result.error.startswith("unexpected response schema")


def test_programming_errors_propagate():
    backend = mock_backend("retriever", Script("retriever", "good"))
    with pytest.raises(TypeError, match="query must be str"):
        search(backend, query=None)

    class Bug(Exception):
        pass

    with pytest.raises(Bug):
        search(mock_backend("retriever", Script("retriever", Bug("handler bug"))))


def test_empty_query_is_a_failure_without_a_request():
    script = Script("retriever", "good")
    result = search(mock_backend("retriever", script), query="  \n ")
    assert not result.ok and result.error == "empty query" and script.calls == 0


statuses = st.sampled_from(
    [200, 200, 200, 201, 204, 301, 400, 401, 403, 404, 408, 418, 429, 500, 502, 503, 504]
)
bodies = st.one_of(
    st.binary(max_size=300),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    ).map(lambda v: json.dumps(v).encode()),
)
content_types = st.sampled_from(["application/json", "text/html", "text/event-stream", "text/plain", ""])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(BACKENDS),
    code=statuses,
    body=bodies,
    content_type=content_types,
    retry_after=st.one_of(st.none(), st.sampled_from(["0", "1", "x", "-5", "1e9"])),
)
def test_search_never_raises_whatever_the_server_answers_but_a_refusal_of_the_client_stops(
    name, code, body, content_type, retry_after
):
    marker = b"BODYMARKER"
    headers = {"content-type": content_type} if content_type else {}
    if retry_after is not None:
        headers["retry-after"] = retry_after

    def handler(request):
        return httpx.Response(code, headers=headers, content=body + marker)

    if name == "wikipedia" and code == 403:  # the run must stop: see WikipediaRefusedError
        with pytest.raises(WikipediaRefusedError):
            search(mock_backend(name, handler, max_retries=1))
        return
    if name == "retriever" and code in (401, 403):  # the server takes a key we lack: RetrieverRefusedError
        with pytest.raises(RetrieverRefusedError, match=f"HTTP {code}"):
            search(mock_backend(name, handler, max_retries=1))
        return
    result = search(mock_backend(name, handler, max_retries=1))
    assert isinstance(result.ok, bool)
    if not result.ok:
        assert result.error and len(result.error) <= 200 and "BODYMARKER" not in result.error
