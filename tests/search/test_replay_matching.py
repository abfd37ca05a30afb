"""Replay answers each request with what vcrpy's own matching picks, however often the request is
asked: the replay cassette remembers which recorded interactions a request matches, and that
memory must never change an answer."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vcr.matchers import requests_match
from vcr.request import Request

from searchr1.search.replay import MATCH_ON, load_cassette

CASSETTES = Path(__file__).resolve().parents[2] / "cassettes"
BACKENDS = sorted(path.parent.name for path in CASSETTES.glob("*/offline.yaml"))


@functools.cache
def loaded(backend: str):
    """The backend's offline cassette, loaded once when first drawn (not at collection), and kept
    across examples so that what it remembers is put to the test."""
    return load_cassette(CASSETTES / backend / "offline.yaml")


def vcrpy_matches(cassette, request: Request) -> list[int]:
    """The recorded interactions vcrpy's matchers accept, compared one by one."""
    return [index for index, (stored, _) in enumerate(cassette.data) if requests_match(request, stored, MATCH_ON)]


def changed(stored: Request, how: str, text: str) -> Request:
    """A request like a recorded one, its body, query or method changed (or not)."""
    body, uri, method = stored.body, stored.uri, stored.method
    if how == "body" and body is not None:
        body = body.replace(b'"', b"'", 1) + text.encode()
    elif how == "query":
        uri = uri + ("&" if "?" in uri else "?") + "extra=" + text
    elif how == "method":
        method = "PUT"
    return Request(method, uri, body, dict(stored.headers))


@pytest.mark.slow  # parses the offline cassettes and matches 60 requests (a second)
@settings(max_examples=60)
@given(backend=st.sampled_from(BACKENDS), data=st.data(),
       how=st.sampled_from(["same", "body", "query", "method"]), text=st.text("abc ", max_size=3), asks=st.integers(1, 3))
def test_a_request_matches_what_vcrpy_matches_however_often_it_is_asked(backend, data, how, text, asks):
    cassette = loaded(backend)
    stored = cassette.data[data.draw(st.integers(0, len(cassette.data) - 1))][0]
    assert [index for index, _ in cassette._responses(stored)] == vcrpy_matches(cassette, stored)  # remembered
    request = changed(stored, how, text)
    expected = vcrpy_matches(cassette, request)
    for _ in range(asks):  # the first answer is worked out, the others remembered
        assert [index for index, _ in cassette._responses(request)] == expected
    assert (request in cassette) == bool(expected)
    if how == "same":
        assert expected  # a recorded request always finds itself
