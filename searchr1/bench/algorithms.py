"""Figure 10: the algorithm options on the offline world, and what the KL penalty costs.

Learning speed. On an in-process twin with no latency serving the learning policy, the same
workload as figure 7 (8 questions x 8 samples, Adam lr 0.2): steps until the mean reward of
three consecutive steps reaches 0.8, for today's defaults (importance_sampling, no KL, no
dynamic sampling) next to ``--loss-fn ppo``, ``cispo``, ``dro``, ``--kl-coef 0.05`` (k3) and
``--dynamic-sampling``. A run that never reaches the target counts as one step past the end.

Substeps. With one update per batch the on-policy ratio is 1, so ppo, cispo and dro have the
gradient of importance_sampling and their rows above can differ only through the sampler-learner
mismatch. The substep rows train with ``--num-substeps 4`` at Adam lr 1.0 and beta1 0 (no
momentum), 10 steps on each of 8 training seeds (the bench's seed and the 7 after it), and
report the runs that reach the target, their mean steps to it, the mean reward of their last
three steps and, beside ppo and cispo, the clipped fraction of their trained tokens (over all
steps, and on the first step's later mini-batches, where the clip acts). One row trains
importance_sampling at the same settings with one update per step: all 8 of its runs learn, so
what traps the others is the four updates per batch, not the learning rate.

What the rows show. In the first steps, in groups where no sample found both passages of a
two-hop question, a wrong answer after the first hop (reward 0) beats a format failure (-0.1),
so the advantages raise "answer after one hop" (0.44 at the base). Importance sampling raises it
on each of the four mini-batches of a step; in the trapped runs it is at 0.97 or more within two
steps, the two-hop groups then all answer alike, their advantages are 0, and the run stays at
the one-hop share of its batches (rewards 0.62-0.75). ppo zeroes the gradient of a token whose
ratio has passed 1.2 in its advantage's direction: once the first update has raised that answer,
the later mini-batches stop pushing it, the second search keeps some probability and most runs
find it, a step later than importance sampling where that one is not trapped (the clip holds
back right moves too: on the seeds importance sampling is trapped on, after the first step ppo
searches the first hop with 0.46-0.74, importance sampling with 0.95-0.97). cispo caps the
weight at 1.2 but never zeroes it, so it keeps pushing, less hard than importance sampling does.
beta1 0 is what lets the clip act: with Adam's default 0.9 a parameter whose gradient the clip
zeroes still moves about 0.7 lr on the next update, carried by the momentum of the first,
unclipped one; at lr 1 the three losses are then trapped on the same seeds. One seed is not
enough: a run's course is settled by a few Adam steps on mini-batches of two questions, and
single seeds show the losses in every order.

KL cost. On a twin that plays back figure 6's modelled service times (per sampling request and
token, per trained token, optimiser step, weight save), a few steps with ``--kl-coef 0.05``
and with ``--kl-coef 0``, interleaved: sampling requests per step (the extra ones are the base
sampler's prompt-logprob requests, one per datum) and the median wall time per step after the
first, as a ratio to ``--kl-coef 0``.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from searchr1.bench.off_policy import (
    LEARN_STEPS,
    OPTIM_STEP,
    QUICK_LEARN_STEPS,
    QUICK_SIZE,
    REWARD_TARGET,
    REWARD_WINDOW,
    SAMPLE_REQUEST,
    SAMPLED_TOKEN,
    TRAINED_TOKEN,
    WEIGHT_SAVE,
    BatchSize,
    ConfigChanges,
    _config,
    _train,
    _world_search,
    steps_to_reward,
)
from searchr1.basics.json_types import as_float, optional_float
from searchr1.bench.report import Figure, Measure
from searchr1.basics.wording import plural
from searchr1.core.objective import LossFn
from searchr1.runtime.tokenizer import Qwen35Tokenizer

MetricsLines = Sequence[Mapping[str, object]]  # a run's metrics.jsonl, as read back

KL_COEF = 0.05
VARIANTS: dict[str, ConfigChanges] = {
    "defaults": {},
    "ppo": {"loss_fn": "ppo"},
    "cispo": {"loss_fn": "cispo"},
    "dro": {"loss_fn": "dro"},
    "kl": {"kl_coef": KL_COEF},
    "dynamic": {"dynamic_sampling": True},
}
LABELS = {
    "defaults": "today's defaults (importance_sampling, no KL, no dynamic sampling)",
    "ppo": "--loss-fn ppo (clip 0.8-1.2)",
    "cispo": "--loss-fn cispo (clip 0.8-1.2)",
    "dro": "--loss-fn dro (beta 0.05)",
    "kl": f"--kl-coef {KL_COEF} (k3)",
    "dynamic": "--dynamic-sampling (at most 2 extra batches)",
}
SUBSTEPS, SUBSTEP_LEARNING_RATE, SUBSTEP_BETA1 = 4, 1.0, 0.0
SUBSTEP_SEEDS, QUICK_SUBSTEP_SEEDS = 8, 1  # training seeds per substep row: the bench's seed and the ones after it
# Every run of these rows that reaches the target does so by step 7 and a trapped one stays
# trapped (measured over 18 steps): 10 steps tell the same in just over half the time.
SUBSTEP_LEARN_STEPS = 10
SUBSTEP_ADAM: ConfigChanges = {"learning_rate": SUBSTEP_LEARNING_RATE, "beta1": SUBSTEP_BETA1}
SUBSTEP_LOSSES: tuple[tuple[str, LossFn], ...] = (("is", "importance_sampling"), ("ppo", "ppo"), ("cispo", "cispo"))
SUBSTEP_VARIANTS: dict[str, ConfigChanges] = {
    f"substeps_{name}": {"loss_fn": loss, "num_substeps": SUBSTEPS, **SUBSTEP_ADAM} for name, loss in SUBSTEP_LOSSES
}
SUBSTEP_VARIANTS["one_step_is"] = {"loss_fn": "importance_sampling", **SUBSTEP_ADAM}
CLIPPING_ROWS = ("substeps_ppo", "substeps_cispo")
_SUBSTEP_SETTING = f"lr {SUBSTEP_LEARNING_RATE:g}, beta1 {SUBSTEP_BETA1:g}"
SUBSTEP_LABELS = {  # the loss first: the report's table cuts long labels
    "substeps_is": f"is, {SUBSTEPS} substeps, {_SUBSTEP_SETTING} (importance_sampling)",
    "substeps_ppo": f"ppo, {SUBSTEPS} substeps, {_SUBSTEP_SETTING} (clip 0.8-1.2)",
    "substeps_cispo": f"cispo, {SUBSTEPS} substeps, {_SUBSTEP_SETTING} (clip 0.8-1.2)",
    "one_step_is": f"is, 1 update per step, {_SUBSTEP_SETTING} (ratio 1: every loss alike)",
}
COST_STEPS, QUICK_COST_STEPS = 4, 2
# The bench's own target: one extra round of prompt-logprob requests (sent concurrently) should
# cost well under half a step.
KL_TIME_TARGET = 1.5


def algorithms_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    started = time.perf_counter()
    steps = QUICK_LEARN_STEPS if quick else LEARN_STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    # a step's last mini-batch trains SUBSTEPS - 1 updates after its sampler
    seeds = [seed + index for index in range(QUICK_SUBSTEP_SEEDS if quick else SUBSTEP_SEEDS)]
    substep_steps = QUICK_LEARN_STEPS if quick else SUBSTEP_LEARN_STEPS
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-algorithms-") as scratch:
        home = Path(scratch)
        runs = _variant_runs(tokenizer, home, seed=seed, steps=steps, size=size)
        seeded = _substep_runs(tokenizer, home, seed=seed, steps=substep_steps, size=size, seeds=seeds)
        cost, requests = _kl_cost_runs(tokenizer, home, seed=seed, quick=quick, size=size)
    reached = {name: steps_to_reward(lines) for name, lines in runs.items()}
    never = steps + 1

    def value(name: str) -> float:
        found = reached[name]
        return float(found if found is not None else never)

    step_time = {mode: statistics.median(as_float(m["time/step_seconds"], "time/step_seconds") for m in lines)
                 for mode, lines in cost.items()}
    per_step_requests = {mode: statistics.mean(values) for mode, values in requests.items()}
    measures = [
        Measure("kl_step_time_ratio", f"wall time per step, --kl-coef {KL_COEF} / 0 (modelled service times)",
                step_time["on"] / step_time["off"], KL_TIME_TARGET, "<=", "x", target_source="bench"),
        Measure("kl_extra_requests", "  extra sampling requests per step with the KL penalty",
                per_step_requests["on"] - per_step_requests["off"], unit="requests", digits=1),
        Measure("kl_requests_off", "  sampling requests per step without it", per_step_requests["off"],
                unit="requests", digits=1),
    ]
    for name in VARIANTS:
        measures.append(Measure(f"steps_{name}", f"  steps to reward {REWARD_TARGET}: {LABELS[name]}", value(name),
                                unit="steps", digits=0))
    measures += _substep_measures(seeded, substep_steps)
    figure = Figure(
        number=10, name="algorithms", title="Algorithm options on the offline world; the KL penalty's cost",
        measures=measures,
        details={"steps_run": steps, "substep_steps_run": substep_steps, "reached": reached, "step_seconds": step_time,
                 "requests_per_step": per_step_requests,
                 "reward_curves": {name: [m["reward/mean"] for m in lines] for name, lines in runs.items()},
                 "substep_seeds": seeds,
                 "substep_reached": {name: [steps_to_reward(run) for run in lines] for name, lines in seeded.items()},
                 "substep_reward_curves": {name: [[m["reward/mean"] for m in run] for run in lines]
                                           for name, lines in seeded.items()},
                 "substep_first_step_clipped": {name: [first_step_clipped(run) for run in lines]
                                                for name, lines in seeded.items() if name in CLIPPING_ROWS},
                 "kl_policy_base": [m.get("kl/policy_base") for m in runs["kl"]],
                 "dynamic_questions_drawn": [m.get("dynamic/questions_drawn") for m in runs["dynamic"]]},
        notes=[f"{steps} steps of {size.get('questions', 8)} questions x {size.get('group', 8)} samples, Adam lr 0.2, "
               f"reward window {REWARD_WINDOW}; a run that never reaches the target counts as {never} steps",
               "on-policy the importance ratio is 1, where ppo, cispo and dro have the gradient of "
               "importance_sampling: their rows can only differ through the sampler-learner mismatch",
               f"substep rows: --num-substeps {SUBSTEPS} at Adam {_SUBSTEP_SETTING}, {substep_steps} steps, "
               f"{plural(len(seeds), 'training seed')} from {seeds[0]}; later mini-batches train on moved weights, so "
               "the ratio leaves 1 and ppo's clip stops pushing what the first update already raised (without "
               "momentum nothing carries it on)"],
    )
    figure.seconds = time.perf_counter() - started
    return figure


def _variant_runs(tokenizer: Qwen35Tokenizer, home: Path, *, seed: int, steps: int,
                  size: BatchSize) -> dict[str, MetricsLines]:
    """The metrics lines of one run per algorithm option (VARIANTS), on one twin of no latency."""
    from searchr1.twin import Strictness, start_twin

    runs: dict[str, MetricsLines] = {}
    with start_twin(home=home / "twin", tokenizer=tokenizer, policy="learning", strictness=Strictness()) as twin:
        service = twin.service_client()
        for name, changes in VARIANTS.items():
            runs[name] = _train(service, dataclasses.replace(_config(steps, **size), **changes), tokenizer,
                                _world_search(seed, latency_tail=False), home)
    return runs


def _substep_runs(tokenizer: Qwen35Tokenizer, home: Path, *, seed: int, steps: int, size: BatchSize,
                  seeds: list[int]) -> dict[str, list[MetricsLines]]:
    """The metrics lines of the substep rows (SUBSTEP_VARIANTS): one run per training seed, on a
    twin that lets a sampler lag SUBSTEPS - 1 updates behind."""
    from searchr1.twin import Strictness, start_twin

    seeded: dict[str, list[MetricsLines]] = {}  # substep rows: one run per training seed
    with start_twin(home=home / "twin-substeps", tokenizer=tokenizer, policy="learning",
                    strictness=Strictness(max_staleness=SUBSTEPS - 1)) as twin:
        service = twin.service_client()
        for name, changes in SUBSTEP_VARIANTS.items():
            seeded[name] = [_train(service, dataclasses.replace(_config(steps, **size), seed=train_seed, **changes),
                                   tokenizer, _world_search(seed, latency_tail=False), home)
                            for train_seed in seeds]
    return seeded


def _kl_cost_runs(tokenizer: Qwen35Tokenizer, home: Path, *, seed: int, quick: bool,
                  size: BatchSize) -> tuple[dict[str, list[Mapping[str, object]]], dict[str, list[float]]]:
    """Runs without (``off``) and with (``on``) the KL penalty, interleaved so that drift hits both
    alike, on a twin that plays back modelled service times: the metrics lines after each run's
    first step, and each run's sampling requests per step."""
    from searchr1.twin import Latencies, start_twin

    cost: dict[str, list[Mapping[str, object]]] = {"off": [], "on": []}
    requests: dict[str, list[float]] = {"off": [], "on": []}
    latencies = Latencies(sample_request=SAMPLE_REQUEST, sampled_token=SAMPLED_TOKEN,
                          trained_token=TRAINED_TOKEN, optim_step=OPTIM_STEP, weight_save=WEIGHT_SAVE)
    cost_steps = QUICK_COST_STEPS if quick else COST_STEPS
    with start_twin(home=home / "twin-cost", tokenizer=tokenizer, policy="learning",
                    latencies=latencies) as twin:
        service = twin.service_client()
        for _ in range(1 if quick else 2):  # interleaved, so drift hits both alike
            for mode, coef in (("off", 0.0), ("on", KL_COEF)):
                before = len(twin.sample_log)
                config = dataclasses.replace(_config(cost_steps, **size), kl_coef=coef)
                cost[mode] += _train(service, config, tokenizer, _world_search(seed, latency_tail=False),
                                     home)[1:]
                requests[mode].append((len(twin.sample_log) - before) / cost_steps)
    return cost, requests


def _substep_measures(seeded: dict[str, list[MetricsLines]], substep_steps: int) -> list[Measure]:
    """Per substep row: the runs reaching the target, their mean steps to it and final reward, and
    beside the clipping losses the clipped fraction (over all steps, and on the first step's later
    mini-batches)."""
    measures = []
    substep_never = substep_steps + 1
    for name in SUBSTEP_VARIANTS:
        lines = seeded[name]
        reached_runs = [steps_to_reward(run) for run in lines]
        measures.append(Measure(f"reached_{name}", f"  runs reaching reward {REWARD_TARGET} (of {len(lines)} seeds): "
                                f"{SUBSTEP_LABELS[name]}", sum(r is not None for r in reached_runs), unit="runs",
                                digits=0))
        mean_steps = statistics.fmean(r if r is not None else substep_never for r in reached_runs)
        measures.append(Measure(f"steps_{name}", f"    mean steps to reward {REWARD_TARGET} (never: {substep_never})",
                                mean_steps, unit="steps", digits=1))
        measures.append(Measure(f"final_reward_{name}", f"    mean reward of the last {REWARD_WINDOW} steps",
                                statistics.fmean(final_reward(run) for run in lines), unit="reward", digits=3))
        clipped = [c for c in (clipped_fraction(run) for run in lines) if c is not None]
        if clipped:
            measures.append(Measure(f"clipped_{name}", "    clipped fraction of the trained tokens (mean over steps)",
                                    statistics.fmean(clipped), unit="share", digits=3))
        first = [c for run in lines for c in first_step_clipped(run)[1:] if c is not None]
        if first:  # where the clip acts: substep 0 is on-policy and clips nothing
            measures.append(Measure(f"clipped_first_step_{name}", "    the same on the first step's later mini-batches",
                                    statistics.fmean(first), unit="share", digits=3))
    return measures


def final_reward(lines: MetricsLines, window: int = REWARD_WINDOW) -> float:
    """The mean reward of a run's last ``window`` steps (all of them when it is shorter)."""
    rewards = [as_float(m["reward/mean"], "reward/mean") for m in lines]
    return statistics.fmean(rewards[-window:])


def clipped_fraction(lines: MetricsLines) -> float | None:
    """The mean ``health/clipped_fraction`` over the steps that trained (None for a loss that
    does not clip)."""
    values = [as_float(m["health/clipped_fraction"], "health/clipped_fraction") for m in lines
              if "health/clipped_fraction" in m]
    return statistics.fmean(values) if values else None


def first_step_clipped(lines: MetricsLines) -> list[float | None]:
    """The clipped fraction of each mini-batch of a run's first step (None where not logged)."""
    if not lines:
        return []
    return [optional_float(lines[0].get(key), key)
            for key in (f"health/clipped_fraction/substep_{index}" for index in range(SUBSTEPS))]
