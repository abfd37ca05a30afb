"""The generated corpus whose vocabulary grows as wiki-18's: the two-regime Zipf law, its fit to
wiki-18's published statistics, its word spelling, and the vocabulary an index build finds."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.bm25.corpus import passage_row
from searchr1.bm25.index import build_index, make_tokenizer
from searchr1.bm25.synthetic import (
    WIKI18_TERMS,
    WIKI18_VOCABULARY,
    TwoRegimeZipf,
    heaps_passages,
    heaps_queries,
    ranked_word,
    wiki18_law,
)

LAW = TwoRegimeZipf(5_000.0)
TOKENIZER = make_tokenizer()


@given(st.integers(min_value=0, max_value=2 ** 40), st.integers(min_value=0, max_value=2 ** 40))
def test_distinct_ranks_spell_distinct_words(first: int, second: int) -> None:
    assert (ranked_word(first) == ranked_word(second)) == (first == second)


@given(st.integers(min_value=0, max_value=2 ** 40))
def test_a_word_survives_the_index_tokenizer_whole(rank: int) -> None:
    """At least two syllables, no stopword, one token; the stemmer may trim its end, never split it."""
    word = ranked_word(rank)
    (tokens,) = TOKENIZER.tokenize([word], update_vocab=True, return_as="string", show_progress=False)
    assert len(tokens) == 1 and len(tokens[0]) >= 2 and word.startswith(tokens[0])


@given(st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
       st.floats(min_value=2.0, max_value=1e7))
def test_ranks_invert_the_cdf(uniform: float, kink: float) -> None:
    """A draw ``u`` lands on the rank whose interval ``[F(r+1), F(r+2))`` holds it."""
    law = TwoRegimeZipf(kink)
    rank = int(law.ranks(np.array([uniform]))[0])
    low, high = law.cdf(np.array([rank + 1.0, rank + 2.0]))
    assert 0 <= rank < 2 ** 40
    if rank + 1 < 2 ** 40 - 1:  # below the cap every draw lands in its own rank's interval
        assert low - 1e-9 <= uniform < high + 1e-9


def test_cdf_is_a_distribution() -> None:
    edges = np.array([1.0, LAW.kink, 1e30])
    assert LAW.cdf(edges)[0] == 0.0
    assert LAW.cdf(edges)[1] == pytest.approx(math.log(LAW.kink) / LAW.normaliser)
    assert LAW.cdf(edges)[2] == pytest.approx(1.0)


@pytest.mark.parametrize("tokens", [10_000, 300_000, 3_000_000])
def test_expected_vocabulary_matches_draws(tokens: int) -> None:
    """The closed form against counting distinct ranks of that many draws, within five standard
    deviations (the count is a sum of negatively associated indicators, one per rank seen, so its
    variance is at most its mean)."""
    drawn = LAW.ranks(np.random.default_rng(tokens).random(tokens))
    expected = LAW.expected_vocabulary(tokens)
    assert len(np.unique(drawn)) == pytest.approx(expected, abs=5 * math.sqrt(expected))


def test_the_fitted_law_gives_wiki18_its_vocabulary_and_heaps_growth() -> None:
    law = wiki18_law()
    assert law.expected_vocabulary(WIKI18_TERMS) == pytest.approx(WIKI18_VOCABULARY, rel=1e-3)
    # Past the kink the vocabulary grows as K n^(1/2): quadrupling the tokens doubles it.
    grown = law.expected_vocabulary(4 * WIKI18_TERMS) / law.expected_vocabulary(WIKI18_TERMS)
    assert grown == pytest.approx(2.0, rel=0.03)
    assert law.expected_vocabulary(WIKI18_TERMS) == pytest.approx(law.heaps_k * math.sqrt(WIKI18_TERMS), rel=0.01)


def test_passages_are_deterministic_and_wiki18_shaped() -> None:
    first = list(heaps_passages(300, seed=3))
    assert first == list(heaps_passages(300, seed=3))
    assert first != list(heaps_passages(300, seed=4))
    assert len({ident for ident, _, _ in first}) == 300
    tokenizer = make_tokenizer()
    indexed = [len(tokens) for tokens in tokenizer.tokenize([f"{t}\n{x}" for _, t, x in first],
                                                             return_as="string", show_progress=False)]
    assert sum(indexed) / len(indexed) == pytest.approx(WIKI18_TERMS / 21_015_324, rel=0.05)
    assert all(len(title.split()) == 2 for _, title, _ in first)


def test_queries_are_deterministic_five_words() -> None:
    queries = heaps_queries(20, seed=2)
    assert queries == heaps_queries(20, seed=2)
    assert all(len(q.split()) == 5 for q in queries)


@pytest.mark.slow  # builds an index of 5,000 passages
def test_an_index_build_finds_the_laws_vocabulary(tmp_path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as out:
        for ident, title, text in heaps_passages(5_000, seed=5):
            out.write(passage_row(ident, title, text))
    manifest = build_index(corpus, tmp_path / "index", workers=1)
    assert manifest["vocabulary"] == pytest.approx(wiki18_law().expected_vocabulary(manifest["tokens"]), rel=0.02)


@functools.cache
def whole() -> list[tuple[str, str, str]]:
    """45 passages generated at once (on first use: the law's fit and the word table take a
    second, which collecting the tests should not pay)."""
    return list(heaps_passages(45, seed=0))


@settings(max_examples=20)
@given(st.integers(min_value=1, max_value=46))
def test_the_chunk_size_does_not_change_the_corpus(chunk: int) -> None:
    """Generating chunk by chunk (constant memory) gives the corpus generated at once."""
    assert list(heaps_passages(45, seed=0, chunk=chunk)) == whole()
