"""Figure 9: agreement and speed against Lucene BM25 as Search-R1's BM25 baseline computes it
(pyserini's Anserini, k1=0.9, b=0.4), on figure 8's generated corpus and queries.

Lucene needs a Java runtime and pyserini's Anserini jar, which the project's install does not
carry. The benchmark has its own set-up step::

    python -m searchr1.bench.lucene setup     # java (apt-get, if missing) + a venv with pyserini's jar

It makes ``$SEARCHR1_CACHE_DIR/lucene-bench`` (or ``~/.cache/searchr1/lucene-bench``): a
virtual environment with ``pyserini==0.22.1`` (its Anserini 0.22.1 fat jar, which runs on Java
11 or later) and ``pyjnius``, installed without dependencies; only the jar and pyjnius are used.
Measured: top-3 overlap (|ours ∩ Lucene| / 3, mean over queries Lucene answers with 3 hits),
queries per second of both (one query per call, single thread; and a whole batch, one thread),
and the index build rate of both (Lucene's ``IndexCollection`` with one thread).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

from searchr1.bench.report import Figure, Measure
from searchr1.core.types import Tokenizer

PYSERINI = "pyserini==0.22.1"
# Ours must answer a whole batch at least this much faster than Lucene (one query at a time: faster).
BATCHED_SPEEDUP_TARGET = 1.2


def bench_home() -> Path:
    from searchr1.runtime.tokenizer import cache_root

    return cache_root() / "lucene-bench"


def _python(home: Path) -> Path:
    return home / "bin" / "python"


def find_jar(home: Path) -> Path | None:
    found = sorted(glob.glob(str(home / "lib" / "python*" / "site-packages" / "pyserini" / "resources" / "jars"
                                / "anserini-*-fatjar.jar")))
    return Path(found[-1]) if found else None


def java_version() -> int | None:
    java = shutil.which("java")
    if java is None:
        return None
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    for token in (done.stderr + done.stdout).replace('"', " ").split():
        head = token.split(".")[0]
        if head.isdigit() and "." in token:
            return int(head) if head != "1" else int(token.split(".")[1])
    return None


def setup(home: Path | None = None) -> Path:
    """The set-up step: a Java runtime (from the system's packages when missing) and a virtual
    environment with the Anserini jar. Idempotent."""
    home = home or bench_home()
    if (java_version() or 0) < 11:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise SystemExit("Lucene needs Java 11 or later: install a JRE (e.g. apt-get install "
                             "openjdk-17-jre-headless) and run the set-up again")
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "openjdk-17-jre-headless"], check=True)
    if find_jar(home) is None or not _python(home).is_file():
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
        subprocess.run([str(_python(home)), "-m", "pip", "install", "-q", "--no-deps", PYSERINI, "pyjnius"], check=True)
    jar = find_jar(home)
    if jar is None:
        raise SystemExit(f"{PYSERINI} installed into {home} but holds no Anserini jar")
    print(f"Lucene benchmark ready: java {java_version()}, {jar}")
    return home


def _lucene_index(jar: Path, corpus_dir: Path, out: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(["java", "-cp", str(jar), "io.anserini.index.IndexCollection", "-collection",
                           "JsonCollection", "-input", str(corpus_dir), "-index", str(out), "-generator",
                           "DefaultLuceneDocumentGenerator", "-threads", "1", "-storeRaw"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Lucene indexing failed: {(done.stderr or done.stdout).strip()[-400:]}")
    return time.perf_counter() - started


def top3_overlap(ours: list[list[str]], theirs: list[list[str]]) -> tuple[float, int]:
    """Mean of |ours ∩ theirs| / 3 over the queries where ``theirs`` has 3 hits; and how many."""
    scores = [len(set(a[:3]) & set(b[:3])) / 3 for a, b in zip(ours, theirs) if len(b) >= 3]
    return (sum(scores) / len(scores) if scores else 0.0), len(scores)


def usable_jar(home: Path) -> Path | None:
    """The Anserini jar in ``home`` when Java 11 or later runs it, else None."""
    jar = find_jar(home)
    return jar if jar is not None and (java_version() or 0) >= 11 else None


def set_up_first(home: Path) -> str:
    """The one line saying that figure 9's Lucene side is not set up in ``home``, and how to set it up."""
    return (f"figure 9 needs its own set-up first: python -m searchr1.bench.lucene setup "
            f"(Java 11+ and {PYSERINI}'s Anserini jar in {home})")


def lucene_missing() -> str | None:
    """:func:`set_up_first`'s line when the Lucene side is not set up, else None."""
    home = bench_home()
    return None if usable_jar(home) is not None else set_up_first(home)


class LuceneAnswer(TypedDict):
    """What :mod:`.lucene_child` writes (it imports nothing of ours): the top hits of each query, one
    call at a time, and the seconds of both ways."""

    hits: list[list[str]]
    single_seconds: float
    batched_seconds: float


def lucene_search(corpus: Path, queries: list[str], threads: int = 1) -> tuple[float, LuceneAnswer] | None:
    """Lucene's index of ``corpus`` (its build seconds) and ``queries`` searched through it by
    :mod:`.lucene_child` (hits one per call, seconds one per call and as a batch on ``threads``
    threads); None when the Lucene side is not set up (:func:`setup`)."""
    home = bench_home()
    jar = usable_jar(home)
    if jar is None:
        return None
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-lucene-") as scratch:
        lucene_dir = Path(scratch) / "lucene"
        build_seconds = _lucene_index(jar, corpus.parent, lucene_dir)
        queries_file, out_file = Path(scratch) / "queries.json", Path(scratch) / "hits.json"
        queries_file.write_text(json.dumps(queries), "utf-8")
        child = Path(__file__).with_name("lucene_child.py")
        done = subprocess.run([str(_python(home)), str(child), str(jar), str(lucene_dir), str(queries_file),
                               str(out_file), str(threads)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"Lucene search failed: {done.stderr.strip()[-400:]}")
        answer: LuceneAnswer = json.loads(out_file.read_text("utf-8"))
        return build_seconds, answer


def lucene_figure(tokenizer: Tokenizer | None = None, *, seed: int = 0, quick: bool = False,
                  passages: int | None = None) -> Figure:
    from searchr1.bm25.index import BM25Index
    from searchr1.bm25.synthetic import heaps_queries
    from searchr1.bench.local_search import FULL_PASSAGES, QUICK_PASSAGES, shared_corpus, shared_index

    begun = time.perf_counter()
    home = bench_home()
    jar = usable_jar(home)
    if jar is None:  # before the corpus and the index are paid for
        raise RuntimeError(set_up_first(home))
    count = passages or (QUICK_PASSAGES if quick else FULL_PASSAGES)
    queries = heaps_queries(200 if quick else 1000, seed=seed)
    corpus, _ = shared_corpus(count, seed)
    ours_dir, _ = shared_index(count, seed)
    index = BM25Index(ours_dir)
    searched = lucene_search(corpus, queries)
    if searched is None:
        raise RuntimeError("the Lucene set-up went away during figure 9")
    lucene_build, lucene = searched
    index.search(queries[:50], 3)
    started = time.perf_counter()
    ours_hits = [[h.id for h in index.search([q], 3)[0]] for q in queries]
    ours_single = time.perf_counter() - started
    started = time.perf_counter()
    index.search(queries, 3)
    ours_batched = time.perf_counter() - started
    overlap, compared = top3_overlap(ours_hits, lucene["hits"])
    n = len(queries)
    measures = [
        Measure("top3_overlap", "top-3 overlap with Lucene BM25", overlap, target=0.9, comparator=">="),
        Measure("single_speedup", "queries/s one per call, ours / Lucene", lucene["single_seconds"] / ours_single,
                target=1.0, comparator=">=", unit="x"),
        Measure("batched_speedup", "queries/s whole batch, ours / Lucene", lucene["batched_seconds"] / ours_batched,
                target=BATCHED_SPEEDUP_TARGET, comparator=">=", unit="x", target_source="issue"),
        Measure("ours_single_qps", "ours, queries/s one per call", n / ours_single, unit="/s", digits=0),
        Measure("lucene_single_qps", "Lucene, queries/s one per call", n / lucene["single_seconds"], unit="/s",
                digits=0),
        Measure("ours_batched_qps", "ours, queries/s whole batch", n / ours_batched, unit="/s", digits=0),
        Measure("lucene_batched_qps", "Lucene, queries/s whole batch", n / lucene["batched_seconds"], unit="/s",
                digits=0),
        Measure("lucene_build_passages_per_second", "Lucene index build, passages/s (1 thread)", count / lucene_build,
                unit="/s", digits=0),
    ]
    details: dict[str, object] = {"passages": count, "queries": n, "compared_queries": compared, "java": java_version(),
               "anserini_jar": jar.name, "ours_single_seconds": ours_single, "ours_batched_seconds": ours_batched,
               "lucene_single_seconds": lucene["single_seconds"], "lucene_batched_seconds": lucene["batched_seconds"],
               "lucene_build_seconds": lucene_build}
    figure = Figure(9, "lucene_agreement", f"agreement and speed against Lucene BM25 ({count:,} passages)",
                  measures, details)
    figure.seconds = time.perf_counter() - begun
    return figure


if __name__ == "__main__":
    if sys.argv[1:] == ["setup"]:
        setup()
    else:
        sys.exit("usage: python -m searchr1.bench.lucene setup")
