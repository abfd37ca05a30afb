"""Figure 16: context management on the long-horizon world: ``--context full`` against ``--context
fold`` at the same window, over several training seeds.

Each run trains the learning policy of an in-process twin (no latency): first on the offline
world's train questions (figure 7's workload: 8 questions x 8 samples, Adam lr 0.2) for
``WARM_STEPS`` steps, so the policy has learnt to search before it meets long chains (from its
base table a chain of 6 searches is about one draw in 17,000, and nothing would be learnt), then
on the long-horizon train questions (6 to 10 searches, each result about 650 tokens:
:mod:`searchr1.offline.long_world`) for ``LONG_STEPS`` steps, in one run (the batches come in
that order). Both variants hold one context to ``WINDOW`` tokens: ``full`` as its whole
trajectory budget, ``fold`` as its window with a whole budget of ``WHOLE`` tokens. Per variant,
over the long steps: the steps until the mean reward of three consecutive steps reaches 0.8
(never: one past the end), the seeds reaching it, the reward of the last three steps, turns,
tokens (the whole trajectory) and datums per trajectory, and the longest context (from every
trajectory's transcript). Target: fold reaches 0.8 in every seed, full in none.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.basics.json_types import as_float
from searchr1.basics.wording import plural
from searchr1.bench.off_policy import (QUICK_SIZE, REWARD_TARGET, BatchSize, _config, steps_mean, steps_to_reward,
                                       variants_by_seed)
from searchr1.bench.report import Figure, Measure
from searchr1.core.rollout import RolloutConfig
from searchr1.core.types import ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.twin.scripted_search import ScriptedSearch

SEEDS, QUICK_SEEDS = 8, 1
WARM_STEPS, LONG_STEPS = 18, 8
QUICK_WARM_STEPS, QUICK_LONG_STEPS = 2, 2
WINDOW, WHOLE = 4096, 16384
CALLS = 12  # searches and turns a trajectory may take: the longest chain (10) and two to spare
VARIANTS = ("full", "fold")
LABELS = {"full": f"--context full --max-trajectory-tokens {WINDOW}",
          "fold": f"--context fold --context-window {WINDOW} --max-trajectory-tokens {WHOLE}"}


@dataclasses.dataclass
class LongRun:
    """The long steps of one run: their metrics lines, the longest context any turn had, and the
    mean number of contexts of a trajectory (from every trajectory's transcript)."""

    metrics: Sequence[Mapping[str, object]]
    longest: int
    contexts: float


def _rollout(base: RolloutConfig, variant: str) -> RolloutConfig:
    """The variant's budgets: one window for both; fold also a whole trajectory of ``WHOLE`` tokens."""
    from searchr1.core.context import ContextPolicy

    calls = dataclasses.replace(base, max_search_calls=CALLS, max_assistant_turns=CALLS)
    if variant == "full":
        return dataclasses.replace(calls, max_trajectory_tokens=WINDOW)
    return dataclasses.replace(calls, context=ContextPolicy.FOLD, context_window=WINDOW, max_trajectory_tokens=WHOLE)


def _search() -> ScriptedSearch:
    from searchr1.core.types import SearchItem, SearchResult
    from searchr1.offline import LONG, QUESTIONS
    from searchr1.twin.offline_world import load_worlds, passages_by_query
    from searchr1.twin.scripted_search import ScriptedSearch

    passages = passages_by_query(load_worlds((QUESTIONS, LONG)))
    return ScriptedSearch({query: SearchResult(True, (SearchItem(hop.title, hop.text, "offline"),))
                           for query, hop in passages.items()})


def _contexts(transcripts: Path, first_step: int) -> tuple[int, float]:
    """The longest context of any turn from ``first_step`` on, and the mean contexts per trajectory."""
    longest, contexts = 0, []
    for line in transcripts.read_text("utf-8").splitlines():
        record = json.loads(line)
        if int(record.get("step", 0)) >= first_step and record["turns"]:
            longest = max([longest] + [int(t["prompt_tokens"]) + int(t["generated_tokens"]) for t in record["turns"]])
            contexts.append(1 + max(int(t.get("context", 0)) for t in record["turns"]))
    return longest, statistics.fmean(contexts) if contexts else 0.0


def _run(service: ServiceClient, tokenizer: Qwen35Tokenizer, variant: str, seed: int, warm: int, long: int,
         home: Path, size: BatchSize) -> LongRun:
    from searchr1.data.dataset import load_examples, shuffled_examples
    from searchr1.offline import LONG_TRAIN, TRAIN
    from searchr1.run.directory import RunDir
    from searchr1.training.loop import TrainingRun

    base = _config(warm + long, **size)
    config = dataclasses.replace(base, seed=seed, transcripts_per_step=1024,
                                 rollout=_rollout(base.rollout, variant))
    per_step = config.questions_per_batch
    warm_up, chains = shuffled_examples(str(TRAIN), seed), shuffled_examples(str(LONG_TRAIN), seed)
    examples = [warm_up[i % len(warm_up)] for i in range(warm * per_step)] + \
        [chains[i % len(chains)] for i in range(long * per_step)]
    assert len(load_examples(LONG_TRAIN)) == len(chains)
    run = RunDir(home / f"run-{variant}-{seed}-{time.monotonic_ns()}")
    run.create(config.to_json())
    training = TrainingRun(config, run, service=service, tokenizer=tokenizer, search=_search(), examples=examples)
    import asyncio

    asyncio.run(training.run_steps(None))
    return LongRun(run.metrics()[warm:], *_contexts(run.path / "transcripts.jsonl", warm))


def _mean_of(runs: Sequence[LongRun], key: str, scale: float = 1.0) -> float:
    return statistics.fmean(as_float(line.get(key, 0.0), key) / scale for run in runs for line in run.metrics)


def _terminations(runs: Sequence[LongRun]) -> dict[str, float]:
    """How the long steps' trajectories ended: each termination's mean share (those that occur)."""
    prefix = "rollout/termination/"
    keys = sorted({key for run in runs for line in run.metrics for key in line if key.startswith(prefix)})
    shares = {key[len(prefix):]: _mean_of(runs, key) for key in keys}
    return {name: round(share, 4) for name, share in shares.items() if share}


def long_horizon_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    started = time.perf_counter()
    warm, long = (QUICK_WARM_STEPS, QUICK_LONG_STEPS) if quick else (WARM_STEPS, LONG_STEPS)
    size: BatchSize = QUICK_SIZE if quick else {}
    seeds = [seed + index for index in range(QUICK_SEEDS if quick else SEEDS)]
    runs = variants_by_seed(tokenizer, VARIANTS, seeds, "searchr1-bench-long-",
                            lambda service, home, variant, train_seed: _run(service, tokenizer, variant, train_seed,
                                                                            warm, long, home, size))
    trajectories = float(size.get("questions", 8) * size.get("group", 8))
    never = long + 1
    reached = {name: [steps_to_reward(run.metrics) for run in lines] for name, lines in runs.items()}
    measures = [
        Measure("fold_reached", f"seeds where fold reaches reward {REWARD_TARGET} (target: all {len(seeds)})",
                sum(r is not None for r in reached["fold"]), float(len(seeds)), ">=", "runs", digits=0),
        Measure("full_reached", f"seeds where full reaches reward {REWARD_TARGET} (target: none)",
                sum(r is not None for r in reached["full"]), 0.0, "<=", "runs", digits=0),
    ]
    for name in VARIANTS:
        lines = runs[name]
        measures += [
            Measure(f"steps_{name}", f"  mean long steps to reward {REWARD_TARGET} (never: {never}): {LABELS[name]}",
                    steps_mean(reached[name], never), unit="steps", digits=1),
            Measure(f"final_{name}", "    reward over the last three long steps",
                    statistics.fmean(as_float(line.get("reward/mean", 0.0)) for run in lines
                                     for line in run.metrics[-3:]), unit="reward", digits=3),
            Measure(f"turns_{name}", "    turns per trajectory", _mean_of(lines, "rollout/turns"), unit="turns",
                    digits=2),
            Measure(f"tokens_{name}", "    tokens per trajectory (the whole, every context)",
                    _mean_of(lines, "context/whole_tokens" if name == "fold" else "rollout/trajectory_tokens"),
                    unit="tokens", digits=0),
            Measure(f"contexts_{name}", "    contexts per trajectory (each its own datum)",
                    statistics.fmean(run.contexts for run in lines), unit="contexts", digits=2),
            Measure(f"datums_{name}", "    datums sent per trajectory (a group of equal rewards sends none)",
                    _mean_of(lines, "train/datums_per_rollout_batch", trajectories), unit="datums", digits=2),
            Measure(f"longest_{name}", "    longest context of any turn", max(run.longest for run in lines),
                    unit="tokens", digits=0),
        ]
    figure = Figure(
        number=16, name="long_horizon", title="Context management on the long-horizon world: full against fold",
        measures=measures,
        details={"seeds": seeds, "warm_steps": warm, "long_steps": long, "reached": reached,
                 "reward_curves": {name: [[line.get("reward/mean") for line in run.metrics] for run in lines]
                                   for name, lines in runs.items()},
                 "terminations": {name: _terminations(lines) for name, lines in runs.items()}},
        notes=[f"{warm} steps on the offline world, then {long} on the long-horizon world, of 8 questions x 8 "
               f"samples, Adam lr 0.2, {plural(len(seeds), 'training seed')} from {seeds[0]}; a window of "
               f"{WINDOW} tokens for both",
               "policy: the offline twin's learning policy, not the model; on long questions its turns write down "
               "what they found (notes), as MEM1-style agents do"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
