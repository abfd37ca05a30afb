"""Generated corpora: deterministic, Wikipedia-shaped passages for tests and benchmarks, and
the distractors of the shipped offline corpus.

Words are pseudo-words built from syllables (so the stemmer and the stopword list have real
work but never collapse two of them by accident), drawn with a Zipf-like frequency as natural
text is; a passage has a two-word title and about 100 words of text, as wiki-18's passages do.
Everything is a pure function of its arguments (numpy's seeded generator).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

SYLLABLES = ("ka", "lo", "mi", "ser", "tan", "vo", "du", "pel", "ri", "gon", "sha", "bel", "nu", "tor",
             "fi", "zan", "quo", "ma", "dre", "lin", "ost", "par", "yen", "hu")
STOP_FILLERS = ("the", "of", "and", "in", "was", "a", "is", "to", "by", "for")


def vocabulary(size: int, seed: int = 0) -> list[str]:
    """``size`` distinct pseudo-words of two to four syllables."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        parts = rng.integers(0, len(SYLLABLES), size=int(rng.integers(2, 5)))
        word = "".join(SYLLABLES[p] for p in parts)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _zipf_weights(size: int, exponent: float = 1.07) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** exponent
    return weights / weights.sum()


def synthetic_passages(count: int, *, seed: int = 0, words: int = 100, vocab_size: int = 50_000,
                       id_prefix: str = "syn", chunk: int = 4096) -> Iterator[tuple[str, str, str]]:
    """``count`` passages as ``(id, title, text)``, generated chunk by chunk (constant memory);
    about 30% of the words are common stopwords, the rest pseudo-words of Zipf frequency."""
    table = vocabulary(vocab_size, seed) + list(STOP_FILLERS)
    probabilities = np.concatenate([_zipf_weights(vocab_size) * 0.7,
                                    np.full(len(STOP_FILLERS), 0.3 / len(STOP_FILLERS))])
    cdf = np.cumsum(probabilities)
    cdf /= cdf[-1]
    word = table.__getitem__
    rng = np.random.default_rng(seed + 1)
    made = 0
    while made < count:
        n = min(chunk, count - made)
        drawn = np.searchsorted(cdf, rng.random((n, words)), side="right").tolist()
        titles = rng.integers(100, vocab_size, size=(n, 2)).tolist()
        for i in range(n):
            title = f"{table[titles[i][0]].capitalize()} {table[titles[i][1]].capitalize()}"
            yield f"{id_prefix}-{made + i}", title, " ".join(map(word, drawn[i])) + "."
        made += n


# ------------------------------------------------------------------ Wikipedia's vocabulary growth

# wiki-18 as Lucene's English analysis sees it (lowercase, stopwords out, Porter stems): Pyserini's
# prebuilt ``wikipedia-dpr-100w`` index statistics (castorini/pyserini,
# pyserini/resources/prebuilt-indexes/lucene/other-inverted.json).
WIKI18_PASSAGES = 21_015_324
WIKI18_TERMS = 1_512_973_244
WIKI18_VOCABULARY = 5_345_516
# Indexed terms of a generated passage: two title words and, of 100 words, 30% stopwords on average
# (wiki-18 indexes 1,512,973,244 / 21,015,324 = 72.0 terms a passage).
STOPWORD_SHARE = 0.3
TITLE_WORDS = 2
_RANK_CAP = 2 ** 40  # the tail's draws are cut here (probability below 1e-7 at the fitted kink)


@dataclass(frozen=True)
class TwoRegimeZipf:
    """Word frequency by rank in two regimes, as measured on large English corpora (Ferrer i
    Cancho and Solé 2001, "Two regimes in the frequency of words and the origin of complex
    lexicons", J. Quant. Linguistics 8(3)): density ``1/x`` up to ``kink``, ``kink/x²`` beyond,
    over an unbounded vocabulary; a word's rank is ``floor(x) - 1``.

    The tail's exponent 2 makes the vocabulary of ``n`` tokens grow as Heaps' law ``K n^β`` with
    ``β = 1/2`` (the value *Introduction to Information Retrieval* §5.1.1 gives as typical; 0.49
    fitted on RCV1) and ``K = sqrt(π kink / Z)``, ``Z = ln(kink) + 1``. :meth:`fitted` picks the
    kink so that wiki-18's token count gives wiki-18's vocabulary.
    """

    kink: float

    @property
    def normaliser(self) -> float:
        return math.log(self.kink) + 1.0

    @property
    def heaps_k(self) -> float:
        """``K`` of the Heaps' law the tail approaches (``β = 1/2``)."""
        return math.sqrt(math.pi * self.kink / self.normaliser)

    def ranks(self, uniform: np.ndarray) -> np.ndarray:
        """Word ranks (0 the most frequent) for uniform draws in ``[0, 1)``, by the inverse CDF."""
        mass = uniform * self.normaliser
        head_mass = math.log(self.kink)
        tail = np.maximum(1.0 - (mass - head_mass), self.kink / _RANK_CAP)
        x = np.where(mass < head_mass, np.exp(np.minimum(mass, head_mass)), self.kink / tail)
        return np.floor(x).astype(np.int64) - 1

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """P(draw < x) for ``x >= 1``."""
        head = np.log(np.minimum(x, self.kink))
        tail = np.where(x > self.kink, 1.0 - self.kink / np.maximum(x, self.kink), 0.0)
        return (head + tail) / self.normaliser

    def expected_vocabulary(self, tokens: float, *, explicit_ranks: int = 1_000_000) -> float:
        """Expected distinct words among ``tokens`` draws: the sum over ranks of
        ``1 - (1 - p)^tokens``, ranks past ``explicit_ranks`` by its integral
        ``∫ (1 - exp(-a/r²)) dr = sqrt(πa) erf(sqrt(a)/R) - R (1 - exp(-a/R²))``, ``a = tokens kink / Z``."""
        edges = np.arange(1, explicit_ranks + 2, dtype=np.float64)
        p = np.diff(self.cdf(edges))
        seen = float(-np.expm1(tokens * np.log1p(-np.minimum(p, 1 - 1e-16))).sum())
        a = tokens * self.kink / self.normaliser
        edge = float(explicit_ranks) + 1.0
        rest = math.sqrt(math.pi * a) * math.erf(math.sqrt(a) / edge) + edge * math.expm1(-a / edge ** 2)
        return seen + rest

    @classmethod
    def fitted(cls, tokens: float = WIKI18_TERMS, vocabulary: float = WIKI18_VOCABULARY) -> TwoRegimeZipf:
        """The law whose expected vocabulary of ``tokens`` draws is ``vocabulary``: regula falsi
        (the Illinois variant) on the kink's logarithm, where the vocabulary grows with the kink;
        each step cuts the bracket where the line through its ends crosses the target, so it
        closes in about ten evaluations where halving takes sixty."""

        def excess(log_kink: float) -> float:
            return cls(math.exp(log_kink)).expected_vocabulary(tokens) - vocabulary

        low, high = math.log(10.0), math.log(1e9)
        below, above = excess(low), excess(high)
        kept = 0  # which end stayed last time (-1 low, +1 high): the Illinois rule halves its value
        while high - low > 1e-12 * abs(high):
            middle = (low * above - high * below) / (above - below)
            found = excess(middle)
            if abs(found) <= 1e-12 * vocabulary:  # as close as the float sum over ranks can tell
                return cls(math.exp(middle))
            if found < 0.0:
                low, below = middle, found
                above = above / 2 if kept == 1 else above
                kept = 1
            else:
                high, above = middle, found
                below = below / 2 if kept == -1 else below
                kept = -1
        return cls(math.exp((low + high) / 2))


@functools.lru_cache(maxsize=1)
def wiki18_law() -> TwoRegimeZipf:
    """The two-regime law fitted to wiki-18's published vocabulary (a few seconds, once)."""
    return TwoRegimeZipf.fitted()


_DIGIT_BASE = len(SYLLABLES)
_TABLE_SIZE = _DIGIT_BASE ** 4


@functools.lru_cache(maxsize=1)
def _word_tables() -> tuple[list[str], list[str]]:
    """Syllable spellings of ``0 .. 24⁴-1`` in base 24: without leading zeros, and padded to four
    syllables."""
    # the most significant syllable first, so the n-th spelling is the one of n
    padded = [a + b + c + d for a, b, c, d in itertools.product(SYLLABLES, repeat=4)]
    short = list(SYLLABLES)
    for value in range(_DIGIT_BASE, _TABLE_SIZE):
        short.append(short[value // _DIGIT_BASE] + SYLLABLES[value % _DIGIT_BASE])
    return short, padded


def ranked_word(rank: int) -> str:
    """The word of a rank: the syllables of ``rank + 24`` in base 24, so at least two. No syllable
    is the prefix of another, so distinct ranks spell distinct words."""
    short, padded = _word_tables()
    value = rank + _DIGIT_BASE
    spelled = ""
    while value >= _TABLE_SIZE:
        value, low = divmod(value, _TABLE_SIZE)
        spelled = padded[low] + spelled
    return short[value] + spelled


def heaps_passages(count: int, *, seed: int = 0, words: int = 100, id_prefix: str = "wiki",
                   chunk: int = 4096, law: TwoRegimeZipf | None = None) -> Iterator[tuple[str, str, str]]:
    """``count`` passages as ``(id, title, text)`` whose vocabulary grows as wiki-18's does:
    words of :func:`wiki18_law` (or ``law``), 30% stopwords, two title words; generated chunk by
    chunk (memory bounded by a chunk and the word table)."""
    law = law or wiki18_law()
    short, _ = _word_tables()
    stops = len(STOP_FILLERS)
    head = len(short) - _DIGIT_BASE  # ranks spelled straight from the table
    table = list(STOP_FILLERS) + short[_DIGIT_BASE:]
    rng = np.random.default_rng(seed + 11)
    made = 0
    while made < count:
        n = min(chunk, count - made)
        uniform = rng.random((n, TITLE_WORDS + words))
        stop = uniform < STOPWORD_SHARE
        stop[:, :TITLE_WORDS] = False
        content = np.where(stop, 0.0, (uniform - STOPWORD_SHARE) / (1 - STOPWORD_SHARE))
        content[:, :TITLE_WORDS] = uniform[:, :TITLE_WORDS]
        codes = law.ranks(content) + stops
        codes[stop] = (uniform[stop] * (stops / STOPWORD_SHARE)).astype(np.int64).clip(0, stops - 1)
        rare = codes >= head + stops
        spelled = table
        if rare.any():
            tail, where = np.unique(codes[rare] - stops, return_inverse=True)
            spelled = table + [ranked_word(int(r)) for r in tail]
            codes[rare] = len(table) + where
        rows = codes.tolist()
        word = spelled.__getitem__
        for i, row in enumerate(rows):
            title = f"{spelled[row[0]].capitalize()} {spelled[row[1]].capitalize()}"
            yield f"{id_prefix}-{made + i}", title, " ".join(map(word, row[TITLE_WORDS:])) + "."
        made += n


def heaps_queries(count: int, *, seed: int = 0) -> list[str]:
    """Queries for a :func:`heaps_passages` corpus, shaped like typed ones: a stopword, a common
    word, a middling one and two rarer ones (ranks up to half a million, as a question's names are)."""
    rng = np.random.default_rng(seed + 13)
    bands = ((10, 500), (500, 5_000), (5_000, 50_000), (50_000, 500_000))
    queries = []
    for _ in range(count):
        words = [STOP_FILLERS[int(rng.integers(0, len(STOP_FILLERS)))]]
        words += [ranked_word(int(rng.integers(low, high))) for low, high in bands]
        queries.append(" ".join(words))
    return queries
