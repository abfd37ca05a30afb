"""``serve --thinking`` as the official ``openai`` client sees it: the model's reasoning comes back
as ``reasoning_content`` beside the message (as vLLM and DeepSeek return it), never inside the
content, and calls and answers are read only after it."""

from __future__ import annotations

import pathlib
import tempfile

import openai
import pytest

from searchr1.core.rollout import RolloutConfig
from searchr1.offline import load_source
from searchr1.search.options import SearchOptions
from searchr1.serve.app import start_in_thread
from searchr1.serve.model import ChatModel
from searchr1.wiring.services import offline_scenario, offline_service, search_backend

MODEL = "Qwen/Qwen3.5-4B"
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Look up evidence on the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
QUESTION = load_source()["train"][0]["question"]


@pytest.fixture(scope="module")
def client(tokenizer):
    with tempfile.TemporaryDirectory(prefix="serve-thinking-") as home:
        service = offline_service(pathlib.Path(home), tokenizer, offline_scenario(), policy="learning")
        sampler = service.create_sampling_client(base_model=MODEL)
        backend = search_backend(SearchOptions(backend="wikipedia"), offline=True)
        model = ChatModel(sampler=sampler, tokenizer=tokenizer, search=backend, tools={}, name=MODEL,
                          rollout=RolloutConfig(group_size=1, temperature=1.0, thinking=True),
                          policy="the offline twin learning policy (not the model)")
        with start_in_thread(model) as running:
            yield openai.OpenAI(base_url=running.url, api_key="unused", max_retries=0)


@pytest.mark.slow  # a few dozen turns through the chat server (a second or two)
def test_a_thinking_reply_carries_its_reasoning_beside_the_content(client):
    kinds = set()
    for seed in range(30):
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                               tools=[SEARCH_TOOL], temperature=1, seed=seed)
        message = reply.choices[0].message
        reasoning = message.model_extra["reasoning_content"]
        assert reasoning.strip() and "</think>" not in reasoning and "</think>" not in (message.content or "")
        kinds.add(reply.choices[0].finish_reason)
        if reply.choices[0].finish_reason == "tool_calls":
            assert message.tool_calls[0].function.name == "search"
    assert kinds == {"tool_calls", "stop"}  # the untrained policy both searches and answers at once


@pytest.mark.slow
def test_an_agent_answer_keeps_each_turns_reasoning_out_of_its_text(client):
    for seed in range(30):  # the first seed whose agent answers (the untrained policy may break the format)
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                temperature=1, seed=seed, extra_body={"agent": True})
        if answer.model_extra["termination"] == "answer":
            break
    message, turns = answer.choices[0].message, answer.model_extra["turns"]
    assistant_turns = [turn for turn in turns if turn["role"] == "assistant"]
    assert assistant_turns and all(turn["reasoning_content"].strip() for turn in assistant_turns)
    assert "Answer:" in message.content and "</think>" not in message.content
    assert message.model_extra["reasoning_content"] == assistant_turns[-1]["reasoning_content"]
