"""Figure 15: thinking mode on the offline world: the same training with ``--thinking`` off and on,
over several training seeds.

Each variant trains the learning policy of an in-process twin (no latency) on the offline train
questions, figure 7's workload (8 questions x 8 samples, Adam lr 0.2, 18 steps), once per training
seed (the bench's seed and the 7 after it). Per variant: the tokens sampled per trajectory and the
tokens trained per step (usage counters, over the whole run), and the mean over seeds of the steps
until the mean reward of three consecutive steps reaches 0.8 (a run that never does counts as one
step past the end). With thinking on, the twin's turns write a short reasoning first whose words
are the same for every question at the same point (:func:`searchr1.twin.learning_policy.reasoning_text`):
what the figure measures is what reasoning costs when it carries nothing the turn's choice needs.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from searchr1.basics.json_types import as_float
from searchr1.basics.wording import plural
from searchr1.bench.off_policy import (LEARN_STEPS, QUICK_LEARN_STEPS, QUICK_SIZE, REWARD_TARGET, BatchSize, _config,
                                       _train, _world_search, steps_mean, steps_to_reward, variants_by_seed)
from searchr1.bench.report import Figure, Measure
from searchr1.core.types import ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

SEEDS, QUICK_SEEDS = 8, 1
VARIANTS = {"off": False, "on": True}
LABELS = {"off": "thinking off (the lab port)", "on": "--thinking"}


def _total(metrics: Sequence[Mapping[str, object]], key: str) -> float:
    return sum(as_float(line.get(key, 0), key) for line in metrics)


def thinking_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    started = time.perf_counter()
    steps = QUICK_LEARN_STEPS if quick else LEARN_STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    seeds = [seed + index for index in range(QUICK_SEEDS if quick else SEEDS)]

    def run(service: ServiceClient, home: Path, name: str, train_seed: int) -> Sequence[Mapping[str, object]]:
        base = _config(steps, **size)
        config = dataclasses.replace(base, seed=train_seed,
                                     rollout=dataclasses.replace(base.rollout, thinking=VARIANTS[name]))
        return _train(service, config, tokenizer, _world_search(0, latency_tail=False), home)

    runs = variants_by_seed(tokenizer, list(VARIANTS), seeds, "searchr1-bench-thinking-", run)
    trajectories = steps * size.get("questions", 8) * size.get("group", 8)
    never = steps + 1
    reached = {name: [steps_to_reward(metrics) for metrics in lines] for name, lines in runs.items()}
    mean_steps = {name: steps_mean(values, never) for name, values in reached.items()}
    sampled = {name: statistics.fmean(_total(m, "usage/sample_generated_tokens") / trajectories for m in lines)
               for name, lines in runs.items()}
    trained = {name: statistics.fmean(_total(m, "usage/train_tokens") / steps for m in lines)
               for name, lines in runs.items()}
    measures = [
        Measure("sampled_ratio", "tokens sampled per trajectory, thinking on / off", sampled["on"] / sampled["off"],
                unit="x", digits=2),
        Measure("steps_ratio", f"steps to reward {REWARD_TARGET}, thinking on / off (mean over seeds)",
                mean_steps["on"] / mean_steps["off"], unit="x", digits=2),
    ]
    for name in VARIANTS:
        measures += [
            Measure(f"sampled_{name}", f"  tokens sampled per trajectory: {LABELS[name]}", sampled[name],
                    unit="tokens", digits=1),
            Measure(f"trained_{name}", "    tokens trained per step", trained[name], unit="tokens", digits=0),
            Measure(f"steps_{name}", f"    mean steps to reward {REWARD_TARGET} (never: {never})", mean_steps[name],
                    unit="steps", digits=1),
            Measure(f"reached_{name}", f"    seeds reaching it (of {len(runs[name])})",
                    sum(r is not None for r in reached[name]), unit="runs", digits=0),
        ]
    figure = Figure(
        number=15, name="thinking", title="Thinking mode on the offline world: what reasoning costs and changes",
        measures=measures,
        details={"steps_run": steps, "seeds": seeds, "reached": reached,
                 "reward_curves": {name: [[line.get("reward/mean") for line in metrics] for metrics in lines]
                                   for name, lines in runs.items()}},
        notes=[f"{steps} steps of {size.get('questions', 8)} questions x {size.get('group', 8)} samples, Adam lr 0.2, "
               f"{plural(len(seeds), 'training seed')} from {seeds[0]}; a run that never reaches the target counts "
               f"as {never} steps",
               "policy: the offline twin's learning policy, not the model; its reasoning is the same words for "
               "every question at the same point, so it costs tokens and carries nothing the choice needs"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
