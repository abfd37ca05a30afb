"""Who may call our servers: loopback is the only place a server may listen without a key unless
its owner says anyone may call it, and the guard lets a request through exactly when it sends the
key, answering every other with the same 401 that never quotes what was sent."""

from __future__ import annotations

import asyncio
import ipaddress
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from searchr1.core.errors import UsageError
from searchr1.runtime.api_key import (MIN_KEY_CHARS, ApiKeyGuard, check_key_text, is_loopback, presented_key,
                                      required_key, unauthorized_body)
from searchr1.basics.secrets import Secret, secret_forms

keys = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=MIN_KEY_CHARS, max_size=40)
hosts = (st.ip_addresses().map(str) | st.text(max_size=30)
         | st.sampled_from(["localhost", "LOCALHOST", "[::1]", "0.0.0.0", "::", "", "example.org", "127.1"]))


def loopback_by_definition(host: str) -> bool:
    """127.0.0.0/8, ::1 or the name localhost, read independently of the code under test."""
    if host.strip().lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False
    if address.version == 4:
        return address in ipaddress.ip_network("127.0.0.0/8")
    return int(address) == 1


@given(host=hosts)
@example(host="127.255.0.1")
@example(host="128.0.0.1")
@example(host="::ffff:127.0.0.1")
def test_only_loopback_hosts_serve_without_a_key_unless_anyone_is_allowed(host):
    assert is_loopback(host) == loopback_by_definition(host)
    assert required_key(host, None, True) is None
    key = Secret("k" * MIN_KEY_CHARS)
    assert required_key(host, key, False) is key
    if loopback_by_definition(host):
        assert required_key(host, None, False) is None
        return
    with pytest.raises(UsageError) as refused:
        required_key(host, None, False)
    message = str(refused.value)
    assert refused.value.exit_code == 2 and "\n" not in message
    assert "--api-key" in message and "--allow-anyone" in message


def test_a_key_and_allow_anyone_together_are_refused():
    with pytest.raises(UsageError, match="--allow-anyone"):
        required_key("0.0.0.0", Secret("k" * MIN_KEY_CHARS), True)


@given(value=st.text(max_size=40) | keys)
def test_a_key_is_taken_when_it_can_travel_in_a_header_and_the_refusal_never_quotes_it(value):
    problem = check_key_text(value)
    fits = len(value) >= MIN_KEY_CHARS and all(0x21 <= ord(c) <= 0x7E for c in value)
    assert (problem is None) == fits
    if problem is not None and len(value) >= 4:
        assert value not in problem


def call(key: Secret, headers: list[tuple[bytes, bytes]], path: str = "/v1/chat/completions"):
    """``(whether the app behind the guard was reached, status, body, headers)`` of one request."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}
    asyncio.run(ApiKeyGuard(app, key)(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return bool(reached), sent[0]["status"], body, dict(sent[0]["headers"])


header_values = st.binary(max_size=60) | keys.map(lambda k: k.encode()) | st.builds(
    lambda scheme, token, space: scheme + b" " * space + token,
    st.sampled_from([b"Bearer", b"bearer", b"BEARER", b"Basic", b"Token"]),
    st.binary(max_size=40) | keys.map(str.encode), st.integers(1, 2))


@given(key=keys, value=header_values, name=st.sampled_from([b"authorization", b"x-api-key"]))
def test_a_request_reaches_the_server_exactly_when_it_sends_the_key(key, value, name):
    """Whatever is sent, the app behind the guard is reached iff the request carries
    ``Authorization: Bearer <key>``; every other request gets the one 401 (OpenAI's shape,
    ``WWW-Authenticate: Bearer``, the connection closed), which quotes nothing that was sent."""
    reached, status, body, headers = call(Secret(key), [(name, value)])
    scheme, _, token = value.strip().partition(b" ")
    sends_key = name == b"authorization" and scheme.lower() == b"bearer" and token.strip() == key.encode()
    assert reached == sends_key
    if sends_key:
        assert status == 200
        return
    error = json.loads(body)["error"]
    assert status == 401 and headers[b"www-authenticate"] == b"Bearer" and headers[b"connection"] == b"close"
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key" and error["param"] is None
    assert json.loads(body) in (unauthorized_body(None), unauthorized_body(b"any")), "it depends on what was sent"
    assert not any(form in body.decode() for form in secret_forms(key))


def test_the_key_right_and_the_health_check_open_and_the_guard_shows_no_key():
    key = Secret("right-key-0123456789")
    assert call(key, [(b"authorization", b"Bearer right-key-0123456789")])[:2] == (True, 200)
    assert call(key, [(b"Authorization", b"bearer   right-key-0123456789 ")])[:2] == (True, 200)
    assert call(key, [])[:2] == (False, 401)
    assert call(key, [(b"authorization", b"Bearer right-key-012345678")])[:2] == (False, 401)
    assert call(key, [], path="/healthz")[:2] == (True, 200)
    assert presented_key([(b"authorization", b"Basic abc")]) is None
    assert "right-key" not in repr(ApiKeyGuard(lambda *a: None, key)) + repr(vars(ApiKeyGuard(lambda *a: None, key)))
