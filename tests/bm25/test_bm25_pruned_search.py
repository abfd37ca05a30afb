"""The search that scores only the passages that can rank returns exactly what summing every
posting returned: the same rows, order and float32 scores, shard by shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.bm25 import index as bm25_index
from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import BM25Index, build_index, top_rows

# Skewed word frequencies, as in text: a few common words in most passages, rare ones in few, so
# that the long lists of the common words are the ones a search can skip.
COMMON = ["alpha", "bravo"]
MIDDLE = ["charlie", "delta", "echo", "foxtrot"]
RARE = ["golf", "hotel", "india", "juliet", "kilo", "lima"]
POOL = COMMON * 12 + MIDDLE * 3 + RARE


def reference_shard_top(shard, term_ids, k):
    """The search as it was before pruning: every posting of the query's terms summed into an
    array of the shard's rows (float64, in the query's term order), stored as float32 and ranked
    by score, then lower row."""
    best = []
    for ids in term_ids:
        spans = [(int(shard.indptr[i]), int(shard.indptr[i + 1])) for i in ids]
        spans = [(a, b) for a, b in spans if b > a]
        if not spans:
            best.append([])
            continue
        rows = np.concatenate([shard.indices[a:b] for a, b in spans])
        weights = np.concatenate([shard.data[a:b] for a, b in spans])
        dense = np.bincount(rows, weights=weights, minlength=shard.rows)
        scores = dense[rows]
        keep = k * len(spans)
        if len(scores) > keep:
            threshold = np.partition(scores, len(scores) - keep)[len(scores) - keep]
            rows = rows[scores >= threshold]
        touched = np.unique(rows)
        best.append([(int(touched[i]), score) for i, score in top_rows(dense[touched].astype(np.float32), k)])
    return best


def built(directory: Path, docs: list[list[str]], shard: int) -> BM25Index:
    corpus = directory / "corpus.jsonl"
    corpus.write_text("".join(passage_row(f"doc-{i}", "", " ".join(d)) for i, d in enumerate(docs)), "utf-8")
    build_index(corpus, directory / "index", shard_passages=shard)
    return BM25Index(directory / "index")


QUERIES = st.lists(st.lists(st.sampled_from(COMMON + MIDDLE + RARE + ["zulu"]), min_size=1, max_size=6),
                   min_size=1, max_size=12)


@pytest.mark.slow  # builds an index per example (seconds)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(st.sampled_from(POOL), min_size=1, max_size=12), min_size=1, max_size=60),
       queries=QUERIES, shard=st.integers(1, 40), k=st.integers(1, 6), dense=st.booleans())
def test_pruned_search_returns_what_summing_every_posting_returns(tmp_path_factory, monkeypatch, docs, queries,
                                                                  shard, k, dense):
    """Invariant: for any corpus, shard size, k and batch of queries (repeated and unknown terms
    included), every shard's best k are the rows, order and float32 scores of summing every
    posting of the query's terms, whether the pruned path or the dense one answers."""
    index = built(tmp_path_factory.mktemp("pruned"), docs, shard)
    monkeypatch.setattr(bm25_index, "summing_is_cheaper", lambda *_: dense)
    term_ids = [index.term_ids(terms) for terms in index.query_terms([" ".join(q) for q in queries])]
    for number, part in enumerate(index.shards):
        assert index._shard_top(part, term_ids, k) == reference_shard_top(part, term_ids, k), number


@pytest.mark.slow  # builds an index per example (seconds)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(st.sampled_from(POOL), min_size=1, max_size=12), min_size=1, max_size=60),
       queries=QUERIES, shard=st.integers(1, 40), k=st.integers(1, 6), data=st.data())
def test_a_floor_leaves_out_only_passages_below_it_and_the_search_is_the_merged_reference(
        tmp_path_factory, docs, queries, shard, k, data):
    """Invariant: given any floor, a shard's answer ranks every passage scoring at least the floor
    exactly as the reference does; and the whole search, which hands each shard the k-th best
    score of the shards before it, gives the reference's best k over every shard (rows, order,
    float32 scores)."""
    index = built(tmp_path_factory.mktemp("floor"), docs, shard)
    term_ids = [index.term_ids(terms) for terms in index.query_terms([" ".join(q) for q in queries])]
    merged = [[] for _ in term_ids]
    for part in index.shards:
        reference = reference_shard_top(part, term_ids, k)
        scores = sorted({score for top in reference for _, score in top}) or [1.0]
        floors = [data.draw(st.sampled_from(scores + [0.0, scores[-1] * 2])) for _ in term_ids]
        got = index._shard_top(part, term_ids, k, floors)
        for top, expected, floor in zip(got, reference, floors):
            assert [hit for hit in top if hit[1] >= floor] == [hit for hit in expected if hit[1] >= floor]
        for number, top in enumerate(reference):
            merged[number] += [(part.first_row + row, score) for row, score in top]
    expected = [sorted(found, key=lambda hit: (-hit[1], hit[0]))[:k] for found in merged]
    assert [[(h.row, h.score) for h in hits] for hits in index.search([" ".join(q) for q in queries], k)] == expected


def test_the_common_words_lists_are_skipped_and_ties_keep_the_lower_row(tmp_path):
    """On a skewed corpus the long list of a common word is not among the lists a top passage
    must come from, and the answer is still the reference's, equal scores by lower row."""
    rng = np.random.default_rng(3)
    docs = [list(rng.choice(POOL, size=int(rng.integers(3, 10)))) for _ in range(400)]
    docs += [["golf", "alpha"]] * 3  # three passages with equal scores
    index = built(tmp_path, docs, shard=10_000)
    (part,) = index.shards
    ids = index.term_ids(index.query_terms(["alpha golf"])[0])
    lists = bm25_index.query_postings(part, ids)
    essential = bm25_index.essential_lists(lists, bm25_index.score_floor(lists, 3))
    assert [len(lists[j].rows) for j in essential] == [min(len(p.rows) for p in lists)]
    assert index._shard_top(part, [ids], 3) == reference_shard_top(part, [ids], 3)
    queries = [" ".join(rng.choice(COMMON + MIDDLE + RARE, size=int(rng.integers(1, 6)))) for _ in range(200)]
    term_ids = [index.term_ids(terms) for terms in index.query_terms(queries)]
    for k in (1, 3, 10):
        assert index._shard_top(part, term_ids, k) == reference_shard_top(part, term_ids, k)


@pytest.mark.parametrize("k", [1, 3])
def test_a_whole_batch_and_one_query_at_a_time_give_the_same_hits(tmp_path, k):
    rng = np.random.default_rng(5)
    docs = [list(rng.choice(POOL, size=int(rng.integers(1, 12)))) for _ in range(300)]
    index = built(tmp_path, docs, shard=70)
    queries = [" ".join(rng.choice(COMMON + MIDDLE + RARE, size=int(rng.integers(1, 5)))) for _ in range(50)]
    assert index.search(queries, k) == [index.search([q], k)[0] for q in queries]


@pytest.mark.slow  # builds an index and searches it from eight threads (seconds)
def test_concurrent_readers_get_what_one_reader_gets(tmp_path):
    """The search keeps no state between calls, so threads sharing one index (as `retriever serve`'s
    do) each get the hits a lone caller gets."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    docs = [list(rng.choice(POOL, size=int(rng.integers(1, 12)))) for _ in range(500)]
    index = built(tmp_path, docs, shard=90)
    batches = [[" ".join(rng.choice(COMMON + MIDDLE + RARE, size=int(rng.integers(1, 5)))) for _ in range(20)]
               for _ in range(16)]
    alone = [index.search(batch, 3) for batch in batches]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda batch: index.search(batch, 3), batches * 4)) == alone * 4
