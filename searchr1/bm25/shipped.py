"""The shipped offline corpus (``searchr1/offline/corpus.jsonl``) and its index.

The corpus is generated, never edited: ``python cli.py index offline-corpus`` writes it from
the passages the cassette specs hold (``cassettes/specs/offline.json`` and ``demo.json``),
each followed by distractors that share its title words (``"<title> (album)"`` …) and a bulk
of generated passages (:mod:`searchr1.bm25.synthetic`), so BM25 has real competition. Last come
the pages of the page questions (``searchr1/offline/pages.json``): each page's lead and body
passages under its title, then three distractors that hold the title and the hop's query, so
the page's body ranks below them. The generator checks that every hop query of the offline
world finds its own passage among the first three, and that a page hop's query finds its lead
there but not its evidence (which only ``open_page`` reaches); ``--check`` fails when the file
differs from what the sources produce.

``train --offline --backend local`` and ``eval --offline --backend local`` use
:func:`offline_index`: the index of that corpus, built once into the user cache
(``$SEARCHR1_CACHE_DIR`` or ``~/.cache/searchr1``) under the corpus's sha256.
"""

from __future__ import annotations

import json
from pathlib import Path
import numpy as np

from searchr1.offline import CASSETTE_SPEC, OFFLINE_DIR, PAGES, REPO_ROOT, Hop, load_source
from searchr1.bm25.corpus import passage_row
from searchr1.bm25.synthetic import synthetic_passages, vocabulary
from searchr1.basics.fileio import file_sha256
from searchr1.basics import invocation

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
    rows += page_rows(page_hops(), filler)
    return "".join(rows)


def page_hops(path: Path = PAGES) -> list[Hop]:
    """Every page hop of the page questions, each page once, in file order."""
    source = load_source(path)
    pages: dict[str, Hop] = {}
    for split in ("train", "dev"):
        for question in source[split]:
            for hop in question["hops"]:
                if "lead" in hop and pages.setdefault(hop["title"], hop) != hop:
                    raise ValueError(f"{path}: page {hop['title']!r} is written twice, differently")
    return list(pages.values())


def page_rows(hops: list[Hop], filler: list[str]) -> list[str]:
    """Each page's passages (``page-<n>-<k>``, lead first) and three distractors holding its
    title and query words with generated filler (``page-<n>-<suffix>``); pure."""
    rows = []
    for number, hop in enumerate(hops):
        for position, text in enumerate([hop["lead"], *hop["body"]], start=1):
            rows.append(passage_row(f"page-{number}-{position}", hop["title"], text))
        rng = np.random.default_rng([SEED, number])
        for suffix in DISTRACTOR_SUFFIXES[:3]:
            body = " ".join(filler[int(i)] for i in rng.integers(0, len(filler), size=30))
            rows.append(passage_row(f"page-{number}-{suffix}", f"{hop['title']} ({suffix})",
                                    f"It is a {suffix}: {hop['query']} {body}."))
    return rows


def offline_index(corpus: Path = CORPUS) -> Path:
    """The index of the shipped corpus, built into the user cache on first use."""
    from searchr1.runtime.tokenizer import cache_root
    from searchr1.bm25.index import BM25IndexError, build_index, read_manifest
    from searchr1.basics.fileio import exclusive_lock

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
    """Each offline hop query whose own passage (a page hop's lead) is not among its first ``k``
    hits (the default top-3) over ``text`` (built into a temporary index), and each page hop
    query that finds its evidence there: the generator refuses such a corpus, since the offline
    policies read a hop as found only when its passage is in the observation."""
    import tempfile

    from searchr1.bm25.index import BM25Index, build_index

    with tempfile.TemporaryDirectory(prefix="searchr1-corpus-check-") as scratch:
        corpus = Path(scratch) / "corpus.jsonl"
        corpus.write_text(text, "utf-8")
        build_index(corpus, Path(scratch) / "index")
        index = BM25Index(Path(scratch) / "index")
        hops = [hop for source in (load_source(), load_source(PAGES)) for split in ("train", "dev")
                for question in source[split] for hop in question["hops"]]
        hits = index.search([hop["query"] for hop in hops], k=k)
        problems = []
        for hop, top in zip(hops, hits):
            shown = [hit.contents for hit in top]
            found = ", ".join(hit.contents.splitlines()[0] for hit in top) or "nothing"
            if f'"{hop["title"]}"\n{hop.get("lead") or hop["text"]}' not in shown:
                problems.append(f"{hop['query']!r} finds {found}")
            elif "lead" in hop and f'"{hop["title"]}"\n{hop["text"]}' in shown:
                problems.append(f"{hop['query']!r} finds the evidence of page {hop['title']!r} without opening it")
        del index
        return problems
