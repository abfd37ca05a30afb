"""`retriever serve`: the official /retrieve API over a local index, on loopback; started with a
key, it answers only clients that send it, ours reading it from $SEARCHR1_RETRIEVER_API_KEY."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, build_index
from searchr1.bm25.server import RequestError, parse_request, start_in_thread
from searchr1.core.tools import ToolCall
from searchr1.search.factory import create_search_backend
from searchr1.search.retriever import KEY_ENV, RetrieverRefusedError
from searchr1.search.retriever_pages import RetrieverPageBackend
from searchr1.basics.secrets import Secret

TOPICS = ["Hamlet", "Paris", "Danube", "Mona Lisa", "Everest", "Amazon", "Sahara", "Nile", "Tokyo", "Sydney",
          "Jupiter", "Mozart"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("serve")
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(passage_row(f"d{i}", topic, f"{topic} is topic number {i} of this corpus.")
                              for i, topic in enumerate(TOPICS)), "utf-8")
    build_index(corpus, directory / "index")
    index = BM25Index(directory / "index")
    with start_in_thread(index) as server:
        yield server, index


def test_retrieve_answers_in_the_official_shape(served):
    server, _ = served
    body = httpx.post(server.url, json={"queries": ["Everest", "Tokyo"], "topk": 3, "return_scores": True}).json()
    assert [hits[0]["document"] for hits in body["result"]] == [
        {"id": "d4", "contents": '"Everest"\nEverest is topic number 4 of this corpus.'},
        {"id": "d8", "contents": '"Tokyo"\nTokyo is topic number 8 of this corpus.'}]
    assert all(isinstance(hit["score"], float) for hits in body["result"] for hit in hits)
    plain = httpx.post(server.url, json={"queries": ["Everest"]}).json()
    assert plain["result"][0][0] == {"id": "d4", "contents": '"Everest"\nEverest is topic number 4 of this corpus.'}
    health = httpx.get(server.url.replace("/retrieve", "/healthz")).json()
    assert health["passages"] == len(TOPICS) and health["status"] == "ok"


async def test_our_retriever_backend_reads_the_server_as_the_local_backend_reads_the_index(served):
    server, index = served
    async with create_search_backend("retriever", url=server.url) as remote, \
            create_search_backend("local", index=index) as local:
        for topic in TOPICS:
            over_http, in_process = await remote.search(topic), await local.search(topic)
            assert over_http.ok and over_http.items == in_process.items


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "body is not JSON"),
    (b"[1, 2]", 422, "JSON object"),
    (b"{}", 422, "'queries' must be a non-empty list"),
    (b'{"queries": []}', 422, "'queries' must be a non-empty list"),
    (b'{"queries": ["a", 3]}', 422, "queries[1] is int"),
    (b'{"queries": ["a"], "topk": 0}', 422, "'topk' must be an integer"),
    (b'{"queries": ["a"], "topk": "3"}', 422, "'topk' must be an integer"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 422, "'return_scores' must be true or false"),
    (b'{"queries": ["a"], "k": 3}', 422, "unknown field(s): k"),
    (b'{"queries": ["' + b"x" * 5000 + b'"]}', 422, "longer than 4096"),
    (b'{"queries": ["a"]}' + b" " * (1 << 20), 413, "larger than"),
])
def test_a_malformed_request_gets_a_4xx_naming_the_fault_and_the_server_keeps_answering(served, body, status, message):
    server, _ = served
    response = httpx.post(server.url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status and message in response.json()["error"]
    assert httpx.post(server.url, json={"queries": ["Nile"]}).status_code == 200


async def test_concurrent_clients_each_get_their_own_answer(served):
    server, index = served
    queries = [TOPICS[i % len(TOPICS)] for i in range(48)]
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=16)) as client:
        responses = await asyncio.gather(*(client.post(server.url, json={"queries": [q], "topk": 2}) for q in queries))
    expected = index.search(queries, 2)
    for query, response, hits in zip(queries, responses, expected):
        assert response.status_code == 200
        assert [d["id"] for d in response.json()["result"][0]] == [h.id for h in hits]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["queries", "topk", "return_scores", "x"]), inner, max_size=4),
                    max_leaves=12)


@pytest.mark.slow  # 300 generated request bodies (a second)
@settings(max_examples=300, deadline=None)
@given(payload=JSON)
def test_any_json_body_is_accepted_or_refused_with_a_4xx_never_an_exception(payload):
    try:
        queries, topk, scores = parse_request(json.dumps(payload).encode())
    except RequestError as error:
        assert 400 <= error.status < 500 and str(error)
    else:
        assert queries and all(isinstance(q, str) for q in queries) and 1 <= topk <= 100 and isinstance(scores, bool)


KEY = "retriever-test-key-5fQ9wZ2c"


@pytest.fixture(scope="module")
def keyed(served):
    _, index = served
    with start_in_thread(index, api_key=Secret(KEY)) as server:
        yield server


def test_a_server_with_a_key_answers_only_requests_that_send_it(keyed):
    bare = httpx.post(keyed.url, json={"queries": ["Nile"]})
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.post(keyed.url, json={"queries": ["Nile"]}, headers={"authorization": f"Bearer x{KEY}"})
    assert wrong.status_code == 401 and KEY not in wrong.text
    right = httpx.post(keyed.url, json={"queries": ["Nile"]}, headers={"authorization": f"Bearer {KEY}"})
    assert right.status_code == 200 and right.json()["result"][0][0]["id"] == "d7"
    assert httpx.get(keyed.url.replace("/retrieve", "/healthz")).json()["status"] == "ok"


async def test_our_backend_sends_the_key_from_the_environment_and_stops_in_one_line_without_it(
        keyed, served, monkeypatch, tmp_path):
    """With $SEARCHR1_RETRIEVER_API_KEY set, search and open_page read the keyed server as the
    open one; without it, or with another key, the first call stops the run with one line naming
    the variable and never the key."""
    open_server, _ = served
    no_env_file = tmp_path / "absent.env"
    monkeypatch.setenv(KEY_ENV, KEY)
    async with create_search_backend("retriever", url=keyed.url, env_file=no_env_file) as remote, \
            create_search_backend("retriever", url=open_server.url, env_file=no_env_file) as reference:
        assert KEY not in repr(remote)
        for topic in TOPICS[:4]:
            assert (await remote.search(topic)).items == (await reference.search(topic)).items
        pages = RetrieverPageBackend.beside(remote)
        page = await pages.call(ToolCall("open_page", {"page": "Everest"}))
        assert page.ok and page.items and page.items[0].title.startswith("Everest")
    for key in (None, "other-key-0123456789"):
        if key is None:
            monkeypatch.delenv(KEY_ENV)
        else:
            monkeypatch.setenv(KEY_ENV, key)
        async with create_search_backend("retriever", url=keyed.url, env_file=no_env_file, max_retries=0) as remote:
            with pytest.raises(RetrieverRefusedError) as refused:
                await remote.search("Nile")
            with pytest.raises(RetrieverRefusedError):
                await RetrieverPageBackend.beside(remote).call(ToolCall("open_page", {"page": "Nile"}))
        message = str(refused.value)
        assert "HTTP 401" in message and KEY_ENV in message and "\n" not in message
        assert KEY not in message and (key is None or key not in message)
