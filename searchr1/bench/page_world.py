"""Figure 12: one tool against two on the offline page questions.

On an in-process twin with no latency serving the learning policy, the page questions' train
split (``searchr1/offline/pages_train.jsonl``: 8 questions whose answer is only in a page's
body) is trained with ``--tools search,open_page`` and with ``--tools search``, both over
``--backend local`` on the shipped corpus's index, 8 questions x 8 samples, Adam lr 0.2, for
``STEPS`` steps on each of 8 training seeds (the bench's seed and the 7 after it). For each tool
set: the runs that reach a mean reward of 0.8 over three consecutive steps, their mean steps to
it (a run that never reaches it counts as one step past the end), the mean reward of the last
three steps, and the share of trajectories that opened a page over those steps.

With search alone a page hop's search shows the page's lead and never its evidence, so no run
can reach the target; with ``open_page`` every run should. The figure takes minutes, so it is
opt-in (``--only 12``).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from searchr1.basics.json_types import as_float
from searchr1.bench.off_policy import REWARD_TARGET, REWARD_WINDOW, steps_to_reward
from searchr1.bench.report import Figure, Measure
from searchr1.core.types import ServiceClient
from searchr1.runtime.tokenizer import Qwen35Tokenizer

if TYPE_CHECKING:
    from searchr1.training.config import TrainConfig

STEPS, QUICK_STEPS = 18, 3
SEEDS, QUICK_SEEDS = 8, 1
TOOL_SETS = ("search,open_page", "search")


def _config(tools: str, steps: int, seed: int) -> TrainConfig:
    from searchr1.training.config import TrainConfig
    from searchr1.core.rollout import RolloutConfig
    from searchr1.offline import PAGES_TRAIN, OfflinePolicy

    return TrainConfig(max_steps=steps, data=str(PAGES_TRAIN), run_name="bench", questions_per_batch=8,
                       learning_rate=0.2, save_every=0, transcripts_per_step=0, offline=True,
                       offline_policy=OfflinePolicy.LEARNING, seed=seed,
                       rollout=RolloutConfig(group_size=8, tools=tuple(tools.split(","))),
                       run_id="bench000")


def _train(service: ServiceClient, config: TrainConfig, tokenizer: Qwen35Tokenizer,
           home: Path) -> Sequence[Mapping[str, object]]:
    from searchr1.bm25.shipped import offline_index
    from searchr1.data.dataset import shuffled_examples
    from searchr1.run.directory import RunDir
    from searchr1.wiring.services import tool_backends
    from searchr1.search.local import LocalSearchBackend
    from searchr1.training.loop import TrainingRun

    run = RunDir(home / f"run-{'-'.join(config.rollout.tools)}-{config.seed}")
    run.create(config.to_json())
    search = LocalSearchBackend(index=offline_index())
    trainer = TrainingRun(config, run, service=service, tokenizer=tokenizer, search=search,
                          tools=tool_backends(config.rollout.tools, search),
                          examples=shuffled_examples(config.data, config.seed))
    try:
        asyncio.run(trainer.run_steps(None))
    finally:
        asyncio.run(search.aclose())
    return run.metrics()


def page_world_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False) -> Figure:
    from searchr1.twin import start_twin

    started = time.perf_counter()
    steps = QUICK_STEPS if quick else STEPS
    seeds = list(range(seed, seed + (QUICK_SEEDS if quick else SEEDS)))
    runs: dict[str, list[Sequence[Mapping[str, object]]]] = {tools: [] for tools in TOOL_SETS}
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-pages-") as scratch:
        home = Path(scratch)
        with start_twin(home=home / "twin", tokenizer=tokenizer, policy="learning") as twin:
            service = twin.service_client()
            for run_seed in seeds:
                for tools in TOOL_SETS:
                    runs[tools].append(_train(service, _config(tools, steps, run_seed), tokenizer, home))
    never = steps + 1

    def reached(tools: str) -> list[int | None]:
        return [steps_to_reward(lines) for lines in runs[tools]]

    def mean_steps(tools: str) -> float:
        return float(np.mean([never if r is None else r for r in reached(tools)]))

    def last_reward(tools: str) -> float:
        return float(np.mean([np.mean([as_float(line["reward/mean"], "reward/mean") for line in lines[-REWARD_WINDOW:]])
                              for lines in runs[tools]]))

    def share_reached(tools: str) -> float:
        return sum(r is not None for r in reached(tools)) / len(seeds)

    opened = statistics.fmean(np.mean([as_float(line.get("tool/open_page/calls", 0.0), "tool/open_page/calls")
                                       for line in lines[-REWARD_WINDOW:]])
                              for lines in runs["search,open_page"])
    two, one = TOOL_SETS
    measures = [
        Measure("two_tools_reach_target", f"runs reaching reward {REWARD_TARGET}, search + open_page",
                share_reached(two), 1.0, ">=", "of runs", target_source="bench"),
        Measure("one_tool_reaches_target", f"runs reaching reward {REWARD_TARGET}, search alone",
                share_reached(one), 0.0, "<=", "of runs", target_source="bench"),
        Measure("last_reward_gap", f"mean reward of the last {REWARD_WINDOW} steps, two tools - one",
                last_reward(two) - last_reward(one), 0.5, ">=", target_source="bench"),
        Measure("steps_two_tools", f"  steps to reward {REWARD_TARGET} (mean of {REWARD_WINDOW}), two tools",
                mean_steps(two), unit="steps", digits=1),
        Measure("steps_one_tool", "  the same, search alone", mean_steps(one), unit="steps", digits=1),
        Measure("pages_opened", f"  open_page calls a trajectory, last {REWARD_WINDOW} steps, two tools", opened),
    ]
    figure = Figure(
        number=12, name="page_world", title="One tool against two on the page questions",
        measures=measures,
        details={"steps_run": steps, "seeds": seeds,
                 "reached": {tools: reached(tools) for tools in TOOL_SETS},
                 "reward_curves": {tools: [[line["reward/mean"] for line in lines] for lines in runs[tools]]
                                   for tools in TOOL_SETS},
                 "open_page_calls": [[line.get("tool/open_page/calls", 0.0) for line in lines]
                                     for lines in runs[two]]},
        notes=[f"{steps} steps of 8 page questions x 8 samples on each of {len(seeds)} seeds, Adam lr 0.2, "
               f"--backend local; a run that never reaches the target counts as {never} steps"],
    )
    figure.seconds = time.perf_counter() - started
    return figure
