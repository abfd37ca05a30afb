"""Figure 8: BM25 of our own over a generated corpus of wiki-18's size (21,015,324 passages;
``--passages`` scales it down).

Measured in one run: the index build (``index build`` in a child process: passages per second
and the child's peak resident memory, bounded at 6 GB), query throughput in process (one query
per call against batches of 256 per call, same queries), and ``retriever serve`` under
concurrent load on loopback (a child process; 16 clients each sending one query per request):
its start-up time, its resident memory beyond the page cache (anonymous pages, bounded at 4 GB),
p50 and p95 latency and requests per second. The corpus comes from
:func:`searchr1.bm25.synthetic.heaps_passages`: pseudo-words whose vocabulary grows as wiki-18's
does (a two-regime Zipf law fitted to wiki-18's published 5,345,516 terms over 1,512,973,244
tokens), about 72 indexed terms a passage as wiki-18's; the figure prints the vocabulary the build
found beside the law's expectation. Run it with ``python cli.py bench --only 8`` (not part of the
default run; about 40 minutes on two cores at full size, most of it the corpus and the build).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.bench.report import Figure, Measure
from searchr1.core.types import Tokenizer

if TYPE_CHECKING:
    from searchr1.bm25.index import BM25Index


FULL_PASSAGES = 1_000_000  # figure 9 (against Lucene)
WIKI18_PASSAGES = 21_015_324  # figure 8
BUILD_PEAK_BOUND_MB = 6 * 1024
SERVE_ANON_BOUND_MB = 4 * 1024
QUICK_PASSAGES = 20_000
BATCH = 256
CLIENTS = 16


def write_corpus(path: Path, passages: int, seed: int) -> None:
    from searchr1.bm25.corpus import passage_row
    from searchr1.bm25.synthetic import heaps_passages

    with path.open("w", encoding="utf-8") as out:
        for ident, title, text in heaps_passages(passages, seed=seed):
            out.write(passage_row(ident, title, text))


def measured_build(corpus: Path, out: Path) -> dict[str, float]:
    """``index build`` in a child process; its wall time and peak resident memory."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "searchr1.bench.local_search", "build", str(corpus), str(out)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"index build failed: {done.stderr.strip()[-500:]}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    child["wall_seconds"] = time.perf_counter() - started
    return child


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _load(url: str, queries: list[str], clients: int) -> tuple[list[float], float]:
    import httpx

    latencies: list[float] = []
    position = 0

    async def client(session: httpx.AsyncClient) -> None:
        nonlocal position
        while position < len(queries):
            query = queries[position]
            position += 1
            started = time.perf_counter()
            response = await session.post(url, json={"queries": [query], "topk": 3, "return_scores": True})
            response.raise_for_status()
            latencies.append(time.perf_counter() - started)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return latencies, time.perf_counter() - started


def served_load(index: Path, queries: list[str], clients: int = CLIENTS, workers: int = 1) -> dict[str, float]:
    """``retriever serve`` (``workers`` processes) in a child process, answering ``queries`` from
    ``clients`` concurrent clients, one query a request, after a warm-up; its latencies,
    throughput, start-up time and memory (summed over its worker processes)."""
    import httpx

    port = _free_port()
    command = [sys.executable, "-m", "searchr1.cli", "retriever", "serve", "--index", str(index), "--port", str(port)]
    if workers > 1:
        command += ["--workers", str(workers)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                said = server.stderr.read() if server.stderr is not None else b""
                raise RuntimeError("retriever serve did not start: " + said.decode()[-300:])
            time.sleep(0.2)
        start_seconds = time.monotonic() - started
        url = f"http://127.0.0.1:{port}/retrieve"
        asyncio.run(_load(url, queries[: clients * 2 * workers], clients))  # warm up connections and pages
        server_cpu, client_cpu = _tree_cpu_seconds(server.pid), _own_cpu_seconds()
        latencies, seconds = asyncio.run(_load(url, queries, clients))
        server_cpu, client_cpu = _tree_cpu_seconds(server.pid) - server_cpu, _own_cpu_seconds() - client_cpu
        memory = _tree_resident_mb(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"requests": len(latencies), "seconds": seconds, "p50_ms": 1000 * _percentile(latencies, 0.5),
            "p95_ms": 1000 * _percentile(latencies, 0.95), "requests_per_second": len(latencies) / seconds,
            "start_seconds": start_seconds, "workers": workers,
            "server_cpu_ms_per_request": 1000 * server_cpu / len(latencies),
            "client_cpu_ms_per_request": 1000 * client_cpu / len(latencies), **memory}


def _own_cpu_seconds() -> float:
    """This process's user and system CPU seconds so far (the load's HTTP clients)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _children(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(child) for child in children.read_text().split()]
    except OSError:
        return []


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds so far of a process and its children (the workers of ``--workers``)."""
    from searchr1.bench.thread_cpu import process_seconds

    return process_seconds(pid) + sum(process_seconds(child) for child in _children(pid))


def _tree_resident_mb(pid: int) -> dict[str, float]:
    """:func:`_resident_mb` of a process and its children, summed (the workers of ``--workers``)."""
    totals = _resident_mb(pid)
    for child in _children(pid):
        try:
            for name, value in _resident_mb(child).items():
                totals[name] += value
        except OSError:
            pass
    return totals


def _resident_mb(pid: int) -> dict[str, float]:
    """A process's resident memory in MB: all of it, and its anonymous part (what it holds beyond
    the page cache of its memory-mapped files)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon"):
            fields[name] = int(value.split()[0]) / 1024
    return {"rss_mb": fields.get("VmRSS", 0.0), "rss_anon_mb": fields.get("RssAnon", 0.0)}


def query_throughput(index: BM25Index, queries: list[str]) -> dict[str, float]:
    index.search(queries[:BATCH], 3)  # warm the memory-mapped pages
    started = time.perf_counter()
    for query in queries:
        index.search([query], 3)
    single = time.perf_counter() - started
    started = time.perf_counter()
    for start in range(0, len(queries), BATCH):
        index.search(queries[start:start + BATCH], 3)
    batched = time.perf_counter() - started
    return {"single_qps": len(queries) / single, "batched_qps": len(queries) / batched}


# (passages, seed) -> the folder that holds the corpus (removed with it), the corpus, its generation seconds
_SHARED: dict[tuple[int, int], tuple[tempfile.TemporaryDirectory[str], Path, float]] = {}


def shared_corpus(count: int, seed: int) -> tuple[Path, float]:
    """The generated corpus of ``count`` passages, written once per process (figures 8 and 9
    read the same one); returns its path and the seconds its generation took (0 if reused)."""
    key = (count, seed)
    if key not in _SHARED:
        scratch = tempfile.TemporaryDirectory(prefix="searchr1-bench-bm25-")
        corpus = Path(scratch.name) / "corpus" / "corpus.jsonl"
        corpus.parent.mkdir()
        started = time.perf_counter()
        write_corpus(corpus, count, seed)
        _SHARED[key] = (scratch, corpus, time.perf_counter() - started)
        return corpus, _SHARED[key][2]
    return _SHARED[key][1], 0.0


def shared_index(count: int, seed: int) -> tuple[Path, dict[str, float] | None]:
    """Our index of :func:`shared_corpus`, built (in a measured child process) once per process."""
    corpus, _ = shared_corpus(count, seed)
    out = corpus.parent.parent / "index"
    if out.is_dir():
        return out, None
    return out, measured_build(corpus, out)


def local_search_figure(tokenizer: Tokenizer | None = None, *, seed: int = 0, quick: bool = False,
                        passages: int | None = None) -> Figure:
    from searchr1.bm25.index import BM25Index
    from searchr1.bm25.synthetic import heaps_queries, wiki18_law

    begun = time.perf_counter()
    count = passages or (QUICK_PASSAGES if quick else WIKI18_PASSAGES)
    queries = heaps_queries(200 if quick else 1000, seed=seed)
    corpus, generated = shared_corpus(count, seed)
    out, build = shared_index(count, seed)
    if build is None:  # built by an earlier figure of this run: measure a build of our own
        scratch = Path(tempfile.mkdtemp(prefix="searchr1-bench-build-"))
        try:
            build = measured_build(corpus, scratch / "index")
        finally:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    index = BM25Index(out)
    throughput = query_throughput(index, queries)
    served = served_load(out, queries)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    corpus_bytes = corpus.stat().st_size
    rate = count / build["build_seconds"]
    expected_vocabulary = wiki18_law().expected_vocabulary(build["tokens"])
    measures = [
        Measure("vocabulary", "vocabulary, terms", build["vocabulary"], digits=0),
        Measure("vocabulary_over_law", "vocabulary / wiki-18's law at this many tokens",
                build["vocabulary"] / expected_vocabulary, unit="x", digits=3),
        Measure("build_passages_per_second", "index build, passages/s", rate, unit="/s", digits=0),
        Measure("build_passages_per_cpu_second", "index build, passages per CPU second",
                count / build["cpu_seconds"] if build.get("cpu_seconds") else 0.0, unit="/s", digits=0),
        Measure("build_peak_rss_mb", "index build, peak memory", build["peak_rss_mb"], unit="MB", digits=0,
                target=BUILD_PEAK_BOUND_MB, comparator="<=", target_source="issue"),
        Measure("single_qps", "queries/s, one per call", throughput["single_qps"], unit="/s", digits=0),
        Measure("batched_qps", f"queries/s, batches of {BATCH}", throughput["batched_qps"], unit="/s", digits=0),
        Measure("batched_over_single", "batched / single throughput",
                throughput["batched_qps"] / throughput["single_qps"],
                target=1.0, comparator=">=", unit="x", target_source="bench"),
        Measure("serve_p50_ms", f"serve p50 latency, {CLIENTS} clients", served["p50_ms"], unit="ms", digits=1),
        Measure("serve_p95_ms", f"serve p95 latency, {CLIENTS} clients", served["p95_ms"], unit="ms", digits=1),
        Measure("serve_rps", "serve requests/s", served["requests_per_second"], unit="/s", digits=0),
        Measure("serve_start_seconds", "retriever serve, start-up", served["start_seconds"], unit="s", digits=1),
        Measure("serve_rss_anon_mb", "retriever serve, memory beyond the page cache", served["rss_anon_mb"],
                unit="MB", digits=0, target=SERVE_ANON_BOUND_MB, comparator="<=", target_source="issue"),
        Measure("serve_rss_mb", "retriever serve, resident memory", served["rss_mb"], unit="MB", digits=0),
    ]
    details = {"passages": count, "queries": len(queries), "corpus_bytes": corpus_bytes, "index_bytes": size,
               "generate_seconds": round(generated, 2), "build": build,
               "expected_vocabulary": round(expected_vocabulary), "throughput": throughput,
               "served": served, "cpus": os.cpu_count()}
    figure = Figure(8, "local_search", f"BM25 of our own over {count:,} generated passages", measures, details,
                  notes=[f"{count:,} passages built in {build['build_seconds']:.0f} s"])
    figure.seconds = time.perf_counter() - begun
    return figure


def _child_build(corpus: str, out: str) -> None:
    """``index build`` with the command's default workers; its peak memory is bounded above by this
    process's peak plus the workers' count times the largest worker's peak."""
    from searchr1.bm25.index import build_index

    workers = min(2, os.cpu_count() or 1)
    before = resource.getrusage(resource.RUSAGE_SELF)
    manifest = build_index(corpus, out, workers=workers)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime + children.ru_utime + children.ru_stime
    peak_kib = usage.ru_maxrss + (workers * children.ru_maxrss if workers > 1 else 0)
    print(json.dumps({"build_seconds": manifest["build_seconds"], "tokenize_seconds": manifest["tokenize_seconds"],
                      "cpu_seconds": cpu, "peak_rss_mb": peak_kib / 1024, "workers": workers,
                      "vocabulary": manifest["vocabulary"], "tokens": manifest["tokens"]}))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        _child_build(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -m searchr1.bench.local_search build CORPUS OUT")
