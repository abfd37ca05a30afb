"""`retriever serve` against clients no honest one is: bodies the JSON decoder cannot take,
uploads without a length, clients that send one header line at a time or stop mid-body, a port
that is taken. Every body gets a 4xx (never a 500), slow clients are dropped within the
request deadline, and a taken port is one line."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, build_index
from searchr1.bm25.server import MAX_BODY_BYTES, RequestError, parse_request, start_in_thread
from searchr1.cli import main
from slow_clients import seconds_until_dropped

DEADLINE = 0.5  # the request deadline these servers run with (seconds)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bounds")
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(passage_row(f"d{i}", t, f"{t} is passage {i}.") for i, t in
                              enumerate(["Hamlet", "Paris", "Danube", "Everest"])), "utf-8")
    build_index(corpus, directory / "index")
    return directory / "index"


@pytest.fixture(scope="module")
def served(index_dir):
    with start_in_thread(BM25Index(index_dir), request_timeout=DEADLINE) as server:
        yield server


def address(server) -> tuple[str, int]:
    return "127.0.0.1", int(server.url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.parametrize("body", [
    b"[" * 200_000,
    b'{"queries": ' + b'{"a": ' * 100_000,
    b'{"queries": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
    b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}",
    b'{"queries": ["a"], "topk": ' + b"9" * 4000 + b"}",
    b'{"queries": ["a"], "topk": 1e999}',
    b"\xff\xfe{}",
], ids=["open-brackets", "deep-objects", "deep-query", "5000-digit-topk", "4000-digit-topk", "huge-float", "not-utf8"])
def test_a_body_the_decoder_cannot_take_gets_a_4xx_and_the_server_keeps_answering(served, body):
    response = httpx.post(served.url, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert len(response.json()["error"]) < 300
    assert httpx.post(served.url, json={"queries": ["Paris"]}).status_code == 200


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_are_read_or_refused_with_a_4xx(body):
    """Invariant: parse_request answers any body with a request or a 4xx refusal, nothing else."""
    try:
        parse_request(body)
    except RequestError as error:
        assert 400 <= error.status < 500


@pytest.mark.slow  # sixty requests over HTTP
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=200) | st.recursive(st.just(b"1"), lambda inner: inner.map(lambda b: b"[" + b + b"]")
                                                   | inner.map(lambda b: b'{"queries":' + b + b"}"), max_leaves=40))
def test_any_body_sent_to_the_server_gets_a_status_below_500(served, body):
    """Invariant: over HTTP, whatever the body, the answer is 200 or a 4xx, never a 5xx."""
    assert httpx.post(served.url, content=body).status_code < 500


def test_an_upload_without_a_length_is_refused_once_it_passes_the_cap_not_after_reading_it_all(served):
    """The server answers 413 while the client is still sending: what it read is bounded by the
    cap (plus socket buffers), not by the upload."""
    with socket.create_connection(address(served)) as connection:
        connection.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        connection.settimeout(0.01)
        chunk, sent, answer = b"%x\r\n%s\r\n" % (1 << 16, b" " * (1 << 16)), 0, b""
        started = time.monotonic()
        while not answer and sent < (64 << 20) and time.monotonic() - started < 20:
            try:
                connection.sendall(chunk)
                sent += 1 << 16
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                break  # closed by the server after its answer
            try:
                answer = connection.recv(4096)
            except (TimeoutError, BlockingIOError):
                pass
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
    assert sent < MAX_BODY_BYTES + (8 << 20), sent


@pytest.mark.slow  # waits out the request deadline
@pytest.mark.parametrize("first, then", [
    (b"", None),
    (b"POST /retrieve HTTP/1.1\r\n", b"X-Slow: 1\r\n"),
    (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", None),
    (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{", b" "),
], ids=["silent", "one-header-line-at-a-time", "short-body", "trickled-body"])
def test_a_slow_or_silent_client_is_dropped_within_the_request_deadline(served, first, then):
    assert seconds_until_dropped(address(served), first, then, limit=10.0) < DEADLINE + 1.0


@pytest.mark.slow  # waits out the request deadline three times
def test_a_prompt_request_on_a_kept_alive_connection_is_answered(served):
    with httpx.Client() as client:
        for _ in range(3):
            assert client.post(served.url, json={"queries": ["Danube"]}).status_code == 200
            time.sleep(DEADLINE * 1.2)  # longer than the deadline between requests: idle is not slow


def test_a_taken_port_is_one_line_before_anything_claims_to_serve(index_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["retriever", "serve", "--index", str(index_dir), "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"Error: port {port} on 127.0.0.1 is taken (another server listens there); stop it or pick another --port"]
