"""The twin's HTTP face against requests no honest pytrio client sends: names that would leave
the twin's home, bodies that are huge, lie about their length or never finish. Raw sockets
where the real client would refuse to send such a request."""

from __future__ import annotations

import socket
import time

import pytest
import pytrio.client.builders.training as training_builders
from twin_support import MODEL, running_twin

from searchr1.twin import start_twin
from searchr1.twin.store import CheckpointStore, InvalidName

CONTROL = "/api/openapi/v1"


IDLE_TIMEOUT = 1.0  # the fixture twin's keep-alive idle timeout (seconds)
CLOSE_WAIT = IDLE_TIMEOUT / 2  # a connection the server ends is closed well before it would idle out


def exchange(twin, head: str, body: bytes = b"", *, timeout: float = 5.0,
             await_close: bool = False) -> tuple[int, bytes, bool | None]:
    """Send a raw request; return (status, response bytes, whether the server closed the connection
    within ``CLOSE_WAIT`` of answering: asked for with ``await_close``, else None)."""
    with socket.create_connection(("127.0.0.1", _port(twin)), timeout=timeout) as connection:
        connection.sendall(head.encode() + b"\r\n" + body)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
        header, _, rest = received.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in header.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            chunk = connection.recv(65536)
            if not chunk:
                break
            rest += chunk
        closed = None
        if await_close:
            connection.settimeout(CLOSE_WAIT)
            try:
                closed = connection.recv(1) == b""
            except TimeoutError:
                closed = False
    status = int(header.split(b" ")[1]) if header else 0
    return status, header + b"\r\n\r\n" + rest, closed


def _port(twin) -> int:
    return int(twin.base_url.rsplit(":", 1)[1])


def request(method: str, path: str, *headers: str) -> str:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, ""])


@pytest.fixture
def twin(tmp_path, tokenizer):
    with start_twin(home=tmp_path / "home", tokenizer=tokenizer, policy="toy", max_body_bytes=4096,
                    idle_timeout=IDLE_TIMEOUT) as started:
        yield started


def key(twin) -> str:
    return f"X-API-Key: {twin.api_key}"


# ----------------------------------------------------------------------------- bodies


def test_an_unauthenticated_post_declaring_a_huge_body_is_refused_before_it_is_read(twin):
    started = time.monotonic()
    status, _, closed = exchange(twin, request("POST", f"{CONTROL}/service-sessions", "Content-Length: 3000",
                                               "Content-Type: application/json"), b"{", await_close=True)
    assert status == 401 and closed  # the unread body ends the connection, it is never consumed
    assert time.monotonic() - started < 3


def test_an_unknown_route_is_answered_without_reading_its_body(twin):
    status, _, closed = exchange(twin, request("POST", "/nowhere", "Content-Length: 4000"), b"x", await_close=True)
    assert status == 404 and closed


def test_a_body_over_the_limit_is_answered_413_unread(twin):
    status, answer, closed = exchange(twin, request("POST", f"{CONTROL}/service-sessions", key(twin),
                                                    "Content-Length: 5000"), b"{", await_close=True)
    assert status == 413 and b"payload_too_large" in answer and closed


@pytest.mark.parametrize("length", ["-1", "12abc", " ", "1e3"])
def test_a_content_length_that_is_not_a_byte_count_is_a_bad_request(twin, length):
    status, answer, closed = exchange(twin, request("POST", f"{CONTROL}/service-sessions", key(twin),
                                                    f"Content-Length: {length}"), await_close=True)
    assert status == 400 and b"invalid_content_length" in answer and closed


def test_a_chunked_request_body_is_refused(twin):
    status, _, closed = exchange(twin, request("POST", f"{CONTROL}/service-sessions", key(twin),
                                               "Transfer-Encoding: chunked"), b"5\r\nhello\r\n0\r\n\r\n",
                                 await_close=True)
    assert status == 411 and closed


def test_a_client_that_stops_sending_mid_body_is_let_go(twin):
    with socket.create_connection(("127.0.0.1", _port(twin)), timeout=5) as connection:
        connection.sendall(request("POST", f"{CONTROL}/service-sessions", key(twin), "Content-Length: 100").encode()
                           + b"\r\n{")
        started = time.monotonic()
        assert connection.recv(100) == b""  # closed by the server's idle timeout, no answer
        assert time.monotonic() - started < 4


def test_an_idle_keep_alive_connection_is_closed(twin):
    with socket.create_connection(("127.0.0.1", _port(twin)), timeout=5) as connection:
        started = time.monotonic()
        assert connection.recv(100) == b""
        assert time.monotonic() - started < 4


# ----------------------------------------------------------------------------- query parameters


@pytest.mark.parametrize("path", ["/api/models", f"{CONTROL}/checkpoints"])
@pytest.mark.parametrize("query", ["limit=ten", "offset=-1", "limit=1.5", "offset=%C2%B2"])
def test_a_paging_parameter_that_is_not_a_whole_number_is_a_bad_request_naming_it(twin, path, query):
    status, answer, _ = exchange(twin, request("GET", f"{path}?{query}", key(twin)))
    name = query.split("=")[0]
    assert status == 400 and b"invalid_query" in answer and f"{name}=".encode() in answer


def test_whole_paging_parameters_page_the_list(twin):
    status, answer, _ = exchange(twin, request("GET", "/api/models?limit=1&offset=0", key(twin)))
    assert status == 200 and b"model-twin" in answer
    status, answer, _ = exchange(twin, request("GET", "/api/models?limit=1&offset=1", key(twin)))
    assert status == 200 and b"model-twin" not in answer


# ----------------------------------------------------------------------------- names and paths


@pytest.mark.parametrize("run", ["..", "run-0001%2f..", "...", "run-1"])
def test_a_training_run_id_that_is_not_the_twins_is_a_bad_request(twin, run):
    (twin.backend.store.home / "run.json").write_text('{"secret": 1}')  # what ".." would read
    for path in (f"{CONTROL}/training-runs/{run}", f"{CONTROL}/training-runs/{run}/checkpoints"):
        status, answer, _ = exchange(twin, request("GET", path, key(twin)))
        assert status == 400 and b"invalid training run id" in answer and b"secret" not in answer


@pytest.mark.parametrize("name", ["../../../../escaped", "/tmp/absolute-escape", "a\x00b", "..", ".hidden",
                                  "x" * 201, "sub/dir"])
def test_a_checkpoint_name_the_sdk_would_refuse_is_refused_by_the_twin_too(tmp_path, tokenizer, monkeypatch, name):
    monkeypatch.setattr(training_builders, "_normalize_checkpoint_name", lambda value: value)  # a hostile client
    home = tmp_path / "deep" / "er" / "home"
    with running_twin(home, tokenizer) as (_, service):
        trainer = service.create_lora_training_client(MODEL, rank=8)
        with pytest.raises(Exception) as refused:
            trainer.save_state(name).result()
        assert "invalid checkpoint name" in str(refused.value)
        again = service.create_lora_training_client(MODEL, rank=8)  # pytrio drops a run whose submit failed
        assert again.save_state("fine").result().path.endswith("/state/fine")
    assert not list(tmp_path.rglob("*escaped*")) and not list(tmp_path.rglob(".tmp-*"))
    assert not (tmp_path / "absolute-escape.npz").exists()
    outside = [p for p in tmp_path.rglob("*.npz") if home not in p.parents]
    assert outside == []


def test_the_store_refuses_any_path_outside_its_home(tmp_path):
    store = CheckpointStore(tmp_path / "home")
    (tmp_path / "home" / "runs" / "run-0001").mkdir()
    (tmp_path / "home" / "runs" / "run-0001" / "state").symlink_to(tmp_path)  # a link out of the home
    with pytest.raises(InvalidName, match="outside the twin's home"):
        store.exists("run-0001", "state", "x")
    for run, name in [("../x", "y"), ("run-0001", "../../../x"), ("run-0001", "a\x00b")]:
        with pytest.raises(InvalidName):
            store.exists(run, "weights", name)
