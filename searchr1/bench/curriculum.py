"""Figure 18: which questions to train on. Uniform sampling against the probe's filter and the
curriculum, on a world where some questions need no search.

The data is ``mixed_train.jsonl``: the offline world's 12 train questions, which need search, and 8
known questions, which the base twin answers right without searching (``known.json``). Per
training seed (the bench's seed and the 7 after it):

1. ``probe-data``'s runner probes every question with the base policy (8 attempts closed-book and
   8 with search);
2. ``uniform`` trains on the mixed data as every run does (the data's order, 8 questions a step),
   the probe given only for its metrics;
3. ``curriculum`` trains with ``--drop-guessable 1 --curriculum``: the questions answered right
   closed-book at least once are left out, and each step draws with weight 1 - success rate.

Both train figure 7's workload (8 questions x 8 samples, Adam lr 0.2) for ``STEPS`` steps, saving
the weights after every step. Each saved policy is then evaluated on the 12 questions that need
search (8 samples each, the same seeds for every step and variant): steps to reward 0.8 are read
from that curve (the mean of three consecutive steps), not from the training batches, whose mix
differs between the variants. Per variant: those steps, searches per trajectory, and the share of
the batch spent on questions that were solved (every sample of the group right) or guessable (the
probe answered them right closed-book). Target: the curriculum spends at most half of uniform's
share on them, and reaches 0.8 in fewer steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.basics.json_types import as_float
from searchr1.basics.wording import plural
from searchr1.bench.off_policy import QUICK_SIZE, REWARD_TARGET, REWARD_WINDOW, BatchSize, _config, variants_by_seed
from searchr1.bench.report import Figure, Measure
from searchr1.core.types import SearchExample, ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.twin.scripted_search import ScriptedSearch

SEEDS, QUICK_SEEDS = 8, 1
STEPS, QUICK_STEPS = 24, 2
ATTEMPTS = 8
EVAL_SAMPLES = 8
VARIANTS = ("uniform", "curriculum")
LABELS = {"uniform": "uniform (the data's order)", "curriculum": "--drop-guessable 1 --curriculum"}


@dataclasses.dataclass
class SelectionRun:
    """One run: its metrics lines and the reward of each step's policy on the questions needing search."""

    metrics: Sequence[Mapping[str, object]]
    curve: list[float]


def _search() -> ScriptedSearch:
    """The offline world's passages (every hop of the known questions is one of them), no latency."""
    from searchr1.bench.off_policy import _world_search

    return _world_search(0, latency_tail=False)


def _probe(service: ServiceClient, tokenizer: Qwen35Tokenizer, examples: Sequence[SearchExample], seed: int,
           path: Path, group: int) -> None:
    """The base policy's probe of ``examples`` into ``path`` (as ``probe-data`` writes it)."""
    from searchr1.core.rollout import RolloutConfig
    from searchr1.evaluation.probe import ProbeRunner, probe_dataset

    rollout = RolloutConfig(group_size=group, seed=seed)

    async def probe() -> None:
        sampler = await service.create_sampling_client_async(base_model="Qwen/Qwen3.5-4B")
        runner = ProbeRunner(sampler, tokenizer, _search(), {}, rollout,
                             asyncio.Semaphore(rollout.sampling_concurrency))
        await probe_dataset(runner, examples, path, {"policy": "twin learning policy (untrained)", "seed": seed})

    asyncio.run(probe())


def _curve(service: ServiceClient, tokenizer: Qwen35Tokenizer, weights: Sequence[str],
           questions: Sequence[SearchExample], group: int) -> list[float]:
    """The mean reward of each saved policy on ``questions`` (``group`` samples each, the same seeds
    for every policy)."""
    from searchr1.core.reward import score_trajectories
    from searchr1.core.rollout import RolloutConfig, rollout_batch_async
    from searchr1.search.tool import with_search

    import pytrio

    assert isinstance(service, pytrio.ServiceClient)  # the twin's real client (variants_by_seed)
    rollout = RolloutConfig(group_size=group, seed=12345)
    curve = []
    for path in weights:
        sampler = service.create_sampling_client(base_model="Qwen/Qwen3.5-4B", model_path=path)
        trajectories = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(_search()), list(questions),
                                                       rollout))
        score_trajectories(trajectories)
        curve.append(statistics.fmean(t.reward for t in trajectories))
    return curve


def _run(service: ServiceClient, tokenizer: Qwen35Tokenizer, variant: str, seed: int, home: Path, steps: int,
         size: BatchSize) -> SelectionRun:
    from searchr1.data.dataset import load_examples, shuffled_examples
    from searchr1.offline import MIXED_TRAIN, TRAIN
    from searchr1.run.directory import RunDir
    from searchr1.training.filters import apply_recorded_drops, filter_examples
    from searchr1.evaluation.probe import read_probe
    from searchr1.training.loop import TrainingRun

    group = size.get("group", 8)
    probe = home / f"probe-{seed}.jsonl"
    if not probe.exists():
        _probe(service, tokenizer, load_examples(MIXED_TRAIN), seed, probe, ATTEMPTS)
    base = _config(steps, **size)
    config = dataclasses.replace(base, seed=seed, data=str(MIXED_TRAIN), save_every=1, probe=str(probe),
                                 drop_guessable=1 if variant == "curriculum" else 0,
                                 curriculum=variant == "curriculum")
    examples = shuffled_examples(str(MIXED_TRAIN), seed)
    if config.drop_guessable:
        dropped = filter_examples(examples, read_probe(probe), drop_guessable=1, drop_solved=False).dropped
        config = dataclasses.replace(config, dropped_questions=dropped)
        examples = apply_recorded_drops(examples, dropped)
    run = RunDir(home / f"run-{variant}-{seed}-{time.monotonic_ns()}")
    run.create(config.to_json())
    training = TrainingRun(config, run, service=service, tokenizer=tokenizer, search=_search(), examples=examples)
    asyncio.run(training.run_steps(None))
    weights = [str(entry["weights_path"]) for entry in run.checkpoints()]
    return SelectionRun(run.metrics(), _curve(service, tokenizer, weights, load_examples(TRAIN), group))


def _steps_to_target(curve: Sequence[float]) -> int | None:
    for end in range(REWARD_WINDOW, len(curve) + 1):
        if statistics.fmean(curve[end - REWARD_WINDOW:end]) >= REWARD_TARGET:
            return end
    return None


def _mean_of(runs: Sequence[SelectionRun], key: str) -> float:
    return statistics.fmean(as_float(line.get(key, 0.0), key) for run in runs for line in run.metrics)


def _while_learning(runs: Sequence[SelectionRun], key: str) -> float:
    """The mean of ``key`` over each run's steps before its policy first reaches the reward target
    (all its steps when it never does): the batches chosen while there was still something to learn."""
    values = []
    for run in runs:
        end = _steps_to_target(run.curve) or len(run.metrics)
        values += [as_float(line.get(key, 0.0), key) for line in run.metrics[:end]]
    return statistics.fmean(values)


def curriculum_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    started = time.perf_counter()
    steps = QUICK_STEPS if quick else STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    seeds = [seed + index for index in range(QUICK_SEEDS if quick else SEEDS)]
    runs = variants_by_seed(tokenizer, VARIANTS, seeds, "searchr1-bench-curriculum-",
                            lambda service, home, variant, train_seed: _run(service, tokenizer, variant, train_seed,
                                                                            home, steps, size))
    never = steps + 1
    reached = {name: [_steps_to_target(run.curve) for run in lines] for name, lines in runs.items()}
    steps_of = {name: statistics.fmean(r if r is not None else never for r in found) for name, found in reached.items()}
    wasted = {name: _mean_of(lines, "data/solved_or_guessable_share") for name, lines in runs.items()}
    measures = [
        Measure("wasted_ratio", "curriculum's share of the batch on solved or guessable questions, over uniform's "
                "(target: at most half)", wasted["curriculum"] / wasted["uniform"] if wasted["uniform"] else 0.0,
                0.5, "<=", "x", digits=2),
        Measure("steps_ratio", f"curriculum's mean steps to reward {REWARD_TARGET} on the questions needing search, "
                "over uniform's (target: fewer, at most 0.99)", steps_of["curriculum"] / steps_of["uniform"], 0.99,
                "<=", "x", digits=2),
    ]
    for name in VARIANTS:
        lines = runs[name]
        measures += [
            Measure(f"steps_{name}", f"  mean steps to reward {REWARD_TARGET} on the 12 questions needing search "
                    f"(never: {never}): {LABELS[name]}", steps_of[name], unit="steps", digits=1),
            Measure(f"reached_{name}", "    seeds reaching it", sum(r is not None for r in reached[name]),
                    unit="runs", digits=0),
            Measure(f"final_{name}", "    reward on them after the last step",
                    statistics.fmean(run.curve[-1] for run in lines), unit="reward", digits=3),
            Measure(f"wasted_{name}", "    share of the batch on solved or guessable questions", wasted[name],
                    unit="share", digits=3),
            Measure(f"wasted_learning_{name}", f"      before the run reaches reward {REWARD_TARGET}",
                    _while_learning(lines, "data/solved_or_guessable_share"), unit="share", digits=3),
            Measure(f"solved_{name}", "    of which solved (every sample of the group right)",
                    _mean_of(lines, "data/solved_share"), unit="share", digits=3),
            Measure(f"guessable_{name}", "    of which guessable (the probe answered them closed-book)",
                    _mean_of(lines, "data/guessable_share"), unit="share", digits=3),
            Measure(f"searches_{name}", "    searches per trajectory", _mean_of(lines, "rollout/search_calls"),
                    unit="searches", digits=2),
        ]
    figure = Figure(
        number=18, name="curriculum", title="Which questions to train on: uniform against the probe's filter and "
                                             "the curriculum",
        measures=measures,
        details={"seeds": seeds, "steps": steps, "reached": reached,
                 "curves": {name: [run.curve for run in lines] for name, lines in runs.items()},
                 "solved_or_guessable": {name: [[line.get("data/solved_or_guessable_share") for line in run.metrics]
                                                for run in lines] for name, lines in runs.items()}},
        notes=[f"{steps} steps of 8 questions x 8 samples on mixed_train.jsonl (12 questions needing search, 8 the "
               f"base twin knows), Adam lr 0.2, {plural(len(seeds), 'training seed')} from {seeds[0]}; each seed's "
               f"probe: {ATTEMPTS} attempts closed-book and with search by the base policy",
               "policy: the offline twin's learning policy, not the model"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
