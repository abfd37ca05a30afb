"""Figure 19: partial rollouts (``--partial-rollouts``) against the bounded overlap on a world whose
trajectory lengths vary widely.

The world mixes the offline world's train questions (1 or 2 searches) with the long-horizon ones
(6 to 10 searches, about 650 tokens a result: :mod:`searchr1.offline.long_world`): after
``WARM_STEPS`` steps on the short questions alone (figure 16's warm-up: from its base table the
learning policy almost never chains six searches), every batch holds ``LONG_PER_BATCH`` long
questions among short ones. Every run folds its context as figure 16's ``fold`` variant does (a
window of 4,096 tokens, 16,384 in all, 12 searches and turns), and searches the passages of both
worlds with figure 6's lognormal latency tail.

Throughput. On figure 6's served twin (sampling, training and weight saves with modelled service
times) each variant trains ``WARM_STEPS + STEPS`` steps in one run, and the steps after the warm-up
are timed: steps per hour, makespan (their summed step seconds) and its ratio to the training
queue's bound (their summed training seconds: what the run would take if rollouts hid entirely
behind training, the critical path no schedule passes). The variants: the bounded overlap at K=1
(the current pipeline; the target's reference), the bounded overlap at K=S (the same staleness
bound as partial rollouts, reached by rolling whole batches further ahead), and partial rollouts
at K=1, S=``LAG``, T=``QUANTUM``. Target: partial rollouts give at least 1.3x the steps per hour
of the bounded overlap at K=1.

Learning. On an in-process twin without latency (as figures 14-18), the bounded overlap at K=1 and
partial rollouts train the same world on ``SEEDS`` seeds: the steps until the mean reward of three
steps reaches 0.8 (counted from the first step; never: one past the end). Target: partial
rollouts within 1.2x the bounded overlap's steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from searchr1.basics.json_types import as_float
from searchr1.bench.off_policy import (OPTIM_STEP, QUICK_SIZE, REWARD_TARGET, SAMPLE_REQUEST, SAMPLED_TOKEN,
                                       SEARCH_CAP, SEARCH_MEDIAN, SEARCH_SIGMA, TRAINED_TOKEN, WEIGHT_SAVE, BatchSize,
                                       _config, steps_mean, steps_to_reward, variants_by_seed)
from searchr1.bench.report import Figure, Measure
from searchr1.bench.served import served_twin
from searchr1.core.types import SearchExample, ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.training.config import TrainConfig
    from searchr1.twin.scripted_search import ScriptedSearch

WARM_STEPS, STEPS, QUICK_WARM_STEPS, QUICK_STEPS = 18, 10, 1, 2
LEARN_STEPS, QUICK_LEARN_STEPS = 30, 3
SEEDS, QUICK_SEEDS = 8, 1
LONG_PER_BATCH = 2  # long-horizon questions in each mixed batch of 8 (1 with --quick's 2)
K, LAG, QUANTUM = 1, 3, 4  # partial rollouts: K=1, S=3 (turn cap (S - K + 1) * T = 12), T=4
VARIANTS = ("bounded", "bounded_s", "partial")
LABELS = {"bounded": f"bounded overlap, K={K}", "bounded_s": f"bounded overlap, K={LAG} (the same bound)",
          "partial": f"partial rollouts, K={K}, S={LAG}, T={QUANTUM}"}


def _variant_config(variant: str, steps: int, seed: int, size: BatchSize) -> TrainConfig:
    """The run of ``variant``: figure 16's fold budgets, and its pipeline."""
    from searchr1.bench.long_horizon import _rollout

    base = _config(steps, **size)
    pipeline = {"bounded": {"max_steps_off_policy": K}, "bounded_s": {"max_steps_off_policy": LAG},
                "partial": {"max_steps_off_policy": K, "partial_rollouts": True, "turns_per_version": QUANTUM,
                            "max_version_lag": LAG}}[variant]
    return dataclasses.replace(base, seed=seed, rollout=_rollout(base.rollout, "fold"), **pipeline)  # type: ignore[arg-type]  # the keywords above are TrainConfig's fields


def _examples(seed: int, warm: int, steps: int, per_step: int) -> list[SearchExample]:
    """``warm`` batches of short questions, then ``steps`` mixed batches (the long ones last in each)."""
    from searchr1.data.dataset import shuffled_examples
    from searchr1.offline import LONG_TRAIN, TRAIN

    short, long = shuffled_examples(str(TRAIN), seed), shuffled_examples(str(LONG_TRAIN), seed)
    longs = max(1, LONG_PER_BATCH * per_step // 8)
    examples = [short[i % len(short)] for i in range(warm * per_step)]
    for step in range(steps):
        examples += [short[(warm * per_step + step * per_step + i) % len(short)] for i in range(per_step - longs)]
        examples += [long[(step * longs + i) % len(long)] for i in range(longs)]
    return examples


def _mixed_search(seed: int, *, latency_tail: bool) -> ScriptedSearch:
    """The passages of both worlds in memory, with figure 6's seeded lognormal latency tail."""
    from searchr1.core.types import SearchItem, SearchResult
    from searchr1.offline import LONG, QUESTIONS
    from searchr1.twin.offline_world import load_worlds, passages_by_query
    from searchr1.twin.scripted_search import ScriptedSearch

    results = {query: SearchResult(True, (SearchItem(hop.title, hop.text, "offline"),))
               for query, hop in passages_by_query(load_worlds((QUESTIONS, LONG))).items()}

    def latency(query: str) -> float:
        digest = hashlib.sha256(f"{seed}/{query}".encode()).digest()
        normal = np.random.default_rng(int.from_bytes(digest[:8], "little")).normal()
        return float(min(SEARCH_CAP, SEARCH_MEDIAN * np.exp(SEARCH_SIGMA * normal)))

    return ScriptedSearch(results, latency=latency if latency_tail else None)


def _train(service: ServiceClient, tokenizer: Qwen35Tokenizer, variant: str, seed: int, warm: int, steps: int,
           size: BatchSize, home: Path, *, latency_tail: bool) -> Sequence[Mapping[str, object]]:
    """One run of ``variant``: its metrics lines."""
    from searchr1.run.directory import RunDir
    from searchr1.training.loop import TrainingRun

    config = _variant_config(variant, warm + steps, seed, size)
    run = RunDir(home / f"run-{variant}-{seed}-{time.monotonic_ns()}")
    run.create(config.to_json())
    examples = _examples(seed, warm, steps, config.questions_per_batch)
    training = TrainingRun(config, run, service=service, tokenizer=tokenizer,
                           search=_mixed_search(seed, latency_tail=latency_tail), examples=examples)
    asyncio.run(training.run_steps(None))
    return run.metrics()


def _seconds(lines: Sequence[Mapping[str, object]], key: str) -> float:
    return float(sum(as_float(line[key], key) for line in lines))


def _throughput(tokenizer: Qwen35Tokenizer, seed: int, quick: bool, size: BatchSize,
                warm: int, steps: int) -> dict[str, Sequence[Mapping[str, object]]]:
    """The timed steps (after the warm-up) of each variant on the served twin."""
    from searchr1.twin.config import Latencies

    latencies = Latencies() if quick else Latencies(
        sample_request=SAMPLE_REQUEST, sampled_token=SAMPLED_TOKEN, trained_token=TRAINED_TOKEN,
        optim_step=OPTIM_STEP, weight_save=WEIGHT_SAVE)
    timed: dict[str, Sequence[Mapping[str, object]]] = {}
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-partial-") as scratch, \
            served_twin(None, latencies, in_process=quick, tokenizer=tokenizer, policy="learning",
                        max_staleness=LAG) as service:
        for variant in VARIANTS:
            lines = _train(service, tokenizer, variant, seed, warm, steps, size, Path(scratch),
                           latency_tail=not quick)
            timed[variant] = lines[warm:]
    return timed


def partial_rollouts_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    started = time.perf_counter()
    size: BatchSize = QUICK_SIZE if quick else {}
    warm, steps = (QUICK_WARM_STEPS, QUICK_STEPS) if quick else (WARM_STEPS, STEPS)
    timed = _throughput(tokenizer, seed, quick, size, warm, steps)
    rate = {name: 3600.0 * len(lines) / _seconds(lines, "time/step_seconds") for name, lines in timed.items()}
    makespan = {name: _seconds(lines, "time/step_seconds") for name, lines in timed.items()}
    bound = {name: _seconds(lines, "time/train_seconds") for name, lines in timed.items()}

    learn_steps = QUICK_LEARN_STEPS if quick else LEARN_STEPS
    seeds = range(seed, seed + (QUICK_SEEDS if quick else SEEDS))
    learn_warm = min(warm, learn_steps - 1)

    def learn(service: ServiceClient, home: Path, variant: str, run_seed: int) -> int | None:
        lines = _train(service, tokenizer, variant, run_seed, learn_warm, learn_steps - learn_warm, size, home,
                       latency_tail=False)
        return steps_to_reward(lines)

    learned = variants_by_seed(tokenizer, ["bounded", "partial"], list(seeds), "searchr1-bench-partial-learn-",
                               learn, max_staleness=LAG)
    never = learn_steps + 1
    to_reward = {name: steps_mean(reached, never) for name, reached in learned.items()}
    measures = [
        Measure("partial_over_bounded_throughput", f"steps per hour, partial rollouts / bounded overlap K={K}",
                rate["partial"] / rate["bounded"], 1.3, ">=", "x"),
        Measure("partial_over_bounded_steps_to_reward",
                f"steps to reward {REWARD_TARGET}, partial rollouts / bounded overlap K={K}",
                to_reward["partial"] / to_reward["bounded"], 1.2, "<=", "x"),
    ]
    for name in VARIANTS:
        measures += [
            Measure(f"steps_per_hour_{name}", f"  steps per hour, {LABELS[name]}", rate[name], unit="/h", digits=0),
            Measure(f"makespan_over_bound_{name}", f"  makespan / training-queue bound, {LABELS[name]}",
                    makespan[name] / bound[name] if bound[name] else float("nan"), unit="x"),
        ]
    measures += [Measure(f"steps_to_reward_{name}", f"  steps to reward {REWARD_TARGET}, {LABELS[name]}",
                         to_reward[name], unit="steps", digits=1) for name in learned]

    def mean_of(name: str, key: str) -> float:
        return statistics.fmean(as_float(line.get(key, 0.0), key) for line in timed[name]) if timed[name] else 0.0

    figure = Figure(
        number=19, name="partial_rollouts", title="Partial rollouts against the bounded overlap (mixed lengths)",
        measures=measures,
        details={"warm_steps": warm, "timed_steps": steps, "learn_steps": learn_steps, "seeds": list(seeds),
                 "makespan_seconds": makespan, "training_queue_seconds": bound,
                 "reached": {name: list(reached) for name, reached in learned.items()},
                 "turns_mean": {name: mean_of(name, "rollout/turns") for name in VARIANTS},
                 "partial": {key: mean_of("partial", f"async/{key}") for key in
                             ("groups_carried", "versions_per_trajectory", "staleness_mean", "cut_by_lag")}},
        notes=[f"{size.get('questions', 8)} questions x {size.get('group', 8)} samples, {warm} warm-up steps on the "
               f"short questions, then {steps} timed steps with {LONG_PER_BATCH} long-horizon questions of 8; "
               "figure 16's fold budgets; the training-queue bound is the timed steps' summed training seconds",
               f"steps to reward {REWARD_TARGET} on an in-process twin without latency, {len(seeds)} seeds, "
               f"{learn_steps} steps (a run that never reaches it counts {never})"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
