"""Search results carry the passage id ``open_page`` accepts, and an id never carries more than
one short token into the prompt, whatever a corpus or a server sends."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, build_index
from searchr1.core.observation.text import format_item
from searchr1.core.tools import ToolCall
from searchr1.core.types import SearchItem
from searchr1.search.base import IDENT_LIMIT, passage_ident
from searchr1.search.local import LocalSearchBackend
from searchr1.search.pages import LocalPageBackend
from searchr1.search.retriever import parse_retriever_payload

ANY_VALUE = st.one_of(st.text(), st.integers(), st.none(), st.booleans(), st.floats(), st.lists(st.text()),
                      st.dictionaries(st.text(), st.text()))


@given(ANY_VALUE)
def test_an_id_reaches_the_prompt_as_one_short_printable_token_or_not_at_all(value):
    ident = passage_ident(value)
    if ident is not None:
        assert 0 < len(ident) <= IDENT_LIMIT and ident.isprintable() and not any(c.isspace() for c in ident)
        assert ident == str(value).strip()
    shown = format_item(SearchItem("T", "text", "wiki-18", None, ident), 1)
    plain = format_item(SearchItem("T", "text", "wiki-18", None), 1)
    assert shown.count("\n") == plain.count("\n") + (ident is not None)


@given(ANY_VALUE)
def test_a_retriever_document_id_of_any_shape_is_shown_only_when_it_is_a_plain_id(value):
    payload = {"result": [[{"document": {"id": value, "contents": '"Paris"\nThe capital of France.'}}]]}
    (item,) = parse_retriever_payload(payload)
    assert item.ident == passage_ident(value)


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> BM25Index:
    directory = tmp_path_factory.mktemp("ids")
    corpus = directory / "corpus.jsonl"
    corpus.write_text(passage_row("wiki-7", "Seine", "The Seine flows through Paris.")
                      + passage_row("wiki-8", "Seine", "It reaches the sea at Le Havre.")
                      + passage_row("wiki-9", "Loire", "The Loire is the longest river of France."), "utf-8")
    build_index(corpus, directory / "index")
    return BM25Index(directory / "index")


def test_a_local_search_result_names_the_id_that_opens_its_page(index):
    async def search_then_open():
        backend = LocalSearchBackend(index=index)
        try:
            result = await backend.search("Seine Paris")
        finally:
            await backend.aclose()
        top = result.items[0]
        page = await LocalPageBackend(index).call(ToolCall("open_page", {"page": top.ident}))
        return top, page

    top, page = asyncio.run(search_then_open())
    assert (top.title, top.ident) == ("Seine", "wiki-7")
    assert "    Id: wiki-7\n" in format_item(top, 1)
    assert [item.content for item in page.items] == ["The Seine flows through Paris.", "It reaches the sea at Le Havre."]
