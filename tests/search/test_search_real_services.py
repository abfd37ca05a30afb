"""The backends behave like the real services.

Every body below is written from the services' documentation and the lab port's client
(its ``search.py``) and served through ``httpx.MockTransport``; no
network, no key.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.search.tool import with_search
from searchr1.wiring.services import scripted_sampling_client
from searchr1.twin.scenario import parse_scenario
from searchr1.search.cache import QueryCache
from searchr1.search.clock import RealClock
from searchr1.core.observation.text import NO_RESULTS_TEXT, format_observation
from searchr1.search.testing import mock_backend
from searchr1.search.wikipedia import CONTACT_ENV, WikipediaRefusedError


def search(backend, *queries):
    async def run():
        async with backend:
            return [await backend.search(q) for q in queries]

    results = asyncio.run(run())
    return results[0] if len(results) == 1 else results


def json_body(payload, status=200, **headers):
    def handler(request):
        return httpx.Response(status, json=payload, headers=headers)

    return handler


def sse(*events: dict) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events).encode()


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "deepseek-v4-flash",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 1203, "cache_read_input_tokens": 0, "output_tokens": 1},
    },
}
MESSAGE_END = (
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 41}},
    {"type": "message_stop"},
)


def text_block(index, text):
    return (
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": index},
    )


def search_blocks(index, content):
    return (
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": '{"query": "The Ages of Lulu director"}'},
        },
        {"type": "content_block_stop", "index": index},
        {
            "type": "content_block_start",
            "index": index + 1,
            "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": content},
        },
        {"type": "content_block_stop", "index": index + 1},
    )


HITS = [
    {
        "type": "web_search_result",
        "title": "The Ages of Lulu - Wikipedia",
        "url": "https://en.wikipedia.org/wiki/The_Ages_of_Lulu_(film)",
        "page_age": None,
        "encrypted_content": "RW5j",
    }
]
EVIDENCE = "[1] Source: The Ages of Lulu - Wikipedia\nEvidence: The Ages of Lulu is a 1990 Spanish film directed by Bigas Luna."


def stream_handler(*events):
    def handler(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=sse(*events))

    return handler


# ----------------------------------------------------------------------------- Zhihu


@pytest.mark.parametrize(
    "payload",
    [
        {"Code": 0, "Message": "success", "Data": {"HasMore": False, "Items": None}},
        {"Code": 0, "Message": "success", "Data": None},
        {"Code": 0, "Message": "success", "Data": {"HasMore": False}},
    ],
    ids=["items-null", "data-null", "items-missing"],
)
def test_zhihu_null_or_missing_lists_mean_no_results_not_a_schema_error(payload):
    result = search(mock_backend("zhihu", json_body(payload)), "qwxzv flurbington")
    assert result.ok and result.items == ()
    assert format_observation(result) == NO_RESULTS_TEXT


def test_zhihu_sends_the_query_as_typed_and_keys_the_cache_by_its_nfkc_form(tmp_path):
    sent = []
    hit = {
        "Code": 0,
        "Message": "success",
        "Data": {
            "HasMore": False,
            "Items": [
                {
                    "Title": "RLHF 是什么？",
                    "ContentType": "Answer",
                    "ContentID": "1903044959663284716",
                    "ContentText": "<em>RLHF</em> 即基于人类反馈的强化学习。",
                    "Url": "https://www.zhihu.com/answer/1903044959663284716?utm_medium=openapi_platform&utm_source=6d23634e",
                    "AuthorName": "知乎用户",
                    "AuthorityLevel": "2",
                }
            ],
        },
    }

    def handler(request):
        sent.append(request.url.params["Query"])
        return httpx.Response(200, json=hit)

    typed = "什么是 RLHF？（人类反馈强化学习）"
    half_width = "什么是 RLHF?(人类反馈强化学习)"  # what NFKC makes of the full-width punctuation
    backend = mock_backend("zhihu", handler, cache=QueryCache(tmp_path / "cache.sqlite"))
    first, second = search(backend, typed, half_width)
    assert sent == [typed]  # the service saw the full-width punctuation
    assert first.ok and second.ok and second.cached and second.items == first.items
    backend.cache.close()


# ----------------------------------------------------------------------------- DeepSeek


def test_deepseek_answer_without_search_is_not_evidence_and_is_counted():
    answer = "[1] Source: General knowledge\nEvidence: The Ages of Lulu was directed by Bigas Luna."
    backend = mock_backend("deepseek", stream_handler(MESSAGE_START, *text_block(0, answer), *MESSAGE_END))
    result = search(backend, "The Ages of Lulu director")
    assert result.ok and result.items == ()
    assert "Bigas Luna" not in format_observation(result)
    metrics = backend.stats.drain()
    assert metrics["search/no_web_search_rate"] == 1.0 and metrics["search/results"] == 0.0


def test_deepseek_keeps_only_text_written_after_the_results():
    events = (
        MESSAGE_START,
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Lulu? Maybe Almodóvar."}},
        {"type": "content_block_stop", "index": 0},
        *text_block(1, "I think it was Pedro Almodóvar; let me check."),
        *search_blocks(2, HITS),
        {"type": "ping"},
        *text_block(4, EVIDENCE),
        *MESSAGE_END,
    )
    backend = mock_backend("deepseek", stream_handler(*events))
    result = search(backend, "The Ages of Lulu director")
    assert result.ok and [(i.title, i.content) for i in result.items] == [
        ("The Ages of Lulu - Wikipedia", "The Ages of Lulu is a 1990 Spanish film directed by Bigas Luna.")
    ]
    assert "Almodóvar" not in format_observation(result)
    assert backend.stats.drain()["search/no_web_search_rate"] == 0.0


def test_deepseek_web_search_error_block_is_a_failed_search_not_evidence():
    error = {"type": "web_search_tool_result_error", "error_code": "unavailable"}
    events = (MESSAGE_START, *search_blocks(0, error), *text_block(2, "It was directed by Bigas Luna."), *MESSAGE_END)
    backend = mock_backend("deepseek", stream_handler(*events))
    result = search(backend, "The Ages of Lulu director")
    assert not result.ok and "web search failed (unavailable)" in result.error
    assert "Bigas Luna" not in format_observation(result)


@pytest.mark.parametrize(
    "text", ["Insufficient evidence from this search.", "Insufficient evidence from this search", "  insufficient evidence from this search.\n"]
)
def test_deepseek_insufficient_evidence_sentence_means_no_results(text):
    backend = mock_backend("deepseek", stream_handler(MESSAGE_START, *search_blocks(0, HITS), *text_block(2, text), *MESSAGE_END))
    result = search(backend, "qwxzv flurbington")
    assert result.ok and result.items == ()


# What the search model must be told (the lab port's constraints), each as words its
# instructions must contain; the test reads the request as it goes over the wire.
CONSTRAINTS = {
    "use only what the search returned": [r"\bonly\b.*\bsearch results\b", r"own knowledge"],
    "quote facts rather than conclude": [r"\bquote", r"conclusion"],
    "no inferred relations, orderings or causes": [r"\binfer", r"\brelation", r"\bordering", r"\bcause"],
    "do not combine facts across sources into an answer": [r"\bcombine\b.*\bsources?\b", r"\banswer\b"],
    "avoid answer phrasing": [r"\bphrase\b.*\banswer\b|\banswer phrasing\b", r"yes or no"],
    "one search, no rephrasing": [r"exactly once", r"rephrase"],
    "no URLs": [r"\bURLs?\b"],
}


def test_the_search_model_is_told_the_lab_ports_constraints():
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        return stream_handler(MESSAGE_START, *search_blocks(0, HITS), *text_block(2, EVIDENCE), *MESSAGE_END)(request)

    assert search(mock_backend("deepseek", handler), "The Ages of Lulu director").ok
    system = bodies[0]["system"]
    missing = {
        name: pattern
        for name, patterns in CONSTRAINTS.items()
        for pattern in patterns
        if not re.search(pattern, system, flags=re.IGNORECASE | re.DOTALL)
    }
    assert not missing, f"the evidence instructions do not carry: {missing}"
    assert bodies[0]["tool_choice"] == {"type": "any"} and bodies[0]["tools"][0]["max_uses"] == 1


class Trickle(httpx.AsyncByteStream):
    """An evidence stream that sends one event every ``gap`` seconds."""

    def __init__(self, events, gap):
        self.events, self.gap = events, gap

    async def __aiter__(self):
        for event in self.events:
            await asyncio.sleep(self.gap)
            yield sse(event)


LONG_STREAM = (MESSAGE_START, *search_blocks(0, HITS), *text_block(2, EVIDENCE), *MESSAGE_END)


@pytest.mark.slow  # streams for longer than the per-read timeout
def test_a_long_evidence_stream_that_keeps_sending_is_not_cut_by_the_per_read_timeout():
    # 11 events, 40 ms apart: about 0.45 s in all, never more than 40 ms without data.
    def handler(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Trickle(LONG_STREAM, 0.04))

    backend = mock_backend("deepseek", handler, timeout=0.2, max_retries=0, clock=RealClock())
    result = search(backend, "The Ages of Lulu director")
    assert result.ok, result.error
    assert [i.title for i in result.items] == ["The Ages of Lulu - Wikipedia"]


def test_the_total_limit_is_separate_and_the_error_says_which_limit_fired():
    def trickling(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Trickle(LONG_STREAM, 0.04))

    backend = mock_backend("deepseek", trickling, timeout=0.2, total_timeout=0.15, max_retries=0, clock=RealClock())
    started = time.monotonic()
    result = search(backend, "The Ages of Lulu director")
    assert not result.ok and result.error.startswith("request timeout (total limit of 0.15 s reached)")
    assert time.monotonic() - started < 1.0

    def stalled(request):
        raise httpx.ReadTimeout("no data", request=request)  # what httpx raises after `timeout` idle

    backend = mock_backend("deepseek", stalled, max_retries=0)
    result = search(backend, "The Ages of Lulu director")
    assert not result.ok and result.error.startswith("request timeout (no data for 60 s)")
    assert backend.total_timeout > backend.timeout == 60.0  # a generous default of its own


def test_a_stream_without_message_stop_is_a_failure_not_partial_evidence():
    cut = (MESSAGE_START, *search_blocks(0, HITS), *text_block(2, EVIDENCE[:60]))
    result = search(mock_backend("deepseek", stream_handler(*cut)), "The Ages of Lulu director")
    assert not result.ok and "no message_stop" in result.error


# ----------------------------------------------------------------------------- Wikipedia

WIKIMEDIA_REFUSAL = "Please set a user-agent and respect our robot policy https://w.wiki/4wJS. See also T400119.\n"


def refusing(calls):
    def handler(request):
        calls.append(request.headers["user-agent"])
        return httpx.Response(403, headers={"content-type": "text/plain"}, text=WIKIMEDIA_REFUSAL)

    return handler


@pytest.mark.parametrize("contact", [None, "ops@example.org"])
def test_wikipedia_403_stops_at_once_naming_searchr1_contact(contact):
    calls = []
    backend = mock_backend("wikipedia", refusing(calls), contact=contact, max_retries=3)
    with pytest.raises(WikipediaRefusedError) as caught:
        search(backend, "Eiffel Tower height")
    message = str(caught.value)
    assert CONTACT_ENV in message and "403" in message and "\n" not in message
    assert len(calls) == 1  # not retried
    if contact:
        assert contact not in message and contact in calls[0]


def test_a_wikipedia_403_ends_the_rollout_instead_of_becoming_an_observation(tokenizer):
    call = "<tool_call>\n<function=search>\n<parameter=query>\nEiffel Tower height\n</parameter>\n</function>\n</tool_call>"
    scenario = parse_scenario(
        {"questions": [{"question": "How tall is the Eiffel Tower?", "answers": ["330 m"], "samples": [[call, "Answer: 330 m"]]}]}
    )
    backend = mock_backend("wikipedia", refusing([]), contact=None)
    config = RolloutConfig(group_size=1, sample_retry_backoff=0.0)

    async def run(sampler):
        async with backend:
            return await rollout_batch_async(sampler, tokenizer, with_search(backend), scenario.examples, config)

    with scripted_sampling_client(scenario, tokenizer) as sampler, pytest.raises(WikipediaRefusedError,
                                                                                  match=CONTACT_ENV):
        asyncio.run(run(sampler))
