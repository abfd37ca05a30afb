"""Runs inside the Lucene benchmark's own environment (not the project's): Anserini's BM25
through pyjnius, as pyserini's LuceneSearcher does, without pyserini's Python package (which
would pull torch and pandas). Standard library and pyjnius only; never imports searchr1.

    python lucene_child.py JAR INDEX QUERIES.json OUT.json [THREADS]

The whole batch is searched with THREADS threads (1 unless given).
"""

import json
import sys
import time


def main(jar: str, index: str, queries_path: str, out_path: str, threads: str = "1") -> None:
    import jnius_config

    jnius_config.set_classpath(jar)
    from jnius import autoclass

    searcher = autoclass("io.anserini.search.SimpleSearcher")(index)
    searcher.set_bm25(0.9, 0.4)  # pyserini's defaults, which Search-R1's BM25 server keeps
    queries = json.load(open(queries_path, encoding="utf-8"))
    for query in queries[:50]:  # warm the JIT and the page cache
        searcher.search(query, 3)
    started = time.perf_counter()
    hits = [[h.docid for h in searcher.search(query, 3)] for query in queries]
    single = time.perf_counter() - started
    array_list = autoclass("java.util.ArrayList")
    texts, ids = array_list(), array_list()
    for number, query in enumerate(queries):
        texts.add(query)
        ids.add(str(number))
    started = time.perf_counter()
    searcher.batch_search(texts, ids, 3, int(threads))
    batched = time.perf_counter() - started
    json.dump({"hits": hits, "single_seconds": single, "batched_seconds": batched}, open(out_path, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:6])
