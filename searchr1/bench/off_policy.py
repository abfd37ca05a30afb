"""Figures 6 and 7: what bounded off-policy rollouts buy, and how fast the offline world learns.

Figure 6 (throughput). The real trainer runs the offline question set on the learning policy,
against a twin in a process of its own that plays back modelled service times: sampling per
request and per token, training per input token, the optimiser step and every weight save,
while the in-memory search answers the world's queries with a lognormal latency tail. The same
run is repeated at ``--max-steps-off-policy`` 0, 1 and 2; each reports steps per hour over the
steps after the first (which also loads the SDK's tokenizer). The K=0 run's own stage times give
the two bounds: sequential (rollout + training + weight save, the most an on-policy loop can do)
and the pipeline limit (training + weight save alone: the training run executes its events one
after another, while rollout is bound by latency, not by capacity, so enough batches in flight
hide it entirely; no depth K can beat the training queue). A reference loop,
the sequential step this project had before the pipeline (sampler, rollout, datums, one
forward_backward, one optim_step), runs on the same twin: K=0 must produce its metrics exactly.

Figure 7 (learning speed). On an in-process twin with no latency, the steps until the mean
reward over the last three steps reaches 0.8: our defaults, the same at K=1 (the target:
at most 20 % more steps), and the lab port's settings (the sampling seeds of every step equal,
as the lab port reused ``seed + index``, and manual micro-batch accumulation with n_k/N weights).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

import numpy as np

from searchr1.basics.json_types import as_float
from searchr1.bench.report import LAB_PORT, Figure, Measure
from searchr1.basics.wording import plural
from searchr1.bench.served import served_twin
from searchr1.core.credit import Credit, StepReward
from searchr1.core.objective import LossFn
from searchr1.core.types import ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.search.tool import SearchBackend
    from searchr1.training.config import Accumulation, TrainConfig
    from searchr1.twin import TwinFaults
    from searchr1.twin.scripted_search import ScriptedSearch


class BatchSize(TypedDict, total=False):
    """A smaller batch than the figures' 8 questions x 8 samples: ``_config``'s keywords."""

    questions: int
    group: int


BASE_STEPS, QUICK_STEPS = 7, 2
LEARN_STEPS, QUICK_LEARN_STEPS = 18, 3
REWARD_TARGET, REWARD_WINDOW = 0.8, 3
class ConfigChanges(TypedDict, total=False):
    """The settings a figure's variants change in ``_config``'s run (``dataclasses.replace``)."""

    loss_fn: LossFn
    kl_coef: float
    dynamic_sampling: bool
    num_substeps: int
    learning_rate: float
    beta1: float
    credit: Credit
    step_reward: StepReward


QUICK_SIZE: BatchSize = {"questions": 2, "group": 4}  # --quick: a smoke run, not held to the targets
# Service times (seconds) of the throughput workload: training is about a third of a step.
SAMPLE_REQUEST, SAMPLED_TOKEN = 0.06, 0.003
TRAINED_TOKEN, OPTIM_STEP, WEIGHT_SAVE = 1.6e-5, 0.05, 0.08
SEARCH_MEDIAN, SEARCH_SIGMA, SEARCH_CAP = 0.08, 0.8, 1.0


def _world_search(seed: int, *, latency_tail: bool = True) -> ScriptedSearch:
    """The offline world's passages behind an in-memory backend with a lognormal latency tail
    (a hash of the query and the seed draws each latency, so every run sees the same ones)."""
    import hashlib

    from searchr1.twin.scripted_search import ScriptedSearch
    from searchr1.core.types import SearchItem, SearchResult
    from searchr1.twin.offline_world import load_world, passages_by_query

    results = {query: SearchResult(True, (SearchItem(hop.title, hop.text, "offline"),))
               for query, hop in passages_by_query(load_world()).items()}

    def latency(query: str) -> float:
        digest = hashlib.sha256(f"{seed}/{query}".encode()).digest()
        normal = np.random.default_rng(int.from_bytes(digest[:8], "little")).normal()
        return float(min(SEARCH_CAP, SEARCH_MEDIAN * np.exp(SEARCH_SIGMA * normal)))

    return ScriptedSearch(results, latency=latency if latency_tail else None)


def _config(steps: int, *, k: int = 0, accumulation: Accumulation = "sdk", questions: int = 8,
            group: int = 8) -> TrainConfig:
    from searchr1.offline import TRAIN, OfflinePolicy
    from searchr1.core.rollout import RolloutConfig
    from searchr1.training.config import TrainConfig

    return TrainConfig(max_steps=steps, data=str(TRAIN), run_name="bench", questions_per_batch=questions,
                       learning_rate=0.2, save_every=0, transcripts_per_step=0, offline=True,
                       offline_policy=OfflinePolicy.LEARNING, max_steps_off_policy=k, accumulation=accumulation,
                       rollout=RolloutConfig(group_size=group), run_id="bench000")


def _train(service: ServiceClient, config: TrainConfig, tokenizer: Qwen35Tokenizer, search: SearchBackend,
           home: Path) -> Sequence[Mapping[str, object]]:
    """One training run; its metrics lines."""
    from searchr1.data.dataset import shuffled_examples
    from searchr1.run.directory import RunDir
    from searchr1.training.loop import TrainingRun

    run = RunDir(home / f"run-k{config.max_steps_off_policy}-{config.accumulation}-{time.monotonic_ns()}")
    run.create(config.to_json())
    trainer = TrainingRun(config, run, service=service, tokenizer=tokenizer, search=search,
                      examples=shuffled_examples(config.data, config.seed))
    asyncio.run(trainer.run_steps(None))
    return run.metrics()


async def _reference_loop(service: ServiceClient, config: TrainConfig, tokenizer: Qwen35Tokenizer,
                          search: SearchBackend) -> list[dict[str, float]]:
    """The sequential step as it was before the pipeline, for the K=0 identity check."""
    import pytrio as trio

    from searchr1.core.advantage import assign_group_advantages, summarize_groups
    from searchr1.core.reward import score_trajectories
    from searchr1.data.dataset import shuffled_examples, take_batch
    from searchr1.core.datum import build_training_datums
    from searchr1.training.step_metrics import rollout_metrics
    from searchr1.core.rollout import rollout_batch_async
    from searchr1.search.tool import with_search

    client = service.create_lora_training_client(base_model=config.base_model, rank=config.lora_rank,
                                                 seed=config.seed)
    examples = shuffled_examples(config.data, config.seed)
    lines = []
    for step in range(config.max_steps):
        batch = take_batch(examples, step * config.questions_per_batch, config.questions_per_batch)
        sampler = await client.save_weights_and_get_sampling_client_async()
        trajectories = await rollout_batch_async(sampler, tokenizer, with_search(search), batch, config.rollout,
                                                 step=step)
        score_trajectories(trajectories)
        assign_group_advantages(trajectories)
        datums = build_training_datums(trajectories, max_tokens=config.rollout.max_trajectory_tokens)
        line = {"reward/mean": rollout_metrics(trajectories, summarize_groups(trajectories))["reward/mean"]}
        if datums:
            output = await (await client.forward_backward_async([d.datum for d in datums],
                                                                loss_fn="importance_sampling"))
            adam = trio.AdamParams(learning_rate=config.learning_rate, beta1=config.beta1, beta2=config.beta2)
            optim = await (await client.optim_step_async(adam))
            line.update({"trainer/loss_sum": float(output.metrics["loss_sum"]),
                         "optim/grad_norm": float(optim.metrics.get("grad_norm", 0.0))})
        lines.append(line)
    return lines


def _step_seconds(line: Mapping[str, object]) -> float:
    return as_float(line["time/step_seconds"], "time/step_seconds")


def _steps_per_hour(metrics: Sequence[Mapping[str, object]]) -> float:
    seconds = [_step_seconds(m) for m in metrics[1:]] or [_step_seconds(m) for m in metrics]
    return 3600.0 / float(np.mean(seconds))


def off_policy_throughput_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    from searchr1.twin.config import Latencies

    started = time.perf_counter()
    steps = QUICK_STEPS if quick else BASE_STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    latencies = Latencies() if quick else Latencies(
        sample_request=SAMPLE_REQUEST, sampled_token=SAMPLED_TOKEN, trained_token=TRAINED_TOKEN,
        optim_step=OPTIM_STEP, weight_save=WEIGHT_SAVE)
    runs: dict[int, Sequence[Mapping[str, object]]] = {}
    repetitions = 1 if quick else 2
    repeats: dict[int, list[Sequence[Mapping[str, object]]]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-async-") as scratch, \
            served_twin(None, latencies, in_process=quick, tokenizer=tokenizer, policy="learning",
                        max_staleness=2) as service:
        for k in (0, 1, 2):
            runs[k] = _train(service, _config(steps, k=k, **size), tokenizer, _world_search(seed,
                                                                                            latency_tail=not quick),
                             Path(scratch))
        for _ in range(repetitions - 1):  # K=0 and K=1 again, interleaved: the spread of the targeted ratio
            for k in (0, 1):
                repeats[k].append(_train(service, _config(steps, k=k, **size), tokenizer,
                                         _world_search(seed, latency_tail=not quick), Path(scratch)))
        reference = asyncio.run(_reference_loop(service, _config(steps, **size), tokenizer,
                                                _world_search(seed, latency_tail=not quick)))
    keys = ("reward/mean", "trainer/loss_sum", "optim/grad_norm")
    same = sum(all(line.get(key) == ref.get(key) for key in keys) for line, ref in zip(runs[0], reference))
    measured = runs[0][1:] or runs[0]
    rollout = float(np.mean([as_float(m["time/rollout_seconds"], "time/rollout_seconds") for m in measured]))
    train = float(np.mean([as_float(m["time/train_seconds"], "time/train_seconds") for m in measured]))
    save = float(np.mean([max(0.0, as_float(m["time/rollout_wait_seconds"], "time/rollout_wait_seconds")
                              - as_float(m["time/rollout_seconds"], "time/rollout_seconds")) for m in measured]))
    sequential, pipeline_limit = 3600.0 / (rollout + train + save), 3600.0 / (train + save)
    rate = {k: _steps_per_hour(lines) for k, lines in runs.items()}
    target = 1.3

    def speedup(k: int) -> Measure:
        """K / K=0; for K=1 with the spread of the interleaved repetitions (each a K=0, K=1 pair)."""
        label, key = f"steps per hour, K={k} / K=0", f"k{k}_over_k0_throughput"
        if k != 1:
            return Measure(key, label, rate[k] / rate[0], unit="x")
        pairs = [(runs[0], runs[1])] + list(zip(repeats[0], repeats[1]))
        return Measure.of_samples(key, label, [_steps_per_hour(b) / _steps_per_hour(a) for a, b in pairs], target,
                                  ">=", "x", spread_bound=0.15)

    measures = [
        speedup(1),
        speedup(2),
        Measure("k0_equals_sequential_loop", "K=0 steps identical to the sequential reference loop",
                same / len(reference), 1.0, ">=", digits=2),
        Measure("train_share_of_k0_step", "training share of a K=0 step", 100.0 * train / (rollout + train + save),
                unit="%", digits=0),
    ]
    for k in (0, 1, 2):
        measures.append(Measure(f"steps_per_hour_k{k}", f"  steps per hour, K={k}", rate[k], unit="/h", digits=0))
    measures += [
        Measure("sequential_bound", "  sequential bound (sum of the stages)", sequential, unit="/h", digits=0),
        Measure("pipeline_limit", "  pipeline limit (training + weight save alone, any K)", pipeline_limit,
                unit="/h", digits=0),
        Measure("k2_over_pipeline_limit", "  K=2 / pipeline limit", rate[2] / pipeline_limit, unit="x"),
    ]
    figure = Figure(
        number=6, name="off_policy_throughput", title="Overlapping rollouts with training (--max-steps-off-policy)",
        measures=measures,
        details={"steps_run": steps, "stage_seconds_k0": {"rollout": rollout, "train": train, "weight_save": save},
                 "bounds_per_hour": {"sequential": sequential, "pipeline_limit": pipeline_limit},
                 "repeated_steps_per_hour": {k: [_steps_per_hour(lines) for lines in repeats[k]] for k in repeats},
                 "latencies": latencies.__dict__,
                 "search": {"median": SEARCH_MEDIAN, "sigma": SEARCH_SIGMA, "cap": SEARCH_CAP},
                 "staleness_mean": {k: float(np.mean([as_float(m.get("async/staleness_mean", 0.0),
                                                               "async/staleness_mean") for m in lines]))
                                    for k, lines in runs.items()}},
        notes=[f"{size.get('questions', 8)} questions x {size.get('group', 8)} samples on the learning policy, "
               f"{steps} steps each, the first not timed; "
               f"K=0 stages: rollout {rollout:.2f} s, training {train:.2f} s, weight save {save:.2f} s",
               "rollout is latency-bound (the twin models no sampler capacity beyond the sampling cap), so a "
               "deeper pipeline hides more of it; the training run's own queue (training + weight save) is the "
               f"limit no K passes; K=0 and K=1 run {plural(repetitions, 'time')}, interleaved (the K=1 / K=0 "
               f"spread), K=2 once"],
    )
    figure.seconds = time.perf_counter() - started
    return figure


@contextlib.contextmanager
def _lab_port_sampling_seeds() -> Iterator[None]:
    """Every step samples with the same seeds (the lab port's ``seed + index``)."""
    from searchr1.core import rollout

    original = rollout.sampling_seed

    def same_seeds(base: int, step: int, question_index: int, group_index: int, turn: int) -> int:
        return original(base, 0, question_index, group_index, turn)

    rollout.sampling_seed = same_seeds
    try:
        yield
    finally:
        rollout.sampling_seed = original


def steps_to_reward(metrics: Sequence[Mapping[str, object]], target: float = REWARD_TARGET,
                    window: int = REWARD_WINDOW) -> int | None:
    """Steps until the mean reward of the last ``window`` steps first reaches ``target``."""
    rewards = [as_float(m["reward/mean"], "reward/mean") for m in metrics]
    for end in range(window, len(rewards) + 1):
        if np.mean(rewards[end - window:end]) >= target:
            return end
    return None


R = TypeVar("R")


def variants_by_seed(tokenizer: Qwen35Tokenizer, variants: Sequence[str], seeds: Sequence[int], prefix: str,
                     run: Callable[[ServiceClient, Path, str, int], R], *,
                     faults: TwinFaults | None = None, max_staleness: int = 0) -> dict[str, list[R]]:
    """``run(service, home, variant, seed)`` for every variant on every seed, the variants side by
    side on each seed, on one in-process twin serving the learning policy (no latency, ``faults``
    injected, strict with ``max_staleness``) in a scratch directory named with ``prefix``."""
    from searchr1.twin import Strictness, start_twin

    runs: dict[str, list[R]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        home = Path(scratch)
        with start_twin(home=home / "twin", tokenizer=tokenizer, policy="learning",
                        strictness=Strictness(max_staleness=max_staleness), faults=faults) as twin:
            service = twin.service_client()
            for seed in seeds:
                for name in variants:
                    runs[name].append(run(service, home, name, seed))
    return runs


def steps_mean(reached: Sequence[int | None], never: int) -> float:
    """The mean of :func:`steps_to_reward` over runs, a run that never reaches it counting ``never``."""
    return statistics.fmean(r if r is not None else never for r in reached)


def learning_speed_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    from searchr1.twin import Strictness, start_twin

    started = time.perf_counter()
    steps = QUICK_LEARN_STEPS if quick else LEARN_STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    runs: dict[str, Sequence[Mapping[str, object]]] = {}
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-learn-") as scratch:
        home = Path(scratch)
        with start_twin(home=home / "twin", tokenizer=tokenizer, policy="learning",
                        strictness=Strictness(max_staleness=1)) as twin:
            service = twin.service_client()
            runs["ours"] = _train(service, _config(steps, **size), tokenizer, _world_search(seed), home)
            runs["ours_k1"] = _train(service, _config(steps, k=1, **size), tokenizer, _world_search(seed), home)
            with _lab_port_sampling_seeds():
                runs[LAB_PORT] = _train(service, _config(steps, accumulation="manual", **size), tokenizer,
                                        _world_search(seed), home)
    reached = {name: steps_to_reward(lines) for name, lines in runs.items()}
    never = steps + 1  # a run that never reaches the target counts as one step past the end

    def value(name: str) -> float:
        found = reached[name]
        return float(found if found is not None else never)

    measures = [
        Measure("k1_steps_over_k0", f"steps to reward {REWARD_TARGET}, K=1 / K=0", value("ours_k1") / value("ours"),
                1.2, "<=", "x"),
        Measure("steps_ours", f"  steps to reward {REWARD_TARGET} (mean of {REWARD_WINDOW}), our defaults",
                value("ours"), unit="steps", digits=0),
        Measure("steps_ours_k1", "  the same with --max-steps-off-policy 1", value("ours_k1"), unit="steps",
                digits=0),
        Measure("steps_seed", "  the lab port's settings (same seeds every step, n_k/N micro-batches)", value(LAB_PORT),
                unit="steps", digits=0),
    ]
    figure = Figure(
        number=7, name="learning_speed", title="Learning speed on the offline world",
        measures=measures,
        details={"steps_run": steps, "reached": reached,
                 "reward_curves": {name: [m["reward/mean"] for m in lines] for name, lines in runs.items()}},
        notes=[f"{steps} steps of {size.get('questions', 8)} questions x {size.get('group', 8)} samples, "
               f"Adam lr 0.2; a run that never reaches the target counts as {never} steps"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
