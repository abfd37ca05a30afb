"""``serve`` as the official ``openai`` client sees it, against 127.0.0.1: tool calls come back
as OpenAI tool_calls and tool messages go back in, agent mode answers with its turns, streaming
follows the chunk format, a bad request is a 4xx naming the field, and a server started with a
key answers only the client that sends it."""

from __future__ import annotations

import json
import logging
import re
import tempfile

import httpx
import openai
import pytest

from searchr1.core.rollout import RolloutConfig
from searchr1.offline import load_source
from searchr1.wiring.services import offline_scenario, offline_service, search_backend
from searchr1.search.options import SearchOptions
from searchr1.basics.secrets import Secret
from searchr1.serve.access_log import ACCESS_LOGGER
from searchr1.serve.app import start_in_thread
from searchr1.serve.model import ChatModel

MODEL = "Qwen/Qwen3.5-4B"
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Look up evidence on the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
QUESTION = load_source()["train"][0]["question"]
KEY = "serve-test-key-7Q2xV9pL4mK8"  # the served twin's key: every client of it sends this


@pytest.fixture(scope="module")
def served(tokenizer):
    from searchr1.commands.ask import check_offline_question

    with tempfile.TemporaryDirectory(prefix="serve-test-") as home:
        service = offline_service(__import__("pathlib").Path(home), tokenizer, offline_scenario(), policy="learning")
        sampler = service.create_sampling_client(base_model=MODEL)
        backend = search_backend(SearchOptions(backend="wikipedia"), offline=True)
        model = ChatModel(sampler=sampler, tokenizer=tokenizer, rollout=RolloutConfig(group_size=1, temperature=0.0),
                          search=backend, tools={}, name=MODEL, policy="the offline twin learning policy (not the model)",
                          check_question=lambda question: check_offline_question(question, "learning"))
        with start_in_thread(model, api_key=Secret(KEY)) as running:
            yield running.url


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served, api_key=KEY, max_retries=0)


def calling(client, **options):
    """The first of seeds 0..39 whose sampled turn calls a tool (the untrained twin policy searches
    in about a third of its first turns), and that seed."""
    for seed in range(40):
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                               tools=[SEARCH_TOOL], temperature=1, seed=seed, **options)
        if options.get("stream") or reply.choices[0].finish_reason == "tool_calls":
            return reply, seed
    raise AssertionError("no seed of 40 made a tool call")


def test_a_client_with_its_own_tools_gets_the_models_call_back_and_sends_the_result_in(client):
    first, _ = calling(client)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search" and call.id.startswith("call_")
    query = json.loads(call.function.arguments)["query"]
    assert isinstance(query, str) and query.strip()
    second = client.chat.completions.create(model=MODEL, tools=[SEARCH_TOOL], temperature=1, seed=0, messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": choice.message.content, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "[1] Title: Nothing useful\n    Content: Nothing."}])
    assert second.choices[0].message.role == "assistant"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.slow  # up to 40 agent runs through the chat server (a second)
def test_agent_mode_searches_itself_and_answers_with_its_turns(client):
    for seed in range(40):
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                temperature=1, seed=seed, extra_body={"agent": True})
        if answer.model_extra["tool_calls_made"]:
            break
    message = answer.choices[0].message
    extra = answer.model_extra
    assert extra["tool_calls_made"] >= 1
    tool_turns = [t for t in extra["turns"] if t["role"] == "tool"]
    assert tool_turns and all(t["content"].startswith(("[1] Title:", "Search returned no results")) for t in tool_turns)
    assert "Answer:" in message.content
    assert extra["turns"][0] == {"role": "user", "content": QUESTION}
    assert extra["turns"][-1]["role"] == "assistant" and extra["turns"][-1]["content"] == message.content
    assert extra["tool_calls_made"] == sum(1 for t in extra["turns"] if t["role"] == "tool")
    assert "twin" in extra["policy"]


def test_streaming_gives_the_same_call_in_openais_chunk_format(client):
    whole, seed = calling(client)
    pieces = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                 tools=[SEARCH_TOOL], temperature=1, seed=seed, stream=True))
    assert all(p.object == "chat.completion.chunk" for p in pieces)
    assert pieces[0].choices[0].delta.role == "assistant"
    assert pieces[-1].choices[0].finish_reason == "tool_calls"
    streamed = [c for p in pieces for c in (p.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls]


@pytest.mark.parametrize("body, field", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": QUESTION}], "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": QUESTION}], "temperature": 9}, "temperature"),
    ({"messages": [{"role": "user", "content": QUESTION}], "tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": QUESTION}], "logit_bias": {}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "What is the meaning of life?"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": QUESTION},
                   {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                          "function": {"name": "search",
                                                                                       "arguments": "[1]"}}]},
                   {"role": "tool", "tool_call_id": "c", "content": "x"}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_a_bad_request_is_a_4xx_naming_the_field(client, body, field):
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model=MODEL, **{k: v for k, v in body.items() if k == "messages"},
                                       extra_body={k: v for k, v in body.items() if k != "messages"})
    assert 400 <= raised.value.status_code < 500
    assert raised.value.body["param"] == field and raised.value.body["message"].startswith(field)


def test_a_body_that_is_not_json_or_too_large_is_a_4xx_not_a_500(served):
    url, key = served + "/chat/completions", {"authorization": f"Bearer {KEY}"}
    assert httpx.post(url, content=b"{not json", headers=key).status_code == 400
    assert httpx.post(url, content=b"x" * (2 << 20), headers=key).status_code == 413
    assert httpx.get(served + "/models", headers=key).json()["data"][0]["id"] == MODEL


class FailingSampler:
    async def sample_async(self, **kwargs):
        raise ConnectionError("sampler down")


def test_a_sampler_that_fails_is_a_502_saying_so_never_a_500(tokenizer):
    model = ChatModel(sampler=FailingSampler(), tokenizer=tokenizer, search=None, tools={}, name=MODEL,
                      rollout=RolloutConfig(group_size=1, sample_retries=0), policy="a failing sampler")
    with start_in_thread(model) as running:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"agent": False})
    assert raised.value.status_code == 502
    assert raised.value.body["message"] == "the model could not answer: ConnectionError: sampler down"


@pytest.mark.slow  # a whole serve process: the tokenizer, the twin, uvicorn (about 10 s)
def test_the_serve_command_answers_the_openai_client_and_says_where(tmp_path):
    import os
    import subprocess
    import sys

    scratch = tmp_path / "tmp"  # the command's temporary folders
    scratch.mkdir()
    process = subprocess.Popen([sys.executable, "cli.py", "serve", "--offline", "--port", "0"],
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(scratch), "SEARCHR1_SERVE_API_KEY": KEY})
    try:
        line = ""
        while "serving" not in line:
            line = process.stderr.readline()
            assert line, "serve exited before it served"
        assert "(not the model)" in line
        url = line.split(" on ", 1)[1].split()[0].removesuffix("/chat/completions")
        assert "callers send the API key" in line
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                               extra_body={"agent": True})
        assert reply.choices[0].message.content and "twin" in reply.model_extra["policy"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="not-" + KEY, max_retries=0).models.list()
    finally:
        process.terminate()
        _, rest = process.communicate(timeout=20)
    lines = rest.splitlines()  # after "serving": one access line per request, in order, the key in none
    assert [line.rsplit(" ", 2)[0] for line in lines if line.endswith(" ms")] == \
        ["POST /v1/chat/completions 200", "GET /v1/models 401"]
    assert KEY not in rest
    assert list(scratch.iterdir()) == []  # SIGTERM ends it as cleanly as Ctrl-C: its twin's home is gone
    assert process.returncode == 143


def test_the_openai_client_is_answered_with_the_servers_key_and_refused_without_it(served):
    """With the key the official client is answered; with any other it raises AuthenticationError
    (401, OpenAI's error shape, code invalid_api_key), and the answer quotes neither key. Without
    an Authorization header it is the same 401; GET /healthz needs no key."""
    assert openai.OpenAI(base_url=served, api_key=KEY, max_retries=0).models.list().data[0].id == MODEL
    for wrong in ("not-" + KEY, KEY[:-1], KEY + "x", KEY.lower()):
        with pytest.raises(openai.AuthenticationError) as raised:
            openai.OpenAI(base_url=served, api_key=wrong, max_retries=0).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": QUESTION}])
        assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"
        assert raised.value.body["type"] == "invalid_request_error" and raised.value.body["param"] is None
        assert wrong not in json.dumps(raised.value.body) and KEY not in json.dumps(raised.value.body)
    bare = httpx.post(served + "/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}]})
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    assert bare.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(served.removesuffix("/v1") + "/healthz").json()["status"] == "ok"


def test_each_request_is_one_access_line_holding_neither_body_nor_header_nor_key(tokenizer, caplog):
    caplog.set_level(logging.DEBUG)
    key = {"authorization": f"Bearer {KEY}"}
    with chat_with(tokenizer, ScriptedSampler("Hello."), api_key=Secret(KEY)) as running:  # its own: no late lines
        served, root = running.url, running.url.removesuffix("/v1")
        requests = [("GET", served + "/models", key), ("POST", served + "/chat/completions", {}),
                    ("GET", root + "/healthz", {}), ("GET", served + "/" + KEY, {}),
                    ("POST", served + "/chat/completions", key)]
        for method, url, headers in requests:
            body = b'{"messages": "body text"}' if method == "POST" else None
            httpx.request(method, url, headers=headers, content=body)
        server = running.thread.ident  # its lines, all logged once it stopped; none of another test's server
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER and r.thread == server]
    assert sorted(line.rsplit(" ", 2)[0] for line in lines) == sorted([
        "GET /v1/models 200", "POST /v1/chat/completions 401", "GET /healthz 200", "GET /v1/[redacted] 401",
        "POST /v1/chat/completions 422"])
    assert all(re.fullmatch(r"\S+ \S+ \d{3} \d+\.\d ms", line) for line in lines)
    everything = "\n".join(record.getMessage() for record in caplog.records if record.name.startswith("searchr1"))
    assert KEY not in everything and "body text" not in everything and "Bearer" not in everything


@pytest.mark.slow  # 16 agent runs through the chat server (about a second)
def test_a_question_without_tools_is_answered_by_the_agent_without_call_markup(client):
    """A plain chat (no tools, no agent field) asking a question gets the agent's answer: the
    server ran the calls the model wrote (its turns are attached), and the content holds no call
    markup, also where the trajectory ended on a call the rollout refused."""
    called = 0
    for seed in range(16):
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                temperature=1, seed=seed)
        assert answer.choices[0].finish_reason == "stop" and not answer.choices[0].message.tool_calls
        assert "<tool_call>" not in answer.choices[0].message.content
        turns = answer.model_extra["turns"]
        assert turns[0] == {"role": "user", "content": QUESTION}
        called += any("<tool_call>" in turn["content"] for turn in turns if turn["role"] == "assistant")
    assert called, "no seed of 16 wrote a call: the test shows nothing about markup"


class ScriptedSampler:
    """Answers every request with ``text``, after ``failures`` retryable failures (or hangs for
    ever when ``hang``); records the stop strings it was asked to honour."""

    def __init__(self, text: str, failures: int = 0, hang: bool = False) -> None:
        self.text, self.failures, self.hang, self.stops, self.calls = text, failures, hang, [], 0

    async def sample_async(self, *, prompt, num_samples, sampling_params, return_text):
        import asyncio
        from types import SimpleNamespace

        self.calls += 1
        self.stops.append(list(sampling_params.stop or []))
        if self.hang:
            await asyncio.sleep(3600)
        if self.calls <= self.failures:
            raise ConnectionError("sampler dropped the connection")
        sequence = SimpleNamespace(tokens=[1, 2, 3], logprobs=[0.0] * 3, text=self.text, stop_reason="stop")
        return SimpleNamespace(sequences=[sequence])


def chat_with(tokenizer, sampler, api_key=None, **rollout):
    """A server of ``sampler`` (no search), with ``rollout``'s settings."""
    model = ChatModel(sampler=sampler, tokenizer=tokenizer, search=None, tools={}, name=MODEL, policy="scripted",
                      rollout=RolloutConfig(group_size=1, sample_retry_backoff=0.0, **rollout))
    return start_in_thread(model, api_key=api_key)


CALLING = "I should look this up.\n<tool_call>\n<function=search>\n<parameter=query>\npenicillin\n</parameter>\n" \
          "</function>\n</tool_call>"


def test_a_turn_without_tools_stops_where_a_call_would_begin_and_never_shows_one(tokenizer):
    sampler = ScriptedSampler(CALLING)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "who discovered penicillin?"}]
    with chat_with(tokenizer, sampler) as running:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        for messages, extra in ((conversation, {}), (conversation[-1:], {"agent": False}),
                                (conversation[-1:], {"tool_choice": "none"})):
            reply = client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra)
            assert reply.choices[0].message.content == "I should look this up."
            assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls
        with_tools = client.chat.completions.create(model=MODEL, messages=conversation, tools=[SEARCH_TOOL])
    assert all("<tool_call>" in stops for stops in sampler.stops[:3])
    assert with_tools.choices[0].finish_reason == "tool_calls" and "<tool_call>" not in sampler.stops[3]


@pytest.mark.slow  # three servers started and stopped, one waits out a timeout (about a second)
def test_a_turn_samples_with_the_rollouts_timeout_and_retries(tokenizer):
    messages, plain = [{"role": "user", "content": "hi"}], {"agent": False}
    with chat_with(tokenizer, ScriptedSampler("Hello.", failures=2), sample_retries=2) as running:
        reply = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, messages=messages, extra_body=plain)
    assert reply.choices[0].message.content == "Hello."
    with chat_with(tokenizer, ScriptedSampler("Hello.", failures=1), sample_retries=0) as running, \
            pytest.raises(openai.APIStatusError) as failed:
        openai.OpenAI(base_url=running.url, api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, messages=messages, extra_body=plain)
    assert failed.value.status_code == 502 and "sampler dropped the connection" in failed.value.body["message"]
    with chat_with(tokenizer, ScriptedSampler("", hang=True), sample_timeout=0.2, sample_retries=0) as running, \
            pytest.raises(openai.APIStatusError) as timed_out:
        openai.OpenAI(base_url=running.url, api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, messages=messages, extra_body=plain)
    assert timed_out.value.status_code == 502 and "TimeoutError" in timed_out.value.body["message"]
