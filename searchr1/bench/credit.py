"""Figure 14: credit per turn on the offline world: trajectory-level GRPO, GiGPO, and GiGPO with
step rewards, over several training seeds.

Each variant trains the learning policy of an in-process twin (no latency) on the offline train
questions, figure 7's workload (8 questions x 8 samples, Adam lr 0.2, 18 steps), once per
training seed (the bench's seed and the 7 after it). Per variant: the mean over seeds of the
steps until the mean reward of three consecutive steps reaches 0.8 (a run that never does counts
as one step past the end), how many seeds reach it, the share of search calls over the whole run
that repeat an earlier call of their trajectory (same query, case and spacing aside; read from
every trajectory's transcript), and exact match on the 14 dev questions after the last step
(greedy, one sample each, as ``eval`` samples). The target is the issue's: GiGPO reaches 0.8 in at
most 0.8x GRPO's steps, mean over seeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.bench.off_policy import LEARN_STEPS, QUICK_LEARN_STEPS, QUICK_SIZE, REWARD_TARGET, _config, _world_search
from searchr1.bench.off_policy import BatchSize, ConfigChanges, steps_mean, steps_to_reward, variants_by_seed
from searchr1.bench.report import Figure, Measure
from searchr1.basics.wording import plural
from searchr1.core.credit import Credit, StepReward
from searchr1.core.types import ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.training.config import TrainConfig

SEEDS, QUICK_SEEDS = 8, 1
VARIANTS: dict[str, ConfigChanges] = {
    "grpo": {},
    "gigpo": {"credit": Credit.GIGPO},
    "gigpo_step": {"credit": Credit.GIGPO, "step_reward": StepReward.EVIDENCE},
}
LABELS = {
    "grpo": "trajectory credit (GRPO, the lab port)",
    "gigpo": "--credit gigpo (omega 1, gamma 0.95)",
    "gigpo_step": "--credit gigpo --step-reward evidence (+0.1 first sight, -0.1 a repeat)",
}
STEP_RATIO_TARGET = 0.8  # GiGPO's steps to the reward target over GRPO's (mean over seeds)


@dataclasses.dataclass
class CreditRun:
    """One training run of a variant: its metrics, its repeated-search share, its dev EM, and how
    far its turns' advantages moved from their trajectories'."""

    metrics: Sequence[Mapping[str, object]]
    repeat_share: float
    dev_em: float
    reversed_share: float  # trained turns whose advantage has the other sign than their trajectory's
    step_size: float  # mean |turn advantage - trajectory advantage| over mean |trajectory advantage|


def repeated_search_share(transcripts: Path) -> float:
    """Search calls that repeat an earlier call of their trajectory (:func:`~searchr1.core.credit.call_key`,
    as the step reward counts them), over all search calls that ran, in every transcript of a run."""
    import json

    from searchr1.core.credit import call_key

    calls = repeats = 0
    for line in transcripts.read_text("utf-8").splitlines():
        seen: set[tuple[str, str]] = set()
        for call in json.loads(line).get("searches", []):
            if call.get("tool", "search") != "search" or call.get("refused"):
                continue
            key = call_key("search", str(call.get("query", "")))
            calls += 1
            repeats += key in seen
            seen.add(key)
    return repeats / calls if calls else 0.0


def turn_credit_spread(transcripts: Path) -> tuple[float, float]:
    """Over every trained turn of a run's transcripts: the share whose advantage has the sign
    opposite to its trajectory's, and the mean distance of a turn's advantage from its
    trajectory's relative to the mean size of a trajectory's advantage (0 and 0 for trajectory
    credit)."""
    import json

    turns = reversed_turns = 0
    moved = size = 0.0
    for line in transcripts.read_text("utf-8").splitlines():
        record = json.loads(line)
        if record.get("excluded") is not None:
            continue
        whole = float(record["advantage"])
        for turn in record["turns"]:
            turns += 1
            reversed_turns += float(turn["advantage"]) * whole < 0
            moved += abs(float(turn["advantage"]) - whole)
            size += abs(whole)
    return (reversed_turns / turns if turns else 0.0), (moved / size if size else 0.0)


def _train_and_evaluate(service: ServiceClient, config: TrainConfig, tokenizer: Qwen35Tokenizer,
                        home: Path) -> CreditRun:
    from searchr1.core.reward import score_trajectories
    from searchr1.core.rollout import RolloutConfig, rollout_batch_async
    from searchr1.data.dataset import load_examples, shuffled_examples
    from searchr1.offline import DEV
    from searchr1.run.directory import RunDir
    from searchr1.search.tool import with_search
    from searchr1.training.loop import TrainingRun

    run = RunDir(home / f"run-{config.seed}-{config.credit}-{config.step_reward}-{time.monotonic_ns()}")
    run.create(config.to_json())
    search = _world_search(0, latency_tail=False)
    training = TrainingRun(config, run, service=service, tokenizer=tokenizer, search=search,
                           examples=shuffled_examples(config.data, config.seed))
    asyncio.run(training.run_steps(None))
    client = training.trainer.training_client
    assert client is not None
    sampler = asyncio.run(client.save_weights_and_get_sampling_client_async())
    greedy = RolloutConfig(group_size=1, temperature=0.0, seed=config.seed)
    dev = asyncio.run(rollout_batch_async(sampler, tokenizer, with_search(search), load_examples(DEV), greedy))
    score_trajectories(dev)
    transcripts = run.path / "transcripts.jsonl"
    dev_em = statistics.fmean(t.score.exact_match for t in dev)
    return CreditRun(run.metrics(), repeated_search_share(transcripts), dev_em, *turn_credit_spread(transcripts))


def credit_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    started = time.perf_counter()
    steps = QUICK_LEARN_STEPS if quick else LEARN_STEPS
    size: BatchSize = QUICK_SIZE if quick else {}
    seeds = [seed + index for index in range(QUICK_SEEDS if quick else SEEDS)]

    def run(service: ServiceClient, home: Path, name: str, train_seed: int) -> CreditRun:
        config = dataclasses.replace(_config(steps, **size), seed=train_seed, transcripts_per_step=1024,
                                     **VARIANTS[name])
        return _train_and_evaluate(service, config, tokenizer, home)

    runs = variants_by_seed(tokenizer, list(VARIANTS), seeds, "searchr1-bench-credit-", run)
    never = steps + 1
    reached = {name: [steps_to_reward(run.metrics) for run in lines] for name, lines in runs.items()}
    mean_steps = {name: steps_mean(values, never) for name, values in reached.items()}
    measures = [Measure("gigpo_step_ratio", f"GiGPO's steps to reward {REWARD_TARGET} / GRPO's (mean over seeds)",
                        mean_steps["gigpo"] / mean_steps["grpo"], STEP_RATIO_TARGET, "<=", "x",
                        target_source="project")]
    measures.append(Measure("gigpo_step_reward_ratio", "  the same with step rewards / GRPO's",
                            mean_steps["gigpo_step"] / mean_steps["grpo"], unit="x", digits=2))
    for name in VARIANTS:
        lines = runs[name]
        measures += [
            Measure(f"steps_{name}", f"  mean steps to reward {REWARD_TARGET} (never: {never}): {LABELS[name]}",
                    mean_steps[name], unit="steps", digits=1),
            Measure(f"reached_{name}", f"    seeds reaching it (of {len(lines)})",
                    sum(r is not None for r in reached[name]), unit="runs", digits=0),
            Measure(f"repeats_{name}", "    repeated searches over the run (share of search calls)",
                    statistics.fmean(run.repeat_share for run in lines), unit="share", digits=3),
            Measure(f"dev_em_{name}", "    dev exact match after the last step (greedy)",
                    statistics.fmean(run.dev_em for run in lines), unit="EM", digits=3),
        ]
        if name != "grpo":  # what step credit did to the turns: why the rows above differ, or do not
            measures += [
                Measure(f"reversed_{name}", "    trained turns whose advantage's sign is not their trajectory's",
                        statistics.fmean(run.reversed_share for run in lines), unit="share", digits=3),
                Measure(f"step_size_{name}", "    mean |turn - trajectory advantage| / mean |trajectory advantage|",
                        statistics.fmean(run.step_size for run in lines), unit="x", digits=3),
            ]
    figure = Figure(
        number=14, name="credit", title="Credit per turn on the offline world: GRPO, GiGPO, GiGPO with step rewards",
        measures=measures,
        details={"steps_run": steps, "seeds": seeds, "reached": reached,
                 "reward_curves": {name: [[m["reward/mean"] for m in run.metrics] for run in lines]
                                   for name, lines in runs.items()},
                 "step_group_share": {name: [[m.get("credit/step_group_share") for m in run.metrics]
                                             for run in lines] for name, lines in runs.items() if name != "grpo"},
                 "repeat_share": {name: [run.repeat_share for run in lines] for name, lines in runs.items()},
                 "dev_em": {name: [run.dev_em for run in lines] for name, lines in runs.items()}},
        notes=[f"{steps} steps of {size.get('questions', 8)} questions x {size.get('group', 8)} samples, Adam lr 0.2, "
               f"{plural(len(seeds), 'training seed')} from {seeds[0]}; a run that never reaches the target counts "
               f"as {never} steps",
               "policy: the offline twin's learning policy, not the model; dev EM is the twin's"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
