"""``serve`` as the official ``openai`` client sees it, against 127.0.0.1: tool calls come back
as OpenAI tool_calls and tool messages go back in, agent mode answers with its turns, streaming
follows the chunk format, and a bad request is a 4xx naming the field."""

from __future__ import annotations

import json
import tempfile

import httpx
import openai
import pytest

from searchr1.core.rollout import RolloutConfig
from searchr1.offline import load_source
from searchr1.runtime.services import offline_scenario, offline_service, search_backend
from searchr1.search.options import SearchOptions
from searchr1.serve.app import start_in_thread
from searchr1.serve.model import ChatModel

MODEL = "Qwen/Qwen3.5-4B"
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Look up evidence on the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
QUESTION = load_source()["train"][0]["question"]


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
        with start_in_thread(model) as running:
            yield running.url


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served, api_key="not-needed", max_retries=0)


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
    url = served + "/chat/completions"
    assert httpx.post(url, content=b"{not json").status_code == 400
    assert httpx.post(url, content=b"x" * (2 << 20)).status_code == 413
    assert httpx.get(served + "/models").json()["data"][0]["id"] == MODEL


class FailingSampler:
    async def sample_async(self, **kwargs):
        raise ConnectionError("sampler down")


def test_a_sampler_that_fails_is_a_502_saying_so_never_a_500(tokenizer):
    model = ChatModel(sampler=FailingSampler(), tokenizer=tokenizer, rollout=RolloutConfig(group_size=1), search=None,
                      tools={}, name=MODEL, policy="a failing sampler")
    with start_in_thread(model) as running:
        client = openai.OpenAI(base_url=running.url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
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
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(scratch)})
    try:
        line = ""
        while "serving" not in line:
            line = process.stderr.readline()
            assert line, "serve exited before it served"
        assert "(not the model)" in line
        url = line.split(" on ", 1)[1].split()[0].removesuffix("/chat/completions")
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                               extra_body={"agent": True})
        assert reply.choices[0].message.content and "twin" in reply.model_extra["policy"]
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert list(scratch.iterdir()) == []  # SIGTERM ends it as cleanly as Ctrl-C: its twin's home is gone
    assert process.returncode == 143
