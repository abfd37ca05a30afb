"""Pure parsing of each service's payload, and the request builders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.search.base import PayloadError
from searchr1.search.evidence import (
    EVIDENCE_SYSTEM_PROMPT,
    FALLBACK_TITLE,
    EvidenceStream,
    build_request,
    parse_evidence,
)
from searchr1.search.retriever import parse_retriever_payload, split_contents
from searchr1.core.types import SearchResult
from searchr1.core.observation.text import format_observation
from searchr1.search.wikipedia import (
    api_error,
    mediawiki_params,
    parse_wikipedia_payload,
    search_params,
    user_agent,
)
from searchr1.search.zhihu import body_code, parse_quota_payload, parse_zhihu_items

# ----------------------------------------------------------------------------- Wikipedia


def page(title, index, extract="text", **extra):
    return {
        "pageid": hash(title) % 10**6,
        "ns": 0,
        "title": title,
        "index": index,
        "extract": extract,
        "fullurl": f"https://en.wikipedia.org/wiki/{title}",
        **extra,
    }


@given(st.permutations(list(range(1, 7))))
def test_wikipedia_items_follow_search_rank_not_page_order(ranks):
    pages = [page(f"T{rank}", rank, f"extract {rank}") for rank in ranks]
    items = parse_wikipedia_payload({"query": {"pages": pages}}, limit=6)
    assert [item.title for item in items] == [f"T{r}" for r in range(1, 7)]


def test_wikipedia_drops_empty_extracts_and_keeps_the_top_three():
    pages = [page("A", 1, ""), page("B", 2), page("C", 3, "   "), page("D", 4), page("E", 5), page("F", 6)]
    items = parse_wikipedia_payload({"query": {"pages": pages}})
    assert [i.title for i in items] == ["B", "D", "E"]
    assert all(i.source == "Wikipedia" and i.url.endswith(i.title) for i in items)


def test_wikipedia_missing_query_means_no_results():
    assert parse_wikipedia_payload({"batchcomplete": True}) == ()
    assert parse_wikipedia_payload({"batchcomplete": True, "query": {}}) == ()


def test_wikipedia_accepts_formatversion_1_pages_keyed_by_id():
    payload = {"query": {"pages": {"12": page("Second", 2), "7": page("First", 1)}}}
    assert [i.title for i in parse_wikipedia_payload(payload)] == ["First", "Second"]


def test_wikipedia_long_extract_is_bounded():
    items = parse_wikipedia_payload({"query": {"pages": [page("Long", 1, "word " * 1000)]}})
    assert len(items[0].content) <= 1200 and items[0].content.endswith("…")


@pytest.mark.parametrize(
    ("payload", "culprit"),
    [
        ([], "top level"),
        ({"query": []}, "query is not an object"),
        ({"query": {"pages": "x"}}, "query.pages is not a list"),
        ({"query": {"pages": [3]}}, "query.pages[0]"),
        ({"query": {"pages": [{"title": "x", "extract": 5, "index": 1}]}}, "extract"),
    ],
)
def test_wikipedia_schema_errors_name_the_field(payload, culprit):
    with pytest.raises(PayloadError, match=culprit.replace("[", r"\[").replace("]", r"\]")):
        parse_wikipedia_payload(payload)


def test_wikipedia_api_error_envelopes():
    assert api_error({"error": {"code": "maxlag", "info": "lagged"}}) == ("maxlag", "lagged")
    assert api_error({"errors": [{"code": "badvalue", "text": "bad"}]}) == ("badvalue", "bad")
    assert api_error({"batchcomplete": True}) is None


@given(st.dictionaries(st.sampled_from(["exintro", "explaintext", "redirects", "utf8"]), st.booleans()))
def test_mediawiki_params_never_send_a_false_boolean(flags):
    rendered = mediawiki_params(**flags)
    assert set(rendered) == {k for k, v in flags.items() if v}
    assert all(value == "1" for value in rendered.values())


def test_wikipedia_request_parameters_follow_the_documented_recipe():
    params = search_params("The Little Prince author")
    assert params["gsrsearch"] == "The Little Prince author"
    assert params["exintro"] == params["explaintext"] == "1"
    assert (params["formatversion"], params["generator"], params["prop"]) == ("2", "search", "extracts|info")
    assert (params["gsrlimit"], params["exchars"], params["inprop"], params["maxlag"]) == (
        "3",
        "1200",
        "url",
        "5",
    )
    assert "exsentences" not in params
    assert "maxlag" not in search_params("q", maxlag=None)


def test_wikipedia_user_agent_names_project_version_url_contact_and_library():
    from searchr1 import __version__
    from searchr1.search.base import PROJECT_URL

    agent = user_agent("me@example.org")
    assert agent.startswith(f"searchr1/{__version__} ({PROJECT_URL}; me@example.org) httpx/")
    # Without a contact the project URL is still a way to reach the client's authors.
    assert user_agent(None).startswith(f"searchr1/{__version__} ({PROJECT_URL}) httpx/")


# ----------------------------------------------------------------------------- DeepSeek evidence

titles = (
    st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40)
    .map(str.strip)
    .filter(bool)
)
facts = titles


@pytest.mark.slow  # 150 generated evidence texts (a second)
@settings(max_examples=150)
@given(st.lists(st.tuples(titles, facts), min_size=1, max_size=8))
def test_parse_evidence_recovers_every_numbered_item(pairs):
    text = "\n\n".join(f"[{n}] Source: {t}\nEvidence: {e}" for n, (t, e) in enumerate(pairs, start=1))
    items = parse_evidence(text)
    assert [(i.title, i.content) for i in items] == [(t, e) for t, e in pairs]
    assert all(i.source is None and i.url is None for i in items)  # evidence layout


def test_parse_evidence_tolerates_a_preamble_and_multiline_evidence():
    text = (
        "Here is what I found.\n[1] Source: A\nEvidence: first line\nsecond line\n\n"
        "[2] Source: B\nEvidence: b"
    )
    items = parse_evidence(text)
    assert [(i.title, i.content) for i in items] == [("A", "first line\nsecond line"), ("B", "b")]


def test_parse_evidence_needs_a_blank_line_between_items():
    items = parse_evidence("[1] Source: A\nEvidence: a\n[2] Source: B\nEvidence: b")
    assert len(items) == 1 and "[2] Source: B" in items[0].content


def test_parse_evidence_falls_back_to_one_bounded_item():
    items = parse_evidence("**[1] Source:** A. " + "x" * 5000)
    assert len(items) == 1 and items[0].title == FALLBACK_TITLE and len(items[0].content) <= 1200


@pytest.mark.parametrize("text", [None, "", "   ", "Insufficient evidence from this search."])
def test_parse_evidence_no_evidence_means_no_results(text):
    assert parse_evidence(text) == ()


def test_evidence_request_body():
    body = build_request("q", model="m", tool_type="t")
    assert body["messages"] == [{"role": "user", "content": "q"}]
    assert body["tools"] == [{"type": "t", "name": "web_search", "max_uses": 1}]
    assert body["stream"] is True and body["model"] == "m" and body["system"] == EVIDENCE_SYSTEM_PROMPT


def test_evidence_stream_keeps_text_after_the_last_search_and_merges_usage():
    stream = EvidenceStream()
    events = [
        {
            "type": "message_start",
            "message": {"usage": {"input_tokens": 100, "cache_read_input_tokens": 40, "output_tokens": 1}},
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": "thinking out loud"},
        },
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "server_tool_use", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"query": "q'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": 'x"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {
                "type": "web_search_tool_result",
                "content": [{"type": "web_search_result", "title": "T", "url": "https://t"}],
            },
        },
        {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "text_delta", "text": "[1] Source: T\n"},
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "text_delta", "text": "Evidence: fact"},
        },
        {"type": "ping"},
        "not an event",
        {"type": "message_delta", "usage": {"output_tokens": 33}},
        {"type": "message_stop"},
    ]
    for event in events:
        stream.feed(event)
    assert stream.finished and not stream.failed
    assert stream.text == "[1] Source: T\nEvidence: fact"
    assert stream.search_queries == ["qx"] and stream.web_results == [{"title": "T", "url": "https://t"}]
    usage = stream.usage_record()
    assert (
        usage.input_tokens,
        usage.cache_read_input_tokens,
        usage.output_tokens,
        usage.web_search_requests,
    ) == (100, 40, 33, 1)


def test_evidence_stream_error_event():
    stream = EvidenceStream()
    stream.feed({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert stream.failed and (stream.error_type, stream.error_message) == ("overloaded_error", "Overloaded")


def test_evidence_items_render_in_the_evidence_layout():
    result = SearchResult(ok=True, items=parse_evidence("[1] Source: A\nEvidence: a"))
    assert format_observation(result) == "[1] Source: A\n    Evidence: a"


# ----------------------------------------------------------------------------- Zhihu


def test_zhihu_items_strip_highlights_and_describe_the_source():
    items = parse_zhihu_items(
        [
            {
                "Title": "<em>强化</em>学习",
                "ContentText": " 用 <em>奖励</em> 训练 ",
                "ContentType": "Answer",
                "AuthorName": "张三",
                "Url": "https://www.zhihu.com/answer/1",
            },
            {"Title": "", "ContentText": "无作者", "ContentType": None, "AuthorName": "", "Url": ""},
            {"Title": "空", "ContentText": ""},
            {"Title": "第四", "ContentText": "四"},
        ]
    )
    assert [(i.title, i.content, i.source, i.url) for i in items] == [
        ("强化学习", "用 奖励 训练", "Answer / 张三", "https://www.zhihu.com/answer/1"),
        ("Untitled", "无作者", "Zhihu", None),
        ("第四", "四", "Zhihu", None),
    ]


@pytest.mark.parametrize(
    ("payload", "culprit"), [("x", "Data.Items is not a list"), ([1], r"Data.Items\[0\]")]
)
def test_zhihu_schema_errors_name_the_field(payload, culprit):
    with pytest.raises(PayloadError, match=culprit):
        parse_zhihu_items(payload)


def test_zhihu_body_code_accepts_numeric_strings_and_rejects_garbage():
    assert body_code({"Code": "30001", "Message": "second limit exceeded"}) == (
        30001,
        "second limit exceeded",
    )
    with pytest.raises(PayloadError, match="Code"):
        body_code({"Message": "no code"})
    with pytest.raises(PayloadError, match="top level"):
        body_code(["Code", 0])


def test_zhihu_quota_rows():
    rows = parse_quota_payload(
        {
            "Code": 0,
            "Data": [
                {
                    "APIID": "global_search",
                    "APIName": "全网搜索",
                    "TotalQuota": 1000,
                    "TotalUsed": 12,
                    "RemainingQuota": 988,
                }
            ],
        }
    )
    assert (rows[0].api_id, rows[0].total, rows[0].used, rows[0].remaining) == (
        "global_search",
        1000,
        12,
        988,
    )


# ----------------------------------------------------------------------------- retriever


@pytest.mark.parametrize(
    ("contents", "expected"),
    [
        ('"Paris"\nParis is the capital of France.', ("Paris", "Paris is the capital of France.")),
        ("Plain title\nline one\nline two", ("Plain title", "line one\nline two")),
        ('"Only a title"', ("Only a title", "")),
    ],
)
def test_retriever_title_is_the_first_line(contents, expected):
    assert split_contents(contents) == expected


def test_retriever_parses_scored_and_plain_documents():
    scored = {
        "result": [
            [
                {"document": {"id": "1", "contents": '"A"\na text'}, "score": 0.9},
                {"document": {"id": "2", "contents": '"B"'}, "score": 0.8},
                {"document": {"id": "3", "contents": '"C"\nc text'}, "score": 0.7},
            ]
        ]
    }
    items = parse_retriever_payload(scored)
    assert [(i.title, i.content, i.source) for i in items] == [
        ("A", "a text", "wiki-18"),
        ("C", "c text", "wiki-18"),
    ]
    plain = {"result": [[{"id": "1", "contents": '"A"\na'}]]}
    assert parse_retriever_payload(plain, source="bm25")[0].source == "bm25"
    assert parse_retriever_payload({"result": [[]]}) == ()


@pytest.mark.parametrize(
    ("payload", "culprit"),
    [
        ({}, "result is not a list"),
        ({"result": ["x"]}, r"result\[0\] is not a list"),
        ({"result": [[{"document": {"id": 1}}]]}, "contents"),
    ],
)
def test_retriever_schema_errors_name_the_field(payload, culprit):
    with pytest.raises(PayloadError, match=culprit):
        parse_retriever_payload(payload)
