"""Generated corpora: deterministic, Wikipedia-shaped passages for tests and benchmarks, and
the distractors of the shipped offline corpus.

Words are pseudo-words built from syllables (so the stemmer and the stopword list have real
work but never collapse two of them by accident), drawn with a Zipf-like frequency as natural
text is; a passage has a two-word title and about 100 words of text, as wiki-18's passages do.
Everything is a pure function of its arguments (numpy's seeded generator).
"""

from __future__ import annotations

from collections.abc import Iterator

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


def sample_queries(count: int, *, seed: int = 0, corpus_seed: int = 0, vocab_size: int = 50_000) -> list[str]:
    """Queries for a :func:`synthetic_passages` corpus, shaped like typed ones: a stopword, a
    common word, a middling one and two rarer ones (so posting lists of every length are read)."""
    vocab = vocabulary(vocab_size, corpus_seed)
    rng = np.random.default_rng(seed + 7)
    bands = ((10, 500), (500, 5000), (5000, vocab_size), (5000, vocab_size))
    queries = []
    for _ in range(count):
        words = [STOP_FILLERS[int(rng.integers(0, len(STOP_FILLERS)))]]
        words += [vocab[int(rng.integers(low, high))] for low, high in bands]
        queries.append(" ".join(words))
    return queries
