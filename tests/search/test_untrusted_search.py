"""Search results are outside text: whatever a page or a cassette holds, what a backend returns
is valid Unicode, a stream cannot grow without bound, and known keys never reach the model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import searchr1.commands.record as record_module
from searchr1.cli import main
from searchr1.search.base import ResponseTooLarge
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.replay import open_replay_backend
from searchr1.search.sse import EventReader
from searchr1.search.testing import TEST_DEEPSEEK_KEY, mock_backend
from searchr1.core.observation.text import format_observation
from searchr1.basics.unicode import valid_text, valid_tree

BACKENDS = ["wikipedia", "zhihu", "deepseek", "retriever"]
MARK = "LONE-SURROGATE-HERE"
QUERY = "Who wrote Le Petit Prince"


def hostile(backend: str, text: str = f"A novella {MARK} by Saint-Exupery.", title: str = f"Le {MARK} Prince"):
    """A handler serving the fake service's answer with every MARK turned into the JSON
    escape of a lone surrogate (valid JSON that decodes to an unencodable str)."""
    fake = FakeSearchService(backend, {QUERY: [{"results": [{"title": title, "text": text}]}]})

    def handler(request: httpx.Request) -> httpx.Response:
        response = fake.handler(request)
        body = response.content.replace(MARK.encode(), b"\\ud800 and \\udfff")
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return httpx.Response(response.status_code, headers=headers, content=body)

    return handler


def search(backend, query=QUERY):
    async def run():
        async with backend:
            return await backend.search(query)

    return asyncio.run(run())


def assert_encodable(result):
    text = format_observation(result) + repr(result)
    text.encode("utf-8")  # raises on a lone surrogate
    return text


@pytest.mark.parametrize("name", BACKENDS)
def test_a_lone_surrogate_in_a_search_result_becomes_a_replacement_character(name):
    result = search(mock_backend(name, hostile(name)))
    assert result.ok and result.items
    text = assert_encodable(result)
    assert "\ufffd and \ufffd" in text and "Saint-Exupery" in text


@pytest.mark.parametrize("name", BACKENDS)
def test_a_hostile_recorded_cassette_replays_as_valid_unicode(tmp_path, monkeypatch, name):
    real_factory = record_module.create_search_backend
    monkeypatch.setattr(record_module, "create_search_backend",
                        lambda backend, **kw: real_factory(backend, transport=httpx.MockTransport(hostile(backend)), **kw))
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-live-deepseek-key-for-tests")
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", "zhihu-live-key-for-tests")
    cassette = tmp_path / f"{name}.yaml"
    recorded = CliRunner().invoke(main, ["record", "--backend", name, "--query", QUERY, "--cassette", str(cassette)])
    assert recorded.exit_code == 0, recorded.output
    assert "\\ud800" in cassette.read_text(encoding="utf-8").replace("\\\\", "\\")

    async def run():
        async with open_replay_backend(name, cassette) as backend:
            return await backend.search(QUERY)

    result = asyncio.run(run())
    assert result.ok and "\ufffd" in assert_encodable(result)


def test_error_texts_from_the_service_are_valid_unicode_too():
    def handler(request):
        event = b'data: {"type": "error", "error": {"type": "overloaded\\ud800", "message": "busy \\udc00 now"}}\n\n'
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=event)

    result = search(mock_backend("deepseek", handler))
    assert not result.ok and "busy \ufffd now" in result.error
    assert_encodable(result)


@given(st.lists(st.one_of(st.text(max_size=8), st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))).map("".join))
def test_valid_text_is_always_utf8_encodable_and_keeps_valid_text_unchanged(text):
    cleaned = valid_text(text)
    cleaned.encode("utf-8")
    assert len(cleaned) == len(text)
    assert all(a == b or (0xD800 <= ord(a) <= 0xDFFF and b == "\ufffd") for a, b in zip(text, cleaned))


def test_valid_tree_cleans_keys_and_nested_values():
    cleaned = valid_tree(json.loads('{"\\ud800": ["a\\udfff", {"b": "\\ud83d\\ude00"}], "n": 1}'))
    assert cleaned == {"\ufffd": ["a\ufffd", {"b": "\U0001f600"}], "n": 1}


# ------------------------------------------------------------------------- the DeepSeek stream


def test_one_event_without_a_newline_is_cut_at_the_body_limit_not_buffered_whole():
    reader = EventReader(max_bytes=10_000, max_line_bytes=10_000_000)
    reader.feed(b"data: " + b"x" * 9_000)
    with pytest.raises(ResponseTooLarge):
        reader.feed(b"x" * 2_000)


def test_a_line_longer_than_the_line_limit_is_refused():
    reader = EventReader(max_bytes=10_000_000, max_line_bytes=1_000)
    reader.feed(b"data: ok\n\n")
    with pytest.raises(ResponseTooLarge):  # LineTooLong is a ResponseTooLarge
        for _ in range(20):
            reader.feed(b"y" * 100)


@given(st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=3, max_size=3), st.integers(1, 7))
def test_events_are_the_same_however_the_bytes_are_split(newlines, size):
    a, b, c = newlines
    raw = f": ping{a}data: {{\"x\": 1}}{b}data: two{c}{c}data: tail".encode()
    whole = EventReader(max_bytes=1000, max_line_bytes=1000)
    expected = whole.feed(raw) + whole.close()
    pieces = EventReader(max_bytes=1000, max_line_bytes=1000)
    got = [e for i in range(0, len(raw), size) for e in pieces.feed(raw[i : i + size])] + pieces.close()
    assert got == expected
    assert got[0].startswith('{"x": 1}')  # the unterminated last event is dropped


def test_a_deepseek_stream_of_one_endless_event_fails_the_search_with_a_short_error():
    def handler(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=b"data: " + b"z" * 300_000)

    result = search(mock_backend("deepseek", handler, max_line_bytes=100_000))
    assert not result.ok and "line too long" in result.error
    result = search(mock_backend("deepseek", handler, max_body_bytes=200_000))
    assert not result.ok and "too large" in result.error


# ------------------------------------------------------------------------- keys in results


def test_a_result_that_echoes_the_key_never_shows_it_to_the_model():
    fake = FakeSearchService("deepseek", {QUERY: [{"results": [
        {"title": f"Echo {TEST_DEEPSEEK_KEY}", "text": f"your key is {TEST_DEEPSEEK_KEY} indeed"}]}]})
    result = search(mock_backend("deepseek", fake.handler))
    assert result.ok
    text = format_observation(result)
    assert TEST_DEEPSEEK_KEY not in text and "indeed" in text


# ------------------------------------------------------------------------- recording


def test_a_recording_never_follows_a_symlink_planted_under_its_temporary_name(tmp_path, monkeypatch):
    import os

    import searchr1.search.recording as recording_module

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    monkeypatch.setattr(recording_module, "token_hex", lambda _n: "guessed", raising=False)
    target = tmp_path / "c.yaml"
    for name in (f".c.yaml.{os.getpid()}.recording", f".c.yaml.{os.getpid()}-guessed.recording"):
        (tmp_path / name).symlink_to(victim)  # the old predictable name, and the new one if guessed
    unpatched = (httpx.MockTransport.handle_request, httpx.AsyncHTTPTransport.handle_async_request)
    with pytest.raises(FileExistsError):
        with recording_module.recording(target, secrets=[], metadata={"backend": "retriever"}):
            with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))) as client:
                client.get("http://retriever.invalid/x")
    assert victim.read_text() == "keep me" and not target.exists()
    # and the failed recording took vcrpy's patches away with it
    assert (httpx.MockTransport.handle_request, httpx.AsyncHTTPTransport.handle_async_request) == unpatched


# ------------------------------------------------------------------------- dependencies


def test_the_declared_pyarrow_excludes_the_release_with_the_parquet_deserialisation_flaw():
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = {Requirement(text).name: Requirement(text) for text in project["dependencies"]}
    assert not requirements["pyarrow"].specifier.contains("14.0.0")  # CVE-2023-47248, fixed in 14.0.1
    assert requirements["pyarrow"].specifier.contains("14.0.1")
    # trl (the chat template's source) stays undeclared: its requirements pull torch; the
    # project documents the --no-deps install instead, and names it in the tokenizer's error.
    assert "trl" not in requirements
    assert "pip install --no-deps trl==1.16.0" in (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
