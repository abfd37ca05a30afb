"""Credentials in URLs and personal values typed by the user stay private: no cassette, run
config, dashboard config or error line holds a URL's password or token or the Wikipedia
contact, and what is stored still replays."""

from __future__ import annotations

import asyncio
import json

import click
import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import searchr1.commands.record as record_module
from searchr1.cli import main
from searchr1.commands.train import _as_recorded, _resumed_search_options, _search_record
from searchr1.search.options import SearchOptions
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.replay import CassetteMissError, open_replay_backend
from searchr1.basics.secrets import Secret, redact, redact_url, sanitise_error

PASSWORD = "hunter2-pass"
TOKEN = "tok-0123456789abcdef"
URL = f"http://alice:{PASSWORD}@gpu-box:9000/retrieve?token={TOKEN}&topk=3"
CONTACT = "alice.private@example.org"
QUERY = "The Little Prince author"
HIT = [{"results": [{"title": "Le Petit Prince", "text": "A novella by Antoine de Saint-Exupery."}]}]


def assert_private(text: str) -> None:
    assert PASSWORD not in text and TOKEN not in text and CONTACT not in text


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    fake = FakeSearchService("retriever", {QUERY: HIT})
    real_factory = record_module.create_search_backend
    monkeypatch.setattr(record_module, "create_search_backend",
                        lambda name, **kw: real_factory(name, transport=httpx.MockTransport(fake.handler), **kw))
    monkeypatch.delenv("SEARCHR1_RETRIEVER_URL", raising=False)
    target = tmp_path / "secret-url.yaml"
    outcome = CliRunner().invoke(main, ["record", "--backend", "retriever", "--retriever-url", URL,
                                        "--query", QUERY, "--cassette", str(target)])
    assert outcome.exit_code == 0, outcome.output
    assert_private(outcome.output)
    return target


def test_a_recorded_url_keeps_neither_its_password_nor_its_token_and_still_replays(recorded):
    text = recorded.read_text(encoding="utf-8")
    assert_private(text)
    assert "gpu-box:9000/retrieve" in text and "topk=3" in text

    async def run():
        async with open_replay_backend("retriever", recorded) as backend:
            return await backend.search(QUERY)

    result = asyncio.run(run())
    assert result.ok and result.items[0].title == "Le Petit Prince"


def test_a_replay_miss_does_not_print_the_url_it_was_given(recorded):
    async def run():
        async with open_replay_backend("retriever", recorded, url=URL.replace("gpu-box", "other-box")) as backend:
            return await backend.search(QUERY)

    with pytest.raises(CassetteMissError) as caught:
        asyncio.run(run())
    assert "other-box" in str(caught.value)
    assert_private(str(caught.value))


def test_the_run_config_keeps_no_url_credential_and_no_contact():
    for options in (SearchOptions(backend="retriever", retriever_url=URL),
                    SearchOptions(backend="wikipedia", wikipedia_contact=CONTACT)):
        text = json.dumps(_search_record(options, offline=False))
        assert_private(text)
    record = _search_record(SearchOptions(backend="retriever", retriever_url=URL), offline=False)
    assert record["options"]["retriever_url"] == "http://gpu-box:9000/retrieve?topk=3"


def test_resuming_a_run_whose_url_had_credentials_asks_for_the_url_again():
    recorded = json.loads(json.dumps(_search_record(SearchOptions(backend="retriever", retriever_url=URL), offline=False)))
    blank = SearchOptions(backend="retriever")
    with pytest.raises(click.UsageError, match="--retriever-url"):
        _resumed_search_options(blank, recorded, explicit=set())
    again = _resumed_search_options(SearchOptions(backend="retriever", retriever_url=URL), recorded,
                                    explicit={"retriever_url"})
    assert again.retriever_url == URL


def test_giving_the_same_private_flags_again_on_resume_counts_as_unchanged():
    record = _search_record(SearchOptions(backend="wikipedia", retriever_url=URL, wikipedia_contact=CONTACT),
                            offline=False)["options"]
    assert _as_recorded("retriever_url", URL) == record["retriever_url"]
    assert _as_recorded("wikipedia_contact", CONTACT) == record["wikipedia_contact"]
    assert _as_recorded("retriever_url", URL.replace("gpu-box", "other-box")) != record["retriever_url"]


def test_a_resumed_run_takes_the_contact_from_the_flag_or_the_environment_never_the_placeholder():
    recorded = _search_record(SearchOptions(backend="wikipedia", wikipedia_contact=CONTACT), offline=False)
    assert _resumed_search_options(SearchOptions(backend="wikipedia"), recorded, explicit=set()).wikipedia_contact is None
    given = SearchOptions(backend="wikipedia", wikipedia_contact=CONTACT)
    assert _resumed_search_options(given, recorded, explicit={"wikipedia_contact"}).wikipedia_contact == CONTACT


@pytest.mark.parametrize("url", [
    "https://u:p4ssw0rd-x@host/a?x=1",
    "https://host/a?api_key=K3Y-VALUE-1&q=1",
    "https://host/a?access_token=K3Y-VALUE-1",
    "https://host/a?X-Api-Key=K3Y-VALUE-1",
    "https://host/a?sig=K3Y-VALUE-1&expires=1",
])
def test_redact_url_removes_userinfo_and_credential_parameters(url):
    cleaned = redact_url(url)
    assert "p4ssw0rd" not in cleaned and "K3Y-VALUE" not in cleaned
    assert httpx.URL(cleaned).host == "host"


@given(st.from_regex(r"https?://[a-z]{1,8}(:[0-9]{2,4})?/[a-z/]{0,10}(\?[a-z]{1,5}=[a-z0-9]{1,5})?", fullmatch=True))
def test_redact_url_leaves_a_url_without_credentials_exactly_as_it_was(url):
    assert redact_url(url) == url


KEY = "sk-Zx9/abc+def=GHI/jkl"


@pytest.mark.parametrize("form", [
    "Basic YWxpY2U6aHVudGVyMi1wYXNz",
    "access_token=abcdef0123",
    '{"api_key": "abcdef0123"}',
    "refresh_token: abcdef0123",
    "https://alice:hunter2-pass@host/x",
])
def test_credential_forms_are_scrubbed_from_error_texts_without_knowing_the_value(form):
    cleaned = sanitise_error(f"upstream said: {form} (try again)")
    assert "abcdef0123" not in cleaned and "hunter2" not in cleaned and "YWxpY2U6" not in cleaned
    assert cleaned.startswith("upstream said:") and "[redacted]" in cleaned


@pytest.mark.parametrize("encode", [
    lambda k: k,
    lambda k: __import__("urllib.parse").parse.quote(k),  # '/' kept
    lambda k: __import__("urllib.parse").parse.quote(k, safe=""),
    lambda k: __import__("urllib.parse").parse.quote_plus(k),
    lambda k: __import__("base64").b64encode(k.encode()).decode(),
    lambda k: json.dumps(k)[1:-1],
])
def test_a_known_key_is_masked_in_any_of_its_encodings(encode):
    text = f"echo: {encode(KEY)} end"
    assert redact(text, [Secret(KEY)]) != text
    assert encode(KEY).rstrip("=") not in redact(text, [Secret(KEY)])
