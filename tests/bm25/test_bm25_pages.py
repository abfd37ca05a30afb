"""The index's page tables: a title gives every passage of that page in corpus order, an id its
first passage, whatever the shard size and even when every text shares one key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.bm25 import pages
from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, BM25IndexError, build_index

TITLES = ["Paris", "Paris (band)", "Danube", "Ünïcode page", "A"]
IDS = ["1", "2", "3", "doc-x", "17"]

passages = st.lists(st.tuples(st.sampled_from(IDS), st.sampled_from(TITLES),
                              st.sampled_from(["alpha bravo", "charlie delta echo", "foxtrot"])),
                    min_size=1, max_size=14)


def build(directory: Path, rows: list[tuple[str, str, str]], shard_passages: int) -> BM25Index:
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(passage_row(ident, title, text) for ident, title, text in rows), "utf-8")
    build_index(corpus, directory / "index", shard_passages=shard_passages)
    return BM25Index(directory / "index")


def check_lookups(index: BM25Index, rows: list[tuple[str, str, str]]) -> None:
    for title in TITLES + ["Nowhere", "paris"]:
        expected = [row for row, (_, t, _) in enumerate(rows) if t == title]
        found = index.page(title)
        assert [hit.row for hit in found] == expected
        assert all(hit.contents == f'"{title}"\n{rows[hit.row][2]}' for hit in found)
    for ident in IDS + ["404"]:
        first = next((row for row, (i, _, _) in enumerate(rows) if i == ident), None)
        hit = index.passage_of_id(ident)
        assert (hit.row if hit else None) == first
        assert hit is None or hit.id == ident


@pytest.mark.slow  # builds an index per example (seconds)
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=passages, shard_passages=st.integers(1, 5))
def test_a_page_is_every_passage_with_its_title_in_corpus_order_over_any_shards(tmp_path_factory, rows,
                                                                              shard_passages):
    check_lookups(build(tmp_path_factory.mktemp("pages"), rows, shard_passages), rows)


def test_texts_that_share_a_key_never_mix(tmp_path, monkeypatch):
    """Every text given one key: the tables hold one run of rows, and lookups still compare the
    real title and id."""
    monkeypatch.setattr(pages, "text_key", lambda text: 7)
    rows = [("1", "Paris", "alpha bravo"), ("2", "Danube", "charlie"), ("3", "Paris", "delta echo"),
            ("1", "A", "foxtrot")]
    index = build(tmp_path, rows, shard_passages=2)
    assert np.asarray(index.tables["titles"].keys).tolist() == [7] * 4
    check_lookups(index, rows)


def test_a_damaged_page_table_is_refused_on_open(tmp_path):
    index = build(tmp_path, [("1", "Paris", "alpha"), ("2", "Danube", "bravo")], shard_passages=1)
    rows_path = index.directory / "pages" / "titles.rows.npy"
    del index
    damaged = np.load(rows_path)
    damaged[0] = 99
    with rows_path.open("r+b") as handle:  # same size, so only the range check can see it
        np.save(handle, damaged)
    with pytest.raises(BM25IndexError, match=r"titles\.rows\.npy: a row outside"):
        BM25Index(tmp_path / "index")
