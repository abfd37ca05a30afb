"""The shipped offline corpus (``searchr1/offline/corpus.jsonl``) and its index.

The corpus is generated, never edited: ``python cli.py index offline-corpus`` writes it from
the passages the cassette specs hold (``cassettes/specs/offline.json`` and ``demo.json``),
each followed by distractors that share its title words (``"<title> (album)"`` …) and a bulk
of generated passages (:mod:`searchr1.bm25.synthetic`), so BM25 has real competition. The
generator checks that every hop query of the offline world still finds its own passage first;
``--check`` fails when the file differs from what the sources produce.

``train --offline --backend local`` and ``eval --offline --backend local`` use
:func:`offline_index`: the index of that corpus, built once into the user cache
(``$SEARCHR1_CACHE_DIR`` or ``~/.cache/searchr1``) under the corpus's sha256.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from searchr1.offline import CASSETTE_SPEC, OFFLINE_DIR, REPO_ROOT
from searchr1.bm25.corpus import passage_row
from searchr1.bm25.synthetic import synthetic_passages, vocabulary
from searchr1.run.fileio import file_sha256
from searchr1.runtime import invocation

CORPUS = OFFLINE_DIR / "corpus.jsonl"
SPEC_SOURCES = (CASSETTE_SPEC, REPO_ROOT / "cassettes" / "specs" / "demo.json")
DISTRACTOR_SUFFIXES = ("album", "film", "band", "novel", "ship")
BULK_PASSAGES = 1000
SEED = 20


def spec_passages(paths: tuple[Path, ...] = SPEC_SOURCES) -> list[tuple[str, str]]:
    """Every distinct ``(title, text)`` the specs' canned results hold, in file order."""
    seen: dict[tuple[str, str], None] = {}
    for path in paths:
        spec = json.loads(path.read_text("utf-8"))
        for query in spec["queries"]:
            for result in query.get("results", []):
                text = (result.get("text") or "").strip()
                if text:
                    seen.setdefault((result["title"].strip(), text), None)
    return list(seen)


def _distractor(title: str, text: str, suffix: str, rng: np.random.Generator, filler: list[str]) -> tuple[str, str]:
    """A passage about another "<title> (suffix)": the title's words, a few of the original's
    words out of order, and generated filler."""
    words = [w for w in text.split() if w.isalpha()]
    picked = [words[int(i)] for i in rng.integers(0, len(words), size=min(4, len(words)))] if words else []
    body = [filler[int(i)] for i in rng.integers(0, len(filler), size=40)]
    return f"{title} ({suffix})", (f"It is a {suffix}: " + " ".join(picked + body) + ".")


def build_corpus_text(paths: tuple[Path, ...] = SPEC_SOURCES, *, bulk: int = BULK_PASSAGES, seed: int = SEED) -> str:
    """The whole corpus file (pure given the spec files)."""
    rng = np.random.default_rng(seed)
    filler = vocabulary(2000, seed)
    rows: list[str] = []
    for number, (title, text) in enumerate(spec_passages(paths)):
        rows.append(passage_row(f"cassette-{number}", title, text))
        for suffix in rng.choice(DISTRACTOR_SUFFIXES, size=3, replace=False).tolist():
            d_title, d_text = _distractor(title, text, suffix, rng, filler)
            rows.append(passage_row(f"cassette-{number}-{suffix}", d_title, d_text))
    for ident, title, text in synthetic_passages(bulk, seed=seed, vocab_size=5000, id_prefix="filler"):
        rows.append(passage_row(ident, title, text))
    return "".join(rows)


def offline_index(corpus: Path = CORPUS) -> Path:
    """The index of the shipped corpus, built into the user cache on first use."""
    from searchr1.runtime.tokenizer import cache_root
    from searchr1.bm25.index import BM25IndexError, build_index, read_manifest
    from searchr1.run.fileio import exclusive_lock

    if not corpus.is_file():
        raise BM25IndexError(f"the shipped corpus {corpus} is missing; regenerate it with "
                             f"`{invocation.command('index offline-corpus')}` (or reinstall the package)")
    sha = file_sha256(corpus)
    directory = cache_root() / "indexes" / f"offline-{sha[:16]}"
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Processes that start together (parallel tests, two commands) build it once, in turn.
    with exclusive_lock(directory.parent / f".{directory.name}.lock", f"the offline index {directory}", wait=True):
        try:
            if read_manifest(directory)["corpus"]["sha256"] == sha:
                return directory
        except BM25IndexError:
            pass
        build_index(corpus, directory, overwrite=True)
    return directory


def check_hops_found(text: str, k: int = 3) -> list[str]:
    """Each offline hop query whose own passage is not among its first ``k`` hits (the default
    top-3) over ``text`` (built into a temporary index): the generator refuses such a corpus,
    since the offline policies read a hop as found only when its passage is in the observation."""
    import tempfile

    from searchr1.bm25.index import BM25Index, build_index
    from searchr1.offline import load_source

    with tempfile.TemporaryDirectory(prefix="searchr1-corpus-check-") as scratch:
        corpus = Path(scratch) / "corpus.jsonl"
        corpus.write_text(text, "utf-8")
        build_index(corpus, Path(scratch) / "index")
        index = BM25Index(Path(scratch) / "index")
        source = load_source()  # the offline question set, train first
        hops = [hop for split in ("train", "dev") for question in source[split] for hop in question["hops"]]
        hits = index.search([hop["query"] for hop in hops], k=k)
        problems = []
        for hop, top in zip(hops, hits):
            if f'"{hop["title"]}"\n{hop["text"]}' not in [hit.contents for hit in top]:
                found = ", ".join(hit.contents.splitlines()[0] for hit in top) or "nothing"
                problems.append(f"{hop['query']!r} finds {found}")
        del index
        return problems
