"""`record` round-trips: a recorded cassette replays by backend name and path alone, a miss
says what to do for that kind of cassette, failures are never silently kept, personal data is
scrubbed, and a file that is not a cassette is named as such. The shipped cassettes cover the
variants the real services send."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import yaml
from click.testing import CliRunner

import searchr1.commands.record as record_module
from searchr1.cli import main
from searchr1.search.cassette_specs import CASSETTE_ROOT
from searchr1.search.options import SearchOptions, build_search_backend
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.replay import CassetteFormatError, CassetteMissError, open_replay_backend
from searchr1.search.wikipedia import CONTACT_PLACEHOLDER

HIT = [{"results": [{"title": "Le Petit Prince", "text": "A novella by Antoine de Saint-Exupéry, published in 1943."}]}]


@pytest.fixture
def live(monkeypatch):
    """`record` against an in-process fake of the service instead of the network."""

    real_factory = record_module.create_search_backend

    def serve(backend: str, script: dict):
        fake = FakeSearchService(backend, script)

        def factory(name, **kwargs):
            return real_factory(name, transport=httpx.MockTransport(fake.handler), **kwargs)

        monkeypatch.setattr(record_module, "create_search_backend", factory)
        return fake

    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-live-deepseek-key-for-tests")
    monkeypatch.delenv("SEARCHR1_CONTACT", raising=False)
    monkeypatch.delenv("SEARCHR1_RETRIEVER_URL", raising=False)
    return serve


def record(*args):
    return CliRunner().invoke(main, ["record", *args])


def replay(name, path, *queries, **options):
    async def run():
        async with open_replay_backend(name, path, **options) as backend:
            return [await backend.search(q) for q in queries]

    return asyncio.run(run())


def test_a_cassette_recorded_with_a_retriever_url_replays_by_name_and_path_alone(tmp_path, live):
    live("retriever", {"The Little Prince author": HIT})
    target = tmp_path / "gpu-box.yaml"
    outcome = record(
        "--backend", "retriever", "--retriever-url", "http://gpu-box:9000/retrieve",
        "--query", "The Little Prince author", "--cassette", str(target),
    )
    assert outcome.exit_code == 0, outcome.output
    (result,) = replay("retriever", target, "The Little Prince author")
    assert result.ok and [i.title for i in result.items] == ["Le Petit Prince"]
    # The same through the command-line flags: --cassette alone.
    backend = build_search_backend(SearchOptions(backend="retriever", cassette=target))
    assert backend.backend.url == "http://gpu-box:9000/retrieve"


def test_a_deepseek_cassette_remembers_its_model_and_tool_type(tmp_path, live):
    live("deepseek", {"The Little Prince author": HIT})
    target = tmp_path / "flash.yaml"
    outcome = record(
        "--backend", "deepseek", "--search-model", "deepseek-flash", "--search-tool-type", "deepseek_web_search",
        "--query", "The Little Prince author", "--cassette", str(target),
    )
    assert outcome.exit_code == 0, outcome.output
    (result,) = replay("deepseek", target, "The Little Prince author")
    assert result.ok and [i.title for i in result.items] == ["Le Petit Prince"]


def test_a_miss_in_a_live_cassette_says_to_record_again_not_to_edit_a_spec(tmp_path, live):
    live("retriever", {"The Little Prince author": HIT})
    target = tmp_path / "live.yaml"
    assert record("--backend", "retriever", "--query", "The Little Prince author", "--cassette", str(target)).exit_code == 0
    with pytest.raises(CassetteMissError) as caught:
        replay("retriever", target, "Who wrote Hamlet")
    message = str(caught.value)
    assert "Who wrote Hamlet" in message and "searchr1 record --backend retriever" in message and "--overwrite" in message
    assert "spec" not in message and "cassettes build" not in message


def test_a_miss_with_other_settings_says_the_query_is_there_under_other_settings(tmp_path, live):
    live("retriever", {"The Little Prince author": HIT})
    target = tmp_path / "live.yaml"
    outcome = record(
        "--backend", "retriever", "--retriever-url", "http://gpu-box:9000/retrieve",
        "--query", "The Little Prince author", "--cassette", str(target),
    )
    assert outcome.exit_code == 0
    with pytest.raises(CassetteMissError) as caught:
        replay("retriever", target, "The Little Prince author", url="http://other-box:9000/retrieve")
    message = str(caught.value)
    assert "other request settings" in message and "host" in message and "gpu-box:9000" in message


def test_a_miss_in_a_generated_cassette_names_its_spec():
    with pytest.raises(CassetteMissError) as caught:
        replay("zhihu", CASSETTE_ROOT / "zhihu" / "demo.yaml", "a question nobody recorded")
    assert "cassettes/specs/demo.json" in str(caught.value) and "cassettes build" in str(caught.value)


def test_record_exits_nonzero_and_writes_nothing_when_every_request_fails(tmp_path, live):
    live("retriever", {"q one": [{"status": 400}], "q two": [{"status": 422}]})
    target = tmp_path / "down.yaml"
    outcome = record("--backend", "retriever", "--query", "q one", "--query", "q two", "--cassette", str(target))
    assert outcome.exit_code != 0 and "every one of the 2 queries failed" in outcome.output
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_partial_failures_are_recorded_only_with_allow_failures(tmp_path, live):
    script = {"The Little Prince author": HIT, "broken": [{"status": 400}]}
    live("retriever", script)
    target = tmp_path / "partial.yaml"
    args = ["--backend", "retriever", "--query", "The Little Prince author", "--query", "broken", "--cassette", str(target)]
    refused = record(*args)
    assert refused.exit_code != 0 and "--allow-failures" in refused.output and not target.exists()

    live("retriever", {"The Little Prince author": HIT, "broken": [{"status": 400}]})
    kept = record(*args, "--allow-failures")
    assert kept.exit_code == 0, kept.output
    metadata = yaml.safe_load(target.read_text())["metadata"]
    assert metadata["failed_queries"] == ["broken"]
    ok, failed = replay("retriever", target, "The Little Prince author", "broken")
    assert ok.ok and not failed.ok and failed.status == 400


def test_record_scrubs_the_wikipedia_contact_like_a_key(tmp_path, live):
    fake = live("wikipedia", {"The Little Prince author": HIT})
    target = tmp_path / "wiki.yaml"
    outcome = record(
        "--backend", "wikipedia", "--wikipedia-contact", "jane.doe@example.org",
        "--query", "The Little Prince author", "--cassette", str(target),
    )
    assert outcome.exit_code == 0, outcome.output
    assert "jane.doe@example.org" in fake.requests[0].headers["user-agent"]  # sent to Wikimedia
    text = target.read_text()
    assert "jane.doe" not in text and CONTACT_PLACEHOLDER in text
    (result,) = replay("wikipedia", target, "The Little Prince author")
    assert result.ok


def test_record_stops_on_a_wikipedia_refusal_naming_searchr1_contact(tmp_path, live):
    live("wikipedia", {"The Little Prince author": [{"status": 403}]})
    target = tmp_path / "refused.yaml"
    outcome = record("--backend", "wikipedia", "--query", "The Little Prince author", "--cassette", str(target))
    assert outcome.exit_code != 0 and "SEARCHR1_CONTACT" in outcome.output and "Traceback" not in outcome.output
    assert not target.exists()


# ----------------------------------------------------------------------------- not a cassette

GARBAGE = {
    "binary.yaml": bytes(range(256)) * 4,
    "prose.yaml": b"These are my notes about the search backends.\n",
    "broken.yaml": b"interactions:\n  - request: {method: GET\n",
    "list.yaml": b"[1, 2, 3]\n",
    "empty.yaml": b"",
    "no-interactions.yaml": b"version: 1\nmetadata: {backend: wikipedia}\n",
    "half.yaml": b"interactions:\n- request: {}\n  response: {}\nversion: 1\n",
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_a_file_that_is_not_a_cassette_is_named_as_such(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(GARBAGE[name])
    with pytest.raises(CassetteFormatError) as caught:
        open_replay_backend("wikipedia", path)
    message = str(caught.value)
    assert str(path) in message and "is not a search cassette" in message and "\n" not in message


def test_the_cassette_flag_given_a_garbage_file_fails_naming_it(tmp_path):
    path = tmp_path / "notes.yaml"
    path.write_text("my notes\n")
    with pytest.raises(CassetteFormatError, match="is not a search cassette"):
        build_search_backend(SearchOptions(backend="deepseek", cassette=path))


# ----------------------------------------------------------------------------- shipped variants


def interactions(backend, name):
    return yaml.load((CASSETTE_ROOT / backend / f"{name}.yaml").read_text(), Loader=yaml.SafeLoader)["interactions"]


def responses(backend):
    return [i["response"] for path in sorted((CASSETTE_ROOT / backend).glob("*.yaml")) for i in interactions(backend, path.stem)]


def body_text(response):
    import gzip

    body = response["body"]["string"]
    return gzip.decompress(body).decode() if isinstance(body, bytes) else body


def test_shipped_wikipedia_cassettes_cover_what_the_api_sends():
    answers = responses("wikipedia")
    headers = [{k.lower(): v for k, v in r["headers"].items()} for r in answers]
    assert any(h.get("content-encoding") == ["gzip"] and isinstance(r["body"]["string"], bytes) for h, r in zip(headers, answers))
    assert any("mediawiki-api-error" in h for h in headers)
    payloads = json_payloads("wikipedia")
    assert any(p.get("error", {}).get("code") == "maxlag" for p in payloads)
    pages = [p["query"]["pages"] for p in payloads if "query" in p]
    assert any(len(found) == 1 for found in pages) and any(len(found) > 3 for found in pages)
    assert any(any("extract" not in page for page in found) for found in pages)


def json_payloads(backend):
    out = []
    for response in responses(backend):
        try:
            out.append(json.loads(body_text(response)))
        except ValueError:
            continue  # HTML pages and the deliberately malformed bodies
    return out


def test_shipped_zhihu_cassettes_cover_null_lists_and_error_envelopes():
    payloads = json_payloads("zhihu")
    assert any(p.get("Code") == 0 and p.get("Data") is None for p in payloads)
    assert any(p.get("Code") == 0 and isinstance(p.get("Data"), dict) and p["Data"].get("Items", []) is None for p in payloads)
    codes = {p.get("Code") for p in payloads}
    assert {30001, 30002, 10001} <= codes


def test_shipped_deepseek_cassettes_cover_what_the_stream_sends():
    streams = [body_text(r) for r in responses("deepseek") if "event-stream" in str(r["headers"])]
    assert any("event: ping" in s for s in streams)
    assert any('"thinking_delta"' in s for s in streams)
    assert any('"citations_delta"' in s for s in streams)
    assert any("web_search_tool_result_error" in s for s in streams)
    assert any("message_stop" in s and "web_search_tool_result" not in s for s in streams)  # no search
    assert any(
        s.find('"type":"text"') != -1 and s.find('"type":"text"') < s.find("server_tool_use") for s in streams
    )  # text written before the search


def test_a_request_another_thread_sends_during_a_recording_stays_out_of_the_cassette(tmp_path):
    """vcrpy patches httpx for the whole process: a request another thread makes while a
    cassette records (a twin of another test shutting down, say) is sent, answered, and not
    recorded; the recording thread's requests are."""
    import threading

    from searchr1.search.recording import recording

    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"path": request.url.path}))
    answered = []
    with recording(tmp_path / "mine.yaml", secrets=[], metadata={}):
        httpx.Client(transport=transport).get("https://search.example/mine")
        other = threading.Thread(target=lambda: answered.append(
            httpx.Client(transport=transport).get("https://search.example/theirs").json()))
        other.start()
        other.join()
    recorded = yaml.safe_load((tmp_path / "mine.yaml").read_text("utf-8"))["interactions"]
    assert [interaction["request"]["uri"] for interaction in recorded] == ["https://search.example/mine"]
    assert answered == [{"path": "/theirs"}]
