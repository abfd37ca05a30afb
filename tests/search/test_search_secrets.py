"""Keys never leak: not into results, observations, logs, exceptions, reprs or cassettes."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle

import httpx
import pytest
from click.testing import CliRunner

from searchr1.search.base import SearchRefusedError
from searchr1.search.env import MissingApiKeyError
from searchr1.search.factory import create_search_backend
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.recording import SecretLeakError, recording
from searchr1.basics.secrets import Secret, redact, sanitise_error
from searchr1.search.testing import mock_backend
from searchr1.core.observation.text import format_observation

DEEPSEEK_KEY = "sk-CANARYdeepseek0123456789abcdef"
ZHIHU_KEYS = ("zh-CANARY-key-one-7f3a", "zh-CANARY-key-two-9b1c")
RETRIEVER_KEY = "rt-CANARY-retriever-key-4e2d"
CANARIES = (DEEPSEEK_KEY, *ZHIHU_KEYS, RETRIEVER_KEY)
GOOD = {"results": [{"title": "Good", "text": "good text"}]}


def key_options(name):
    if name == "deepseek":
        return {"api_key": DEEPSEEK_KEY}
    if name == "zhihu":
        return {"keys": ZHIHU_KEYS}
    if name == "retriever":
        return {"api_key": RETRIEVER_KEY}
    return {}


def echo_key(request: httpx.Request) -> str:
    return request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix(
        "Bearer "
    )


def scenarios(name):
    """Handlers for success and failure paths, several of which echo the key back."""
    fake = FakeSearchService(name, {})

    def ok(request):
        return fake.render(GOOD, request, "q")

    def echo_in_error_body(request):
        return httpx.Response(401, json={"error": {"message": f"invalid key {echo_key(request)}"}})

    def echo_in_sse_error(request):
        body = (
            "event: error\ndata: "
            + json.dumps(
                {
                    "type": "error",
                    "error": {"type": "authentication_error", "message": f"bad key {echo_key(request)}"},
                }
            )
            + "\n\n"
        )
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    def echo_in_json_error(request):
        return httpx.Response(
            200,
            json={
                "Code": 20001,
                "Message": f"auth failed for {echo_key(request)}",
                "error": {"code": echo_key(request) or "x", "info": echo_key(request)},
                "result": echo_key(request),
            },
        )

    def rate_limited(request):
        return httpx.Response(429, headers={"Retry-After": "1", "X-Echo": echo_key(request)})

    def server_error(request):
        return httpx.Response(500, text=f"trace: token={echo_key(request)}")

    def timeout(request):
        raise httpx.ReadTimeout(f"timed out talking with key {echo_key(request)}")

    return [
        ok,
        echo_in_error_body,
        echo_in_sse_error,
        echo_in_json_error,
        rate_limited,
        server_error,
        timeout,
    ]


def assert_clean(text: str):
    for canary in CANARIES:
        assert canary not in text, f"a key leaked into: {text[:200]!r}"


@pytest.mark.parametrize("name", ["deepseek", "zhihu", "wikipedia", "retriever"])
def test_no_key_in_results_observations_logs_or_reprs(name, caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for handler in scenarios(name):
        backend = mock_backend(name, handler, max_retries=1, **key_options(name))
        seen.append(repr(backend))

        async def run(backend=backend):
            async with backend:
                return await backend.search("The Little Prince author")

        try:
            result = asyncio.run(run())
        except SearchRefusedError as refused:  # the retriever's 401: the run stops with this line
            seen.append(str(refused))
            continue
        seen += [repr(result), str(result), format_observation(result), repr(backend.stats.drain())]
        if name == "zhihu":
            seen.append(repr(backend.pool))
    seen.append(caplog.text)
    seen += [record.getMessage() for record in caplog.records]
    for text in seen:
        assert_clean(text)


def test_the_canaries_do_reach_the_wire(caplog):
    """Guard for the test above: the keys are really used, so their absence means something."""
    sent = []

    def capture(request):
        sent.append(echo_key(request))
        return httpx.Response(500)

    for name in ("deepseek", "zhihu", "retriever"):
        asyncio.run(mock_backend(name, capture, max_retries=0, **key_options(name)).search("q"))
    assert sent == [DEEPSEEK_KEY, ZHIHU_KEYS[0], RETRIEVER_KEY]


def test_secret_never_prints_itself():
    secret = Secret(DEEPSEEK_KEY)
    for text in (repr(secret), str(secret), f"{secret}", repr([secret]), repr({"k": secret})):
        assert_clean(text)
    assert secret.reveal() == DEEPSEEK_KEY and len(secret.fingerprint()) == 8
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(secret)


def test_sanitise_error_masks_known_and_credential_looking_values():
    text = f"failed: Authorization: Bearer {ZHIHU_KEYS[0]} and api_key={DEEPSEEK_KEY} and sk-abcdef123456"
    cleaned = sanitise_error(text, [Secret(ZHIHU_KEYS[0])])
    assert_clean(cleaned)
    assert "sk-abcdef123456" not in cleaned and "[redacted]" in cleaned
    assert redact("nothing secret here") == "nothing secret here"


def test_missing_key_error_names_variable_and_file_without_values(tmp_path, monkeypatch):
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", ZHIHU_KEYS[0])
    env_file = tmp_path / "custom.env"
    with pytest.raises(MissingApiKeyError) as caught:
        create_search_backend("deepseek", env_file=env_file)
    message = str(caught.value)
    assert "DEEPSEEK_API_KEY" in message and str(env_file) in message
    assert_clean(message)


@pytest.mark.parametrize("name", ["deepseek", "zhihu"])
async def test_recorded_cassette_holds_no_key_even_when_the_server_echoes_it(name, tmp_path):
    fake = FakeSearchService(name, {})

    def echoing(request):
        response = fake.render(GOOD, request, "q")
        echoed = response.content.replace(b"good text", f"good text for {echo_key(request)}".encode())
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return httpx.Response(
            200,
            headers={**headers, "x-echo": echo_key(request), "set-cookie": f"s={echo_key(request)}"},
            content=echoed,
        )

    backend = mock_backend(name, echoing, **key_options(name))
    target = tmp_path / "echo.yaml"
    async with backend:
        with recording(target, secrets=backend.secrets(), metadata={"backend": name}):
            result = await backend.search("The Little Prince author")
    assert result.ok
    text = target.read_text()
    assert_clean(text)
    assert "<SECRET_1>" in text  # the echo was replaced, not dropped silently
    assert "set-cookie" not in text.lower()


def test_a_key_that_escapes_scrubbing_blocks_the_write(tmp_path):
    """filter_sensitive_data replaces every form of a key in text; a copy inside a body kept
    compressed is out of its reach and is caught by the final scan."""
    import gzip

    secret = Secret("leak/canary+1 x")
    target = tmp_path / "leak.yaml"
    target.write_text("previous cassette\n")

    def handler(request):
        body = gzip.compress(json.dumps({"echo": secret.reveal()}).encode())
        return httpx.Response(200, content=body, headers={"content-encoding": "gzip"})

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with recording(target, secrets=[secret], metadata={}, overwrite=True, decode_compressed=False):
                await client.get("https://example.invalid/search", params={"q": "harmless"})

    with pytest.raises(SecretLeakError) as caught:
        asyncio.run(run())
    assert secret.reveal() not in str(caught.value)
    assert target.read_text() == "previous cassette\n"
    assert list(tmp_path.iterdir()) == [target]


def test_record_command_output_and_cassette_are_clean(tmp_path, monkeypatch):
    import searchr1.commands.record as record_module
    from searchr1.cli import main

    fake = FakeSearchService("zhihu", {"The Little Prince author": [{"code": 30001}, GOOD]})
    real_factory = record_module.create_search_backend

    def factory(name, **kwargs):
        return real_factory(name, transport=httpx.MockTransport(fake.handler), **kwargs)

    monkeypatch.setattr(record_module, "create_search_backend", factory)
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", ",".join(ZHIHU_KEYS))
    target = tmp_path / "zhihu.yaml"
    outcome = CliRunner().invoke(
        main,
        ["record", "--backend", "zhihu", "--query", "The Little Prince author", "--cassette", str(target)],
    )
    assert outcome.exit_code == 0, outcome.output
    assert_clean(outcome.output)
    assert_clean(target.read_text())
    assert "provenance: live" in target.read_text()
