"""open_page over Wikipedia (each page pinned to one revision) and over ``POST /page`` of
``retriever serve``: the shipped page cassettes replayed through the real clients, the pinning,
the page HTML read back, the server's /page and its 4xx answers, and the wiring that picks the
page backend of a search backend."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, build_index
from searchr1.bm25.server import MAX_WINDOW, RequestError, parse_page_request, start_in_thread
from searchr1.core.observation.text import observation_candidates
from searchr1.core.settings import SettingError
from searchr1.core.tools import ToolCall
from searchr1.core.types import SearchResult
from searchr1.wiring.services import ServiceSetupError, check_tool_setup, tool_backends
from searchr1.search.base import CONTENT_LIMIT
from searchr1.search.cassette_specs import PageSpec, discover_specs
from searchr1.search.clock import VirtualClock
from searchr1.search.factory import create_search_backend
from searchr1.search.fake_service import FakeSearchService, page_html, page_revision, page_title
from searchr1.search.limits import Backoff
from searchr1.search.options import SearchOptions
from searchr1.bm25.page_naming import PAGE_WINDOW
from searchr1.search.pages import LocalPageBackend, page_backend_for
from searchr1.search.replay import ReplayBackend, open_replay_backend
from searchr1.search.retriever_pages import RetrieverPageBackend, RetrieverServesNoPagesError, page_url
from searchr1.search.stats import CallRecord, RecentSearchStats
from searchr1.search.testing import mock_backend
from searchr1.search.wikipedia import WikipediaRefusedError
from searchr1.search.wikipedia_pages import (WIKI18_DUMP_DATE, WikipediaPageBackend, html_passages, split_passage,
                                             wiki_title)

PAGE_CASES = [(spec, backend) for spec in discover_specs() if spec.pages for backend in spec.backends]


def read(pages, page: str, offset: int = 0) -> SearchResult:
    return asyncio.run(pages.call(ToolCall("open_page", {"page": page, "offset": offset})))


def scripted_pages(backend: str, pages: dict, **options):
    """A search backend served by the fake service with ``pages`` scripted, its page backend,
    and the fake (to read the requests it got)."""
    service = FakeSearchService(backend, {}, pages)
    search = mock_backend(backend, service.handler, **options)
    return search, page_backend_for(search), service


# --------------------------------------------------------------------------- the shipped cassettes


def test_both_page_cassettes_hold_every_required_scenario():
    assert {backend for _, backend in PAGE_CASES} == {"wikipedia", "retriever"}
    for spec, backend in PAGE_CASES:
        scenarios = " ".join(page.scenario for page in spec.pages)
        for needle in ("normal page", "longer than the window", "missing page", "429 with Retry-After",
                       "503 then success", "persistent", "truncated JSON"):
            assert needle in scenarios, (backend, needle)
        assert any(len(page.offsets) > 1 and len(page.paragraphs) > PAGE_WINDOW for page in spec.pages)
    wikipedia = next(spec for spec, backend in PAGE_CASES if backend == "wikipedia")
    assert any("redirect" in page.scenario and page.script.get("title") for page in wikipedia.pages)


def expected_titles(backend: str, page: PageSpec, offset: int) -> list[str]:
    total = len(page.paragraphs)
    title = page_title(page.page, page.script) if backend == "wikipedia" else page.script.get("title", page.page)
    revision = f", revision {page_revision(page.page, page.script)}" if backend == "wikipedia" else ""
    return [f"{title} (passage {k + 1} of {total}{revision})" for k in range(offset, min(total, offset + PAGE_WINDOW))]


@pytest.mark.parametrize(("spec", "backend"), PAGE_CASES, ids=[f"{b}/{s.name}" for s, b in PAGE_CASES])
def test_a_page_cassette_replays_through_the_real_client_to_the_scripted_pages(spec, backend):
    async def replay():
        async with open_replay_backend(backend, spec.cassette_path(backend)) as search:
            for query in spec.queries:
                assert (await search.search(query.query)).ok
            pages = tool_backends(("search", "open_page"), search)["open_page"]
            return [[await pages.call(ToolCall("open_page", {"page": page.page, "offset": offset}))
                     for offset in page.offsets] for page in spec.pages]

    for page, results in zip(spec.pages, asyncio.run(replay()), strict=True):
        label = f"{backend}: open_page {page.page!r} ({page.scenario})"
        first = results[0]
        assert first.ok is page.expected_ok, f"{label}: {first.error}"
        if "attempts" in page.expect:
            assert first.attempts == page.expect["attempts"], label
        if "min_latency" in page.expect:
            assert first.latency >= page.expect["min_latency"], label
        if "status" in page.expect:
            assert first.status == page.expect["status"], label
        if not page.expected_ok:
            assert page.expect["error"] in first.error and "\n" not in first.error, label
            assert observation_candidates(first, "open_page") == [f"Tool error (open_page): {first.error}"]
            continue
        for offset, result in zip(page.offsets, results, strict=True):
            shown = page.paragraphs[offset:offset + PAGE_WINDOW]
            assert result.ok and [item.content for item in result.items] == list(shown), label
            assert [item.title for item in result.items] == expected_titles(backend, page, offset), label
            assert {item.source for item in result.items} <= {"Wikipedia" if backend == "wikipedia" else "wiki-18"}
        if not page.paragraphs:
            assert observation_candidates(first, "open_page") == ["open_page returned nothing."]
        for result in results[1:]:  # Wikipedia reads on from the page it holds; the retriever asks again
            assert result.attempts == (0 if backend == "wikipedia" else 1), label


def test_a_redirect_and_its_target_read_the_same_revision_in_one_run():
    spec = next(spec for spec, backend in PAGE_CASES if backend == "wikipedia")

    async def replay():
        async with open_replay_backend("wikipedia", spec.cassette_path("wikipedia")) as search:
            pages = page_backend_for(search)
            return await pages.call(ToolCall("open_page", {"page": "Sears Tower"})), \
                await pages.call(ToolCall("open_page", {"page": "Willis Tower"})), pages

    redirect, target, pages = asyncio.run(replay())
    assert redirect.items == target.items and redirect.items[0].title.startswith("Willis Tower (passage 1 of 2, ")
    assert pages.pin("Sears Tower") == pages.pin("Willis Tower") and target.attempts == 0


# --------------------------------------------------------------------------- Wikipedia: pinning and HTML

EIFFEL = {"paragraphs": [f"Paragraph {k} of the Eiffel Tower article." for k in range(1, 7)]}
SEINE = {"paragraphs": ["The Seine is a river in France."]}


def test_a_page_is_parsed_from_its_pinned_revision_even_after_it_falls_out_of_memory():
    search, pages, service = scripted_pages("wikipedia", {"Eiffel Tower": EIFFEL, "Seine": SEINE})
    pages.keep_pages = 1
    first = read(pages, "Eiffel Tower")
    read(pages, "Seine")  # the Eiffel Tower's passages fall out of memory
    again = read(pages, "Eiffel Tower", 4)
    actions = [request.url.params["action"] for request in service.requests]
    assert actions == ["query", "parse", "query", "parse", "parse"]  # parsed again, never resolved again
    revision = str(page_revision("Eiffel Tower", EIFFEL))
    assert service.requests[-1].url.params["oldid"] == revision == service.requests[1].url.params["oldid"]
    assert [item.content for item in again.items] == EIFFEL["paragraphs"][4:]
    assert first.items[0].title == f"Eiffel Tower (passage 1 of 6, revision {revision})" and again.attempts == 1


def test_a_name_resolved_once_keeps_its_revision_when_the_wiki_moves_on():
    revisions = iter([111, 222])

    def handler(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if params["action"] == "query":
            page = {"pageid": 1, "ns": 0, "title": "Seine", "revisions": [{"revid": next(revisions)}]}
            return httpx.Response(200, json={"batchcomplete": True, "query": {"pages": [page]}})
        revid = int(params["oldid"])
        return httpx.Response(200, json={"parse": {"title": "Seine", "pageid": 1, "revid": revid,
                                                   "text": f"<p>Text of revision {revid}.</p>"}})

    pages = page_backend_for(mock_backend("wikipedia", handler))
    pages.keep_pages = 1
    # "seine" is resolved anew (the wiki now says 222) to the title "Seine", which keeps 111
    texts = [read(pages, name).items[0].content for name in ("Seine", "seine", "Seine", " Seine ")]
    assert texts == ["Text of revision 111."] * 4
    assert read(pages, "seine").items[0].title == "Seine (passage 1 of 1, revision 111)"


def test_a_pin_date_asks_for_the_last_revision_before_it_and_a_later_page_is_a_miss():
    seen: list[httpx.QueryParams] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params)
        return httpx.Response(200, json={"batchcomplete": True,
                                         "query": {"pages": [{"pageid": 7, "ns": 0, "title": "TikTok"}]}})

    search = mock_backend("wikipedia", handler)
    pages = WikipediaPageBackend.beside(search, as_of="2018-12-20")
    assert pages.as_of == WIKI18_DUMP_DATE
    result = read(pages, "TikTok")
    assert result.ok and result.items == () and result.attempts == 1
    assert (seen[0]["rvstart"], seen[0]["rvdir"], seen[0]["rvlimit"]) == (WIKI18_DUMP_DATE, "older", "1")
    with pytest.raises(ValueError, match="ISO 8601"):
        WikipediaPageBackend.beside(search, as_of="last Tuesday")


def test_a_name_no_title_can_be_is_a_miss_without_a_request():
    search, pages, service = scripted_pages("wikipedia", {})
    for name in ("Paris|London", "a[b]", "x" * 300, "#History"):
        assert read(pages, name) == SearchResult(ok=True)
    assert service.requests == [] and wiki_title("Paris#History") == "Paris"


def test_wikimedia_refusing_the_client_stops_the_run_as_search_does():
    search, pages, _ = scripted_pages("wikipedia", {"Seine": {**SEINE, "responses": [{"status": 403}]}})
    with pytest.raises(WikipediaRefusedError, match="SEARCHR1_CONTACT"):
        read(pages, "Seine")


def test_the_page_backend_shares_the_search_clients_connection_limiter_and_contact():
    search = create_search_backend("wikipedia", contact="me@example.org", transport=httpx.MockTransport(
        lambda request: httpx.Response(500)), clock=VirtualClock(), backoff=Backoff(rng=random.Random(0)))
    pages = page_backend_for(search)
    assert isinstance(pages, WikipediaPageBackend)
    assert pages._client is search._client and pages.limiter is search.limiter
    assert pages.headers == search.headers and "me@example.org" in pages.headers["User-Agent"]
    with pytest.raises(ValueError, match="no persistent cache"):
        WikipediaPageBackend(cache=object())


PARAGRAPH = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=80).map(
    lambda text: " ".join(text.split())).filter(bool)


@given(title=PARAGRAPH, paragraphs=st.lists(PARAGRAPH, min_size=1, max_size=6))
def test_the_paragraphs_of_a_parsed_page_read_back_as_written_without_what_a_reader_skips(title, paragraphs):
    assert html_passages(page_html(title, paragraphs)) == paragraphs


def test_formulas_keep_their_tex_and_other_superscripts_stay():
    text = ('<p>Energy is <span class="mwe-math-element"><span class="mwe-math-mathml-inline" style="display:none">'
            '<math><mi>E</mi></math></span><img class="mwe-math-fallback-image-inline" '
            'alt="{\\displaystyle E=mc^{2}}"></span>, about 10<sup>3</sup> J.<sup class="reference">[4]</sup></p>'
            '<figure><figcaption><p>A caption</p></figcaption></figure><p>Last <br>line</p>')
    assert html_passages(text) == ["Energy is E=mc^{2}, about 103 J.", "Last line"]


@given(words=st.lists(st.text("abcdefghij", min_size=1, max_size=30), min_size=1, max_size=200))
def test_a_long_paragraph_is_split_at_spaces_into_items_that_fit(words):
    text = " ".join(words)
    pieces = split_passage(text, 100)
    assert all(len(piece) <= 100 for piece in pieces) and " ".join(pieces) == text


def test_a_paragraph_longer_than_an_item_is_read_in_pieces_not_cut():
    long = " ".join(["word"] * 700)
    assert html_passages(f"<p>{long}</p>") == split_passage(long) and len(split_passage(long)) == 3
    assert all(len(piece) <= CONTENT_LIMIT for piece in split_passage(long))


# --------------------------------------------------------------------------- the retriever's /page

SEINE_PARTS = [f"Part {k} of the Seine article: the river flows through Paris." for k in range(1, 8)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("page-serve")
    corpus = directory / "corpus.jsonl"
    rows = ([(f"s{k}", "Seine", text) for k, text in enumerate(SEINE_PARTS, start=1)]
            + [("p1", "Paris", "Paris is the capital of France."), ("d1", "Danube", "The Danube is a river.")])
    corpus.write_text("".join(passage_row(*row) for row in rows), "utf-8")
    build_index(corpus, directory / "index")
    index = BM25Index(directory / "index")
    with start_in_thread(index) as server:
        yield server, index


@pytest.mark.slow  # builds an index and serves it (seconds)
async def test_pages_over_the_server_read_as_the_local_backend_reads_the_index(served):
    server, index = served
    async with create_search_backend("retriever", url=server.url) as search:
        pages = page_backend_for(search)
        assert isinstance(pages, RetrieverPageBackend) and pages.url.endswith("/page")
        local = LocalPageBackend(index)
        for name in ("Seine", '"Seine"', "s3", "Paris", "d1", "Loire"):
            for offset in (0, 2, 4, 7, 9):
                call = ToolCall("open_page", {"page": name, "offset": offset})
                remote, in_process = await pages.call(call), await local.call(call)
                assert remote.ok and remote.items == in_process.items, (name, offset)
                assert remote.attempts == 1


def test_page_answers_in_the_documented_shape(served):
    server, _ = served
    url = server.url.replace("/retrieve", "/page")
    body = httpx.post(url, json={"page": "Seine", "offset": 5, "window": 4}).json()
    assert body == {"result": [{"id": f"s{k}", "contents": f'"Seine"\n{SEINE_PARTS[k - 1]}'} for k in (6, 7)],
                    "total": 7}
    assert httpx.post(url, json={"page": "Loire"}).json() == {"result": [], "total": 0}
    assert len(httpx.post(url, json={"page": "s2"}).json()["result"]) == PAGE_WINDOW


@pytest.mark.parametrize("body, message", [
    (b"{not json", "body is not JSON"),
    (b"[1]", "JSON object with 'page'"),
    (b"{}", "'page' must be a non-blank string"),
    (b'{"page": "  "}', "'page' must be a non-blank string"),
    (b'{"page": 3}', "'page' must be a non-blank string"),
    (b'{"page": "Seine", "offset": -1}', "'offset' must be an integer"),
    (b'{"page": "Seine", "offset": true}', "'offset' must be an integer"),
    (b'{"page": "Seine", "window": 0}', "'window' must be an integer"),
    (b'{"page": "Seine", "window": 101}', "'window' must be an integer from 1 to 100"),
    (b'{"page": "Seine", "window": 2.0}', "'window' must be an integer"),
    (b'{"page": "Seine", "topk": 3}', "unknown field(s): topk"),
    (b'{"page": "' + b"x" * 5000 + b'"}', "'page' is longer than 4096"),
])
def test_a_malformed_page_request_gets_a_4xx_naming_the_field_and_the_server_keeps_answering(served, body, message):
    server, _ = served
    url = server.url.replace("/retrieve", "/page")
    response = httpx.post(url, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500 and message in response.json()["error"]
    assert httpx.post(url, json={"page": "Paris"}).status_code == 200


FIELDS = ("'page'", "'offset'", "'window'", "unknown field(s)", "JSON object")
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
                    | st.sampled_from(["Seine", "s2", "Paris"]),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["page", "offset", "window", "x"]), inner, max_size=4),
                    max_leaves=12)


@pytest.mark.slow  # a request to a served index per example (seconds)
@given(payload=JSON)
def test_any_json_body_sent_to_page_gets_a_page_or_a_4xx_naming_a_field_never_a_500(served, payload):
    server, _ = served
    response = httpx.post(server.url.replace("/retrieve", "/page"), content=json.dumps(payload).encode(),
                          headers={"content-type": "application/json"})
    if response.status_code == 200:
        body = response.json()
        assert isinstance(body["total"], int) and len(body["result"]) <= min(body["total"], MAX_WINDOW)
    else:
        assert 400 <= response.status_code < 500
        assert any(field in response.json()["error"] for field in FIELDS), response.text
    try:
        page, offset, window = parse_page_request(json.dumps(payload).encode())
    except RequestError as error:
        assert response.status_code == error.status
    else:
        assert response.status_code == 200 and page.strip() and offset >= 0 and 1 <= window <= MAX_WINDOW


def test_a_server_without_page_stops_the_run_with_one_line_naming_retriever_serve():
    search, pages, _ = scripted_pages("retriever", {"Seine": {**SEINE, "responses": [{"status": 404}]}})
    with pytest.raises(RetrieverServesNoPagesError) as caught:
        read(pages, "Seine")
    message = str(caught.value)
    assert "\n" not in message and "serves no pages" in message and "retriever serve" in message
    assert "HTTP 404" in message


def test_the_page_url_sits_beside_the_retrieve_url_with_its_credentials_kept_out_of_messages():
    assert page_url("http://127.0.0.1:8000/retrieve") == "http://127.0.0.1:8000/page"
    assert page_url("https://user:pw@host/api/retrieve?x=1") == "https://user:pw@host/api/page?x=1"
    error = RetrieverServesNoPagesError("https://user:pw@host/api/page", 404)
    assert "pw" not in str(error)


# --------------------------------------------------------------------------- the wiring


@pytest.mark.parametrize("backend", ["local", "wikipedia", "retriever"])
def test_open_page_is_accepted_with_every_backend_that_has_pages(backend):
    check_tool_setup(("search", "open_page"), SearchOptions(backend=backend))


@pytest.mark.parametrize("backend", ["deepseek", "zhihu"])
def test_open_page_is_refused_with_a_backend_without_pages_naming_those_that_have_them(backend):
    with pytest.raises(SettingError) as caught:
        check_tool_setup(("search", "open_page"), SearchOptions(backend=backend))
    assert str(caught.value) == (
        f"--tools open_page reads the pages of --backend local, wikipedia or retriever only (this command "
        f"searches with {backend}); pass --backend local or drop open_page")


def test_tool_backends_build_the_page_backend_of_live_and_replayed_search_backends():
    retriever = mock_backend("retriever", lambda request: httpx.Response(500))
    assert isinstance(tool_backends(("open_page", "search"), retriever)["open_page"], RetrieverPageBackend)
    spec = next(spec for spec, backend in PAGE_CASES if backend == "wikipedia")
    replayed = open_replay_backend("wikipedia", spec.cassette_path("wikipedia"))
    assert isinstance(replayed, ReplayBackend)
    pages = tool_backends(("search", "open_page"), replayed)["open_page"]
    assert isinstance(pages, WikipediaPageBackend) and pages._client is replayed.backend._client
    assert tool_backends(("search",), replayed) == {}
    deepseek = mock_backend("deepseek", lambda request: httpx.Response(500))
    with pytest.raises(ServiceSetupError, match="no page backend for the deepseek search backend"):
        tool_backends(("search", "open_page"), deepseek)


def test_a_page_backends_statistics_window_stays_bounded_though_no_step_drains_it():
    stats = RecentSearchStats("wikipedia-pages", limit=5)
    for n in range(100):
        stats.record(CallRecord(ok=n % 2 == 0, origin="network"))
        assert len(stats._records) < 10
    assert 5 <= stats.peek()["search/requests"] < 10
    assert isinstance(page_backend_for(mock_backend("wikipedia", lambda request: httpx.Response(500))).stats,
                      RecentSearchStats)
