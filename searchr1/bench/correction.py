"""Figure 17: off-policy correction against a sampler that differs from its learner: the same
training with ``--correction none``, ``tis`` and ``decoupled`` on a twin whose sampler carries the
mismatch fault, over several training seeds.

Each variant trains the learning policy of an in-process twin (no latency) whose samplers add a
fixed logit noise of standard deviation :data:`MISMATCH_SCALE` per (prompt, candidate turn)
(:mod:`searchr1.twin.mismatch`: the scale at which ``health/mismatch_k3`` falls within the per-token
mismatch reported for bf16 and fp8 inference engines, docs/twin.md), figure 7's workload (8
questions x 8 samples, Adam lr 0.2, 18 steps), once per training seed (the bench's seed and the 7
after it). Each correction runs under the default loss (``importance_sampling``, whose ratio to the
sampler's logprobs already weighs every token) and under ``ppo`` (whose clip, without a correction,
is taken around the sampler's logprobs, so the mismatch alone can clip a token). Per variant: the
mean over seeds of the steps until the mean reward of three consecutive steps reaches 0.8 (a run
that never does counts as one step past the end), the mismatch measured, and the share of tokens
capped.
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
from searchr1.core.correction import Correction
from searchr1.core.objective import LossFn
from searchr1.core.types import ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

SEEDS, QUICK_SEEDS = 8, 1
MISMATCH_SCALE = 0.5  # the twin's logit noise (docs/twin.md: why this size)
TARGET_RATIO = 0.8  # tis or decoupled learns in at most 0.8x the steps of none
# variant -> (correction, loss)
LOSSES: tuple[tuple[str, LossFn], ...] = (("", "importance_sampling"), ("_ppo", "ppo"))
VARIANTS: dict[str, tuple[Correction, LossFn]] = {
    f"{correction}{suffix}": (correction, loss) for suffix, loss in LOSSES
    for correction in (Correction.NONE, Correction.TIS, Correction.DECOUPLED)}


def _mean(metrics: Sequence[Mapping[str, object]], key: str) -> float:
    values = [as_float(line[key], key) for line in metrics if key in line]
    return statistics.fmean(values) if values else 0.0


def correction_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    from searchr1.twin import TwinFaults

    started = time.perf_counter()
    steps = QUICK_LEARN_STEPS if quick else LEARN_STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    seeds = [seed + index for index in range(QUICK_SEEDS if quick else SEEDS)]

    def run(service: ServiceClient, home: Path, name: str, train_seed: int) -> Sequence[Mapping[str, object]]:
        correction, loss = VARIANTS[name]
        config = dataclasses.replace(_config(steps, **size), seed=train_seed, correction=correction, loss_fn=loss)
        return _train(service, config, tokenizer, _world_search(0, latency_tail=False), home)

    runs = variants_by_seed(tokenizer, list(VARIANTS), seeds, "searchr1-bench-correction-", run,
                            faults=TwinFaults(sampler_noise=MISMATCH_SCALE))
    never = steps + 1
    reached = {name: [steps_to_reward(metrics) for metrics in lines] for name, lines in runs.items()}
    mean_steps = {name: steps_mean(values, never) for name, values in reached.items()}
    mismatch = {name: statistics.fmean(_mean(m, "health/mismatch_k3") for m in lines) for name, lines in runs.items()}
    measured = {name: statistics.fmean(_mean(m, "correction/mismatch_k3") for m in lines)
                for name, lines in runs.items()}
    capped = {name: statistics.fmean(_mean(m, "correction/capped_share") for m in lines)
              for name, lines in runs.items()}
    best = {loss: min(mean_steps[f"tis{loss}"], mean_steps[f"decoupled{loss}"]) / mean_steps[f"none{loss}"]
            for loss in ("", "_ppo")}
    measures = [
        Measure("steps_ratio", f"steps to reward {REWARD_TARGET}, best of tis and decoupled / none (mean over seeds)",
                best[""], target=TARGET_RATIO, unit="x", digits=2),
        Measure("steps_ratio_ppo", "  the same under --loss-fn ppo", best["_ppo"], unit="x", digits=2),
        Measure("mismatch_k3", "sampler-learner mismatch per trained token (k3, none's runs)", mismatch["none"],
                digits=4),
    ]
    for name, (correction, loss) in VARIANTS.items():
        measures += [
            Measure(f"steps_{name}", f"  mean steps to reward {REWARD_TARGET}: --correction {correction}, "
                    f"--loss-fn {loss} (never: {never})", mean_steps[name], unit="steps", digits=1),
            Measure(f"reached_{name}", f"    seeds reaching it (of {len(runs[name])})",
                    sum(r is not None for r in reached[name]), unit="runs", digits=0),
        ]
        if correction != Correction.NONE:
            measures += [
                Measure(f"measured_{name}", "    mismatch its forward call measured (k3)", measured[name], digits=4),
                Measure(f"capped_{name}", "    share of trained tokens capped", capped[name], digits=4),
            ]
    figure = Figure(
        number=17, name="correction", title="Off-policy correction against a sampler that differs from its learner",
        measures=measures,
        details={"steps_run": steps, "seeds": seeds, "reached": reached, "mismatch_scale": MISMATCH_SCALE,
                 "reward_curves": {name: [[line.get("reward/mean") for line in metrics] for metrics in lines]
                                   for name, lines in runs.items()}},
        notes=[f"{steps} steps of {size.get('questions', 8)} questions x {size.get('group', 8)} samples, Adam lr 0.2, "
               f"{plural(len(seeds), 'training seed')} from {seeds[0]}; a run that never reaches the target counts "
               f"as {never} steps",
               f"the twin's sampler adds a fixed logit noise of standard deviation {MISMATCH_SCALE} per (prompt, "
               "candidate turn) (--offline-fault mismatch@SCALE); policy: the offline twin's learning policy, not "
               "the model"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
