"""The access line of a request: method, path, status and milliseconds on one line, whatever the
client put in the path, and never the server's key in any of its encodings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from urllib.parse import unquote

from hypothesis import example, given
from hypothesis import strategies as st

from searchr1.runtime.api_key import MIN_KEY_CHARS
from searchr1.basics.secrets import Secret, secret_forms
from searchr1.serve.access_log import ACCESS_LOGGER, MAX_PATH_CHARS, AccessLog, access_line

keys = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=MIN_KEY_CHARS, max_size=30)
LINE = re.compile(r"([!-~]+) ([!-~]+) (\d{3}|-) (\d+\.\d) ms")


@given(key=keys, before=st.text(max_size=30), after=st.text(max_size=30), data=st.data())
@example(key="a'<bcdefghijklmno", before="/", after="", data=None)
@example(key="3Cdefghijklmnopq", before="/<", after="", data=None)
def test_a_path_that_holds_the_key_in_any_encoding_is_logged_without_it(key, before, after, data):
    """Whatever a client puts around the key (or any encoding of it: URL-quoted, JSON-escaped,
    base64) in a path, the line is one line of printable ASCII in the shape
    ``METHOD PATH STATUS N.N ms`` that holds no encoding of the key, nor does its path decoded."""
    forms = sorted(secret_forms(key))
    form = data.draw(st.sampled_from(forms)) if data is not None else key
    line = access_line("POST", before + form + after + form, 401, 0.0123, (Secret(key),))
    match = LINE.fullmatch(line)
    assert match, line
    assert match.group(1) == "POST" and match.group(3) == "401" and match.group(4) == "12.3"
    assert len(match.group(2)) <= MAX_PATH_CHARS
    assert not any(known in written for written in (line, unquote(line)) for known in forms)


@given(path=st.text(max_size=300), method=st.text(max_size=20))
def test_any_path_and_method_make_one_line_of_the_same_shape(path, method):
    line = access_line(method, path, None, 1.5)
    assert LINE.fullmatch(line), line
    assert line.endswith(" - 1500.0 ms")


def test_an_ordinary_path_is_logged_as_sent():
    assert access_line("GET", "/v1/models", 200, 0.0004) == "GET /v1/models 200 0.4 ms"


def run(app, caplog) -> list[str]:
    """The access lines of one request to ``app`` behind :class:`AccessLog` (what ``app`` raises
    is raised on)."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b""}
    with contextlib.suppress(RuntimeError):
        asyncio.run(AccessLog(app)(scope, receive, send))
    return [record.getMessage() for record in caplog.records if record.name == ACCESS_LOGGER]


async def answering(scope, receive, send):
    await send({"type": "http.response.start", "status": 422, "headers": []})
    await send({"type": "http.response.body", "body": b'{"secret body": 1}'})


async def failing(scope, receive, send):
    raise RuntimeError("a bug")


def test_the_line_says_the_status_sent_or_500_for_a_request_that_failed(caplog):
    (line,) = run(answering, caplog)
    assert line.startswith("POST /v1/chat/completions 422 ") and "secret body" not in line
    caplog.clear()
    (line,) = run(failing, caplog)
    assert line.startswith("POST /v1/chat/completions 500 ")
