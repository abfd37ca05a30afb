"""Factory defaults, key resolution, CLI options, Zhihu key rotation and the quota command."""

from __future__ import annotations

import asyncio
import json

import click
import httpx
import pytest
from click.testing import CliRunner

from searchr1.commands.search_options import search_options
from searchr1.search.options import SearchOptions, build_search_backend
from searchr1.search.env import MissingApiKeyError, split_keys
from searchr1.search.factory import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT, create_search_backend
from searchr1.search.fake_service import FakeSearchService
from searchr1.search.replay import ReplayBackend
from searchr1.search.testing import mock_backend
from searchr1.search.tool import SearchBackend

GOOD = {"results": [{"title": "Good", "text": "good text"}]}
KEY_VARS = (
    "DEEPSEEK_API_KEY",
    "ZHIHU_SEARCH_KEYS",
    "ZHIHU_SEARCH_KEY",
    "ZHIHU_ACCESS_SECRET",
    "SEARCHR1_CONTACT",
    "SEARCHR1_RETRIEVER_URL",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in KEY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray ./.env


def test_documented_defaults():
    assert DEFAULT_CONCURRENCY == {"deepseek": 16, "wikipedia": 3, "zhihu": 1, "retriever": 32, "local": 64}
    assert DEFAULT_TIMEOUT == {"deepseek": 60.0, "wikipedia": 15.0, "zhihu": 15.0, "retriever": 30.0, "local": 30.0}
    for name, keys in [
        ("deepseek", {"api_key": "k"}),
        ("zhihu", {"keys": ["k"]}),
        ("wikipedia", {}),
        ("retriever", {}),
    ]:
        backend = create_search_backend(name, **keys)
        assert isinstance(backend, SearchBackend) and backend.name == name
        assert (backend.concurrency, backend.timeout) == (DEFAULT_CONCURRENCY[name], DEFAULT_TIMEOUT[name])
        assert create_search_backend(name, concurrency=5, timeout=2.5, **keys).concurrency == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"name": "bing"},
            "unknown search backend 'bing'; choose one of deepseek, wikipedia, zhihu, retriever, local",
        ),
        ({"name": "wikipedia", "concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"name": "wikipedia", "timeout": -1}, "timeout must be > 0"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        create_search_backend(**kwargs)


def test_unknown_option_names_the_option_and_the_backend():
    with pytest.raises(TypeError, match="'wikipedia' does not take option\\(s\\) model"):
        create_search_backend("wikipedia", model="deepseek-flash")


@pytest.mark.parametrize(
    ("name", "variable"), [("deepseek", "DEEPSEEK_API_KEY"), ("zhihu", "ZHIHU_SEARCH_KEYS")]
)
def test_missing_key_fails_at_construction(name, variable, tmp_path):
    with pytest.raises(MissingApiKeyError, match=variable) as caught:
        create_search_backend(name)
    assert str(tmp_path / ".env") in str(caught.value)


def test_keys_come_from_the_environment_before_the_env_file(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("ZHIHU_SEARCH_KEYS=file-a,file-b\nDEEPSEEK_API_KEY=file-deepseek\n")
    zhihu = create_search_backend("zhihu")
    assert [k.reveal() for k in zhihu.secrets()] == ["file-a", "file-b"]
    monkeypatch.setenv("DEEPSEEK_API_KEY", "env-deepseek")
    assert [k.reveal() for k in create_search_backend("deepseek").secrets()] == ["env-deepseek"]
    other = tmp_path / "other.env"
    other.write_text("ZHIHU_SEARCH_KEY=single\n")
    assert [k.reveal() for k in create_search_backend("zhihu", env_file=other).secrets()] == ["single"]


def test_env_file_is_not_loaded_into_the_process_environment(tmp_path):
    import os

    (tmp_path / ".env").write_text("DEEPSEEK_API_KEY=file-deepseek\n")
    create_search_backend("deepseek")
    assert "DEEPSEEK_API_KEY" not in os.environ


def test_split_keys_dedupes_in_order():
    assert split_keys("a, b\nc,a,, b") == ["a", "b", "c"]


def test_wikipedia_contact_and_retriever_url_from_the_environment(monkeypatch):
    monkeypatch.setenv("SEARCHR1_CONTACT", "ops@example.org")
    monkeypatch.setenv("SEARCHR1_RETRIEVER_URL", "http://gpu-box:9000/retrieve")
    assert "; ops@example.org)" in create_search_backend("wikipedia").headers["User-Agent"]
    assert create_search_backend("retriever").url == "http://gpu-box:9000/retrieve"
    assert create_search_backend("retriever", url="http://x/retrieve").url == "http://x/retrieve"


# ----------------------------------------------------------------------------- request shapes


def capture(name, **options):
    requests = []
    fake = FakeSearchService(name, {})

    def handler(request):
        requests.append(request)
        return fake.render(GOOD, request, "q")

    backend = mock_backend(name, handler, **options)
    result = asyncio.run(backend.search("  The Little   Prince author "))
    assert result.ok
    return requests[0]


def test_wikipedia_request():
    request = capture("wikipedia", contact="me@example.org")
    params = request.url.params
    assert params["gsrsearch"] == "The Little   Prince author"  # as typed, ends stripped
    assert "false" not in str(request.url).lower()
    assert "; me@example.org)" in request.headers["user-agent"] and params["maxlag"] == "5"


def test_deepseek_request_uses_the_configured_model_and_tool():
    request = capture("deepseek", model="deepseek-flash", tool_type="deepseek_web_search")
    body = json.loads(request.content)
    assert request.url == "https://api.deepseek.com/anthropic/v1/messages"
    assert body["model"] == "deepseek-flash" and body["tools"][0]["type"] == "deepseek_web_search"
    assert body["tools"][0]["max_uses"] == 1 and body["stream"] is True
    assert request.headers["x-api-key"] and "authorization" not in request.headers


def test_zhihu_request():
    request = capture("zhihu")
    assert request.url.path == "/api/v1/content/global_search"
    assert dict(request.url.params) == {"Query": "The Little   Prince author", "Count": "3", "SearchDB": "all"}
    assert (
        request.headers["authorization"].startswith("Bearer ")
        and request.headers["x-request-timestamp"].isdigit()
    )


def test_retriever_request():
    request = capture("retriever", url="http://127.0.0.1:8000/retrieve")
    assert json.loads(request.content) == {
        "queries": ["The Little   Prince author"],
        "topk": 3,
        "return_scores": True,
    }


# ----------------------------------------------------------------------------- Zhihu keys


class ZhihuScript:
    """Per-request scripted Zhihu answers; records which key each request used."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.keys = []
        self.fake = FakeSearchService("zhihu", {})

    def __call__(self, request):
        self.keys.append(request.headers["authorization"].removeprefix("Bearer "))
        answer = self.answers.pop(0) if self.answers else GOOD
        if isinstance(answer, int):
            return httpx.Response(answer, headers={"Retry-After": "3"})
        return self.fake.render(answer, request, "q")


def run_queries(backend, queries):
    async def run():
        async with backend:
            return [await backend.search(q) for q in queries]

    return asyncio.run(run())


def test_zhihu_keys_rotate_round_robin():
    script = ZhihuScript()
    backend = mock_backend("zhihu", script, keys=["k1", "k2", "k3"])
    run_queries(backend, [f"q{n}" for n in range(5)])
    assert script.keys == ["k1", "k2", "k3", "k1", "k2"]


def test_zhihu_rate_limit_cools_the_key_and_fails_over():
    script = ZhihuScript(429, {"code": 30001}, GOOD)
    backend = mock_backend("zhihu", script, keys=["k1", "k2", "k3"])
    (result,) = run_queries(backend, ["q"])
    assert result.ok and script.keys == ["k1", "k2", "k3"]
    metrics = backend.stats.drain()
    assert metrics["search/credential_failover_rate"] == 2.0 and metrics["search/429_rate"] == 1.0
    assert backend.clock.now() == 0.0  # failover does not wait


def test_zhihu_cooldown_honours_the_retry_hint():
    script = ZhihuScript(429)
    backend = mock_backend("zhihu", script, keys=["only"])
    (result,) = run_queries(backend, ["q"])
    assert result.ok and script.keys == ["only", "only"]
    assert backend.clock.now() >= 3.0  # Retry-After: 3 on the only key


def test_zhihu_quota_disables_keys_until_every_key_is_out():
    script = ZhihuScript({"code": 30002}, GOOD, {"code": 30002})
    backend = mock_backend("zhihu", script, keys=["k1", "k2"])
    first, second, third = run_queries(backend, ["a", "b", "c"])
    assert first.ok and script.keys[:2] == ["k1", "k2"]
    assert not second.ok and "all Zhihu keys exhausted" in second.error
    assert not third.ok and "all Zhihu keys exhausted" in third.error
    assert len(script.keys) == 3  # no request once every key is out


def test_zhihu_rejected_key_is_disabled():
    script = ZhihuScript(401, GOOD, GOOD)
    backend = mock_backend("zhihu", script, keys=["bad", "good"])
    results = run_queries(backend, ["a", "b"])
    assert all(r.ok for r in results) and script.keys == ["bad", "good", "good"]


def test_zhihu_quota_command_prints_a_table_without_keys(monkeypatch):
    import searchr1.commands.search_zhihu_quota as quota_module
    from searchr1.cli import main

    def handler(request):
        key = request.headers["authorization"].removeprefix("Bearer ")
        assert (
            request.url.path == "/api/v1/quota"
            and request.url.params["APIIDs"] == "global_search,zhihu_search"
        )
        if key == "quota-key-two":
            return httpx.Response(401)
        return httpx.Response(
            200,
            json={
                "Code": 0,
                "Message": "success",
                "Data": [
                    {
                        "APIID": "global_search",
                        "APIName": "全网搜索",
                        "TotalQuota": 1000,
                        "TotalUsed": 37,
                        "RemainingQuota": 963,
                    }
                ],
            },
        )

    real_factory = quota_module.create_search_backend
    monkeypatch.setattr(
        quota_module,
        "create_search_backend",
        lambda name, **kw: real_factory(name, transport=httpx.MockTransport(handler), **kw),
    )
    monkeypatch.setenv("ZHIHU_SEARCH_KEYS", "quota-key-one,quota-key-two")
    outcome = CliRunner().invoke(main, ["zhihu-quota"])
    assert outcome.exit_code == 0, outcome.output
    assert "global_search" in outcome.output and "963" in outcome.output and "HTTP 401" in outcome.output
    assert "quota-key" not in outcome.output


def test_a_zhihu_quota_answer_over_the_body_limit_is_refused_unbuffered_and_the_other_keys_still_read():
    streamed = {"bytes": 0}

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self):
            for _ in range(10_000):  # 640 MB if read to the end
                streamed["bytes"] += 65536
                yield b" " * 65536

    def handler(request):
        if request.headers["authorization"].endswith("key-one"):
            return httpx.Response(200, stream=Endless())  # no Content-Length: only the stream can tell
        return httpx.Response(200, json={"Code": 0, "Data": [{"APIID": "global_search", "TotalQuota": 5,
                                                               "TotalUsed": 1, "RemainingQuota": 4}]})

    backend = create_search_backend("zhihu", keys=["quota-key-one", "quota-key-two"],
                                    transport=httpx.MockTransport(handler))

    async def ask():
        async with backend:
            return await backend.quota(["global_search"])

    first, second = asyncio.run(ask())
    assert first.error and "limit" in first.error and not first.rows
    assert streamed["bytes"] <= backend.max_body_bytes + 65536  # stopped at the limit, not at the end
    assert second.error is None and second.rows[0].remaining == 4


# ----------------------------------------------------------------------------- CLI options


def invoke_with_search_options(args):
    captured = {}

    @click.command()
    @search_options(default_backend="wikipedia")
    @click.option("--steps", type=int, default=1)
    def command(search: SearchOptions, steps: int):
        captured["search"] = search
        captured["steps"] = steps

    outcome = CliRunner().invoke(command, args)
    return outcome, captured


def test_search_options_bundle_the_flags():
    outcome, captured = invoke_with_search_options(
        [
            "--backend",
            "deepseek",
            "--search-concurrency",
            "4",
            "--search-timeout",
            "9",
            "--search-model",
            "deepseek-flash",
            "--search-cache",
            "off",
            "--steps",
            "3",
        ]
    )
    assert outcome.exit_code == 0, outcome.output
    search = captured["search"]
    assert (search.backend, search.concurrency, search.timeout, search.model) == (
        "deepseek",
        4,
        9.0,
        "deepseek-flash",
    )
    assert not search.cache_enabled and captured["steps"] == 3


def test_search_options_reject_bad_values():
    outcome, _ = invoke_with_search_options(["--search-concurrency", "0"])
    assert outcome.exit_code != 0 and "must be > 0" in outcome.output
    outcome, _ = invoke_with_search_options(["--search-backend", "bing"])
    assert outcome.exit_code != 0


def test_build_search_backend_live_with_cache(tmp_path):
    options = SearchOptions(
        backend="deepseek", model="deepseek-flash", cache=str(tmp_path / "c.sqlite"), concurrency=2
    )
    backend = build_search_backend(options, api_key="k")
    assert backend.model == "deepseek-flash" and backend.concurrency == 2 and backend.cache is not None
    assert build_search_backend(SearchOptions(backend="retriever", cache="off")).cache is None


def test_build_search_backend_replays_a_cassette_without_cache():
    from searchr1.search.cassette_specs import CASSETTE_ROOT

    options = SearchOptions(backend="wikipedia", cassette=CASSETTE_ROOT / "wikipedia" / "demo.yaml")
    backend = build_search_backend(options)
    assert isinstance(backend, ReplayBackend) and backend.backend.cache is None

    async def run():
        async with backend:
            return await backend.search("capital of Australia")

    assert asyncio.run(run()).items[0].title == "Canberra"
