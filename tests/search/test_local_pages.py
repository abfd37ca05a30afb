"""open_page over the local index: a page's passages in order, from any offset, named by title or
by a passage id; a page that is not there is an empty answer, never a tool failure."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, build_index
from searchr1.core.observation.text import observation_candidates
from searchr1.core.protocol import parse_assistant
from searchr1.core.tools import OPEN_PAGE, SEARCH, ToolCall
from searchr1.search.pages import LocalPageBackend

PAGE = [f"Part {k} of the Seine article: the river flows through Paris." for k in range(1, 7)]
ROWS = ([("s1", "Seine", PAGE[0]), ("p1", "Paris", "Paris is the capital of France.")]
        + [(f"s{k}", "Seine", text) for k, text in enumerate(PAGE[1:], start=2)]
        + [("b1", "Seine (band)", "A band.")])


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> BM25Index:
    directory = tmp_path_factory.mktemp("pages")
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(passage_row(*row) for row in ROWS), "utf-8")
    build_index(corpus, directory / "index", shard_passages=3)
    return BM25Index(directory / "index")


def open_page(backend: LocalPageBackend, **arguments):
    return asyncio.run(backend.call(ToolCall("open_page", arguments)))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(0, 9), window=st.integers(1, 8),
       name=st.sampled_from(["Seine", '"Seine"', "  Seine\n", "s1", "s4", "s6"]))
def test_a_page_reads_in_order_from_its_offset_by_title_or_by_any_of_its_passage_ids(index, offset, window, name):
    result = open_page(LocalPageBackend(index, window=window), page=name, offset=offset)
    shown = PAGE[offset:offset + window]
    assert result.ok and [item.content for item in result.items] == shown
    assert [item.title for item in result.items] == [f"Seine (passage {offset + k + 1} of 6)"
                                                     for k in range(len(shown))]


def test_an_unknown_page_is_an_empty_answer_the_policy_is_told_about(index):
    for name in ("Seine (film)", "seine", "s99", ""):
        result = open_page(LocalPageBackend(index), page=name)
        assert result.ok and result.items == ()
        assert observation_candidates(result, "open_page") == ["open_page returned nothing."]
    assert [item.content for item in open_page(LocalPageBackend(index), page="b1").items] == ["A band."]


def test_without_an_offset_a_page_reads_from_its_start(index):
    assert open_page(LocalPageBackend(index, window=2), page="Seine").items[0].title == "Seine (passage 1 of 6)"


@pytest.mark.parametrize("call, reason", [
    ("<parameter=page>\n  \n</parameter>", "the page name is blank"),
    ("<parameter=page>\nSeine\n</parameter>\n<parameter=offset>\n-1\n</parameter>", "the offset is negative"),
])
def test_a_blank_page_or_a_negative_offset_is_refused_before_any_lookup(call, reason):
    text = f"<tool_call>\n<function=open_page>\n{call}\n</function>\n</tool_call>"
    (refused,) = parse_assistant(text, (SEARCH, OPEN_PAGE)).calls
    assert refused.name == "open_page" and refused.reason == reason


def test_page_reads_are_counted_under_the_tool_and_its_declared_unit(index):
    """A metered page backend counts every call that reached it, each a request of one attempt
    (a local read), and each answer in ``open_page``'s declared unit; search's counts stay empty."""
    from searchr1.run.usage import Usage, metered_tools

    usage = Usage()
    pages = metered_tools({"open_page": LocalPageBackend(index)}, usage)["open_page"]
    for name in ("Seine", "Seine (film)", "p1"):
        asyncio.run(pages.call(ToolCall("open_page", {"page": name})))
    assert usage.kinds()["tool_open_page_calls"] == 3
    assert usage.kinds()["tool_open_page_pages"] == 3  # a missing page is an answer too
    assert usage.search == {} and usage.tokens == 0
