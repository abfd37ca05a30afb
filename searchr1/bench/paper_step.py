"""Figure 13: one paper-sized step's search, against figure 8's index of wiki-18's size.

Search-R1 trains on 512 prompts x 5 responses = 2,560 trajectories a step. A policy that has learnt
the offline world searches each hop of a question once and then answers, so it sends the offline
questions' mean hops (:func:`learned_searches_per_trajectory`) a trajectory: the step's queries are
that many times 2,560, drawn as figure 8's (:func:`searchr1.bm25.synthetic.heaps_queries`).

Measured in one run, for ``retriever serve`` with 1, 2 and as many workers as CPUs: the step's
queries sent by as many concurrent clients as the ``retriever`` backend allows (one query a
request, as the engine sends them), after a warm-up; the seconds the step's search takes, its
queries per second, p95 latency and the server's memory beyond the page cache (its processes'
anonymous pages, summed). The ratio that holds the target sets the step's search
seconds against the modelled service time of the same step (:func:`modelled_sampling_seconds`:
the sampling alone, by figure 1's latency model, which is a lower bound of the step's service
time; at most 0.1). With Lucene set up for figure 9 (``python -m searchr1.bench.lucene setup``),
the same queries go to Lucene (pyserini's Anserini, ``batch_search`` with as many threads as
CPUs) over the same corpus, and the figure gives ours with the most workers / Lucene, and ours
as one batch in this process (one thread, no HTTP: figure 9's way) / Lucene. Lucene's
index build is single-threaded: at full size it adds about 25 minutes.

The step's queries come from this process (httpx, as the ``retriever`` backend sends them), on
the same CPUs as the server, so the figure also gives the CPU each side spends per query: the
server's (every worker summed) and the clients'.

Run it with ``python cli.py bench --only 13`` (not part of the default run): at full size it
builds figure 8's corpus and index first (about 40 minutes on two cores) unless ``--only 8,13``
shares them; ``--passages`` scales the corpus down.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

import numpy as np

from searchr1.bench.report import Figure, Measure
from searchr1.core.types import Tokenizer

PAPER_PROMPTS = 512
PAPER_GROUP_SIZE = 5
QUICK_PROMPTS = 16
SERVICE_RATIO_TARGET = 0.1  # the step's search seconds / its modelled service time (issue)


def learned_searches_per_trajectory() -> float:
    """Searches a trajectory sends once the learning twin has learnt the offline world: one per
    hop of its question (the mean over the offline questions the main job trains on)."""
    from searchr1.twin.offline_world import QUESTIONS, load_world

    questions = load_world(QUESTIONS)
    return statistics.mean(len(question.hops) for question in questions)


def searches_per_trajectory_drawn(trajectories: int, mean: float, seed: int) -> np.ndarray:
    """Whole searches per trajectory, ``floor(mean)`` or one more, averaging ``mean``."""
    rng = np.random.default_rng(seed)
    extra = rng.random(trajectories) < mean - math.floor(mean)
    return np.full(trajectories, math.floor(mean), dtype=np.int64) + extra


def modelled_sampling_seconds(prompts: int, group_size: int, searches: np.ndarray, *, seed: int,
                              sampling_concurrency: int) -> dict[str, float]:
    """The step's sampling by figure 1's latency model (:class:`~searchr1.bench.workload.LatencyModel`),
    turn lengths drawn as its workload draws them: each group's first request samples its
    ``group_size`` first turns at once; every later turn (one after each search) is a request
    of its own. No scheduler beats the larger of the longest trajectory's own sampling and the
    total over the sampling concurrency."""
    from searchr1.bench.workload import LatencyModel, WorkloadSpec, _turn_tokens

    model = LatencyModel(seed=seed)
    spec = WorkloadSpec()
    rng = np.random.default_rng(seed + 1)
    total = 0.0
    longest = 0.0
    for prompt in range(prompts):
        group = searches[prompt * group_size:(prompt + 1) * group_size]
        first = model.sampling([_turn_tokens(rng, spec) for _ in group])
        total += first
        for count in group:
            later = sum(model.sampling([_turn_tokens(rng, spec)]) for _ in range(int(count)))
            total += later
            longest = max(longest, first + later)
    return {"seconds": max(longest, total / sampling_concurrency), "longest_trajectory": longest,
            "sampling_total": total, "sampling_concurrency": sampling_concurrency}


def worker_counts() -> list[int]:
    """1, 2 and the CPU count, each once."""
    return sorted({1, 2, os.cpu_count() or 1})


def lucene_step(corpus: Path, queries: list[str], threads: int) -> dict[str, float] | None:
    """The step's queries through Lucene over ``corpus`` (figure 9's set-up), or None when it is
    not set up."""
    from searchr1.bench.lucene import lucene_search

    searched = lucene_search(corpus, queries, threads)
    if searched is None:
        return None
    build_seconds, answered = searched
    return {"seconds": answered["batched_seconds"], "threads": threads, "build_seconds": build_seconds}


def in_process_seconds(index: Path, queries: list[str]) -> float:
    """Seconds for the step's queries as one batch through the index opened in this process (one
    thread, no HTTP: figure 9's way), after a warm-up of 50."""
    from searchr1.bm25.index import BM25Index

    opened = BM25Index(index)
    opened.search(queries[:50], 3)
    started = time.perf_counter()
    opened.search(queries, 3)
    return time.perf_counter() - started


def paper_step_figure(tokenizer: Tokenizer | None = None, *, seed: int = 0, quick: bool = False,
                      passages: int | None = None) -> Figure:
    from searchr1.bm25.synthetic import heaps_queries
    from searchr1.bench.local_search import QUICK_PASSAGES, WIKI18_PASSAGES, served_load, shared_corpus, shared_index
    from searchr1.core.rollout import RolloutConfig
    from searchr1.search.factory import resolve_concurrency

    begun = time.perf_counter()
    count = passages or (QUICK_PASSAGES if quick else WIKI18_PASSAGES)
    prompts = QUICK_PROMPTS if quick else PAPER_PROMPTS
    trajectories = prompts * PAPER_GROUP_SIZE
    mean_searches = learned_searches_per_trajectory()
    searches = searches_per_trajectory_drawn(trajectories, mean_searches, seed)
    queries = heaps_queries(int(searches.sum()), seed=seed + 1300)
    clients = resolve_concurrency("retriever", None)
    sampling_concurrency = RolloutConfig().sampling_concurrency
    service = modelled_sampling_seconds(prompts, PAPER_GROUP_SIZE, searches, seed=seed,
                                        sampling_concurrency=sampling_concurrency)
    corpus, _ = shared_corpus(count, seed)
    index, _ = shared_index(count, seed)
    served = {workers: served_load(index, queries, clients, workers) for workers in worker_counts()}
    most = max(served)
    lucene = lucene_step(corpus, queries, os.cpu_count() or 1)
    in_process = in_process_seconds(index, queries) if lucene is not None else None
    measures = [
        Measure("search_over_service_time", f"the step's search / its modelled service time ({most} workers)",
                served[most]["seconds"] / service["seconds"], target=SERVICE_RATIO_TARGET, comparator="<=",
                unit="x", digits=3, target_source="issue"),
    ]
    for workers, load in served.items():
        name = f"{workers} worker{'s' if workers > 1 else ''}"
        measures += [
            Measure(f"step_seconds_{workers}w", f"{name}: seconds for the step's search", load["seconds"],
                    unit="s", digits=1),
            Measure(f"qps_{workers}w", "  queries/s", load["requests_per_second"], unit="/s", digits=0),
            Measure(f"p95_ms_{workers}w", f"  p95 latency, {clients} clients", load["p95_ms"], unit="ms", digits=1),
            Measure(f"anon_mb_{workers}w", "  memory beyond the page cache, every process", load["rss_anon_mb"],
                    unit="MB", digits=0),
            Measure(f"server_cpu_ms_{workers}w", "  server CPU per query, every worker",
                    load["server_cpu_ms_per_request"], unit="ms", digits=1),
            Measure(f"client_cpu_ms_{workers}w", "  clients' CPU per query (httpx, same CPUs)",
                    load["client_cpu_ms_per_request"], unit="ms", digits=1),
        ]
    measures.append(Measure("modelled_service_seconds", "the step's modelled service time (sampling alone)",
                            service["seconds"], unit="s", digits=0))
    if lucene is not None and in_process is not None:
        measures += [
            Measure("ours_over_lucene", f"seconds for the step's search, ours ({most} workers) / "
                    f"Lucene ({lucene['threads']} threads)", served[most]["seconds"] / lucene["seconds"],
                    unit="x", digits=2),
            Measure("in_process_over_lucene", f"  the same, ours in this process, one thread, no HTTP / "
                    f"Lucene ({lucene['threads']} threads)", in_process / lucene["seconds"], unit="x", digits=2),
        ]
    details = {"passages": count, "prompts": prompts, "group_size": PAPER_GROUP_SIZE, "trajectories": trajectories,
               "searches_per_trajectory": float(searches.mean()), "learned_searches_per_trajectory": mean_searches,
               "queries": len(queries), "clients": clients, "service": service,
               "served": {str(w): load for w, load in served.items()}, "lucene": lucene,
               "in_process_seconds": in_process, "cpus": os.cpu_count()}
    notes = [f"{trajectories:,} trajectories x {searches.mean():.2f} searches = {len(queries):,} queries over "
             f"{count:,} passages, {clients} concurrent clients, one query a request"]
    if lucene is None:
        notes.append("Lucene not set up: python -m searchr1.bench.lucene setup")
    figure = Figure(13, "paper_step_search", f"one paper-sized step's search ({count:,} passages)", measures,
                    details, notes=notes)
    figure.seconds = time.perf_counter() - begun
    return figure
