"""Figure 1: rollout scheduling, our per-trajectory engine against lock-step rounds.

One simulated training step (8 questions x 8 samples, 0-4 searches per trajectory) runs through
the real engine (``rollout_batch_async``) and through :mod:`.lockstep`, both with the scripted
sampler and an in-memory search backend that sleep for the :class:`~.workload.LatencyModel`'s
latencies, played back at ``scale`` (1 model second = 100 ms by default).

Reported against the lower bound (the longest trajectory's own serial latency, raised where
the sampling or search concurrency caps force more):

* wall clock, repetitions interleaved (ours, lock-step, lock-step, ours, ...), medians. This
  includes the engine's own CPU, which weighs ``1 / scale`` times more against these
  latencies than against real ones (10x by default; the reported CPU share shows how much);
* virtual time (:mod:`.vtime`): the same runs with local CPU costing nothing, i.e. the pure
  scheduling policy, deterministic on any machine.

Before any timing, both schedulers must produce identical trajectories (terminations, tokens,
rewards, advantages): otherwise the comparison would not be of the same work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from ..rollout import rollout_batch_async
from ..scripted import ScriptedSearch
from .lockstep import DEFAULT_SEARCH_CONCURRENCY, LockstepRollout
from .report import Figure, Measure
from .vtime import run_virtual
from .workload import (
    LatencyModel,
    MemoSampler,
    Workload,
    WorkloadSpec,
    build_workload,
    fingerprint,
    lower_bound,
    median,
    quick_spec,
    summarize_counts,
)

SCALE = 0.1         # wall seconds per model second in the wall-clock runs (1 s -> 100 ms)
QUICK_SCALE = 0.01


class TrajectoryMismatch(AssertionError):
    """The two schedulers produced different trajectories: the comparison would be unfair."""


@dataclasses.dataclass(frozen=True)
class SchedulingSetup:
    workload: Workload
    model: LatencyModel
    search_concurrency: int
    memo: dict[Any, Any]


def _coroutine(kind: str, setup: SchedulingSetup, tokenizer: Any, model: LatencyModel,
               info: dict[str, Any]) -> Any:
    workload = setup.workload
    sampler = MemoSampler(workload.scenario, tokenizer, latency=model.sampler_latency(), memo=setup.memo)
    search = ScriptedSearch(workload.results, latency=model.search_latency(),
                            concurrency=setup.search_concurrency)
    if kind == "ours":
        return rollout_batch_async(sampler, tokenizer, search, workload.examples, workload.config)
    engine = LockstepRollout(sampler, tokenizer, search, workload.config,
                             search_concurrency=setup.search_concurrency)
    info["lockstep"] = engine.stats
    return engine.run(workload.examples)


def run_wall(kind: str, setup: SchedulingSetup, tokenizer: Any, model: LatencyModel) -> tuple[list[Any], float, float, dict[str, Any]]:
    """One run on the real clock: trajectories, wall seconds, process CPU seconds, info."""
    info: dict[str, Any] = {}
    coroutine = _coroutine(kind, setup, tokenizer, model, info)
    wall, cpu = time.perf_counter(), time.process_time()
    trajectories = asyncio.run(coroutine)
    return trajectories, time.perf_counter() - wall, time.process_time() - cpu, info


def run_virtual_time(kind: str, setup: SchedulingSetup, tokenizer: Any, model: LatencyModel) -> tuple[list[Any], float]:
    info: dict[str, Any] = {}
    trajectories, seconds = run_virtual(_coroutine(kind, setup, tokenizer, model, info))
    return trajectories, seconds


def scheduling_figure(tokenizer: Any, *, seed: int = 0, quick: bool = False,
                      repetitions: int | None = None, scale: float | None = None,
                      spec: WorkloadSpec | None = None) -> Figure:
    started = time.perf_counter()
    spec = spec or (quick_spec() if quick else WorkloadSpec())
    repetitions = repetitions if repetitions is not None else (1 if quick else 2)
    scale = scale if scale is not None else (QUICK_SCALE if quick else SCALE)
    workload = build_workload(spec, seed)
    model = LatencyModel(scale=scale, seed=seed)
    setup = SchedulingSetup(workload, model, DEFAULT_SEARCH_CONCURRENCY, {})

    # Warm-up with zero latency: fills the sampler memo and checks both schedulers agree.
    ours, _, _, _ = run_wall("ours", setup, tokenizer, model.zero())
    reference = fingerprint(ours)
    lock, _, _, _ = run_wall("lockstep", setup, tokenizer, model.zero())
    if fingerprint(lock) != reference:
        raise TrajectoryMismatch("lock-step and per-trajectory rollouts produced different trajectories")
    bound = lower_bound(ours, model, sampling_concurrency=workload.config.sampling_concurrency,
                        search_concurrency=setup.search_concurrency)

    # Virtual time: the policy alone (model seconds; local CPU is free).
    unscaled = dataclasses.replace(model, scale=1.0)
    virtual: dict[str, float] = {}
    for kind in ("ours", "lockstep"):
        trajectories, seconds = run_virtual_time(kind, setup, tokenizer, unscaled)
        if fingerprint(trajectories) != reference:
            raise TrajectoryMismatch(f"{kind} (virtual time) produced different trajectories")
        virtual[kind] = seconds

    # Wall clock, interleaved, alternating which scheduler goes first.
    walls: dict[str, list[float]] = {"ours": [], "lockstep": []}
    cpus: dict[str, list[float]] = {"ours": [], "lockstep": []}
    rounds = 0
    for rep in range(repetitions):
        order = ("ours", "lockstep") if rep % 2 == 0 else ("lockstep", "ours")
        for kind in order:
            trajectories, wall, cpu, info = run_wall(kind, setup, tokenizer, model)
            if fingerprint(trajectories) != reference:
                raise TrajectoryMismatch(f"{kind} repetition {rep} produced different trajectories")
            walls[kind].append(wall)
            cpus[kind].append(cpu)
            if "lockstep" in info:
                rounds = info["lockstep"].rounds

    bound_wall = bound.value * scale
    ours_wall, lock_wall = median(walls["ours"]), median(walls["lockstep"])
    ours_ratio, lock_ratio = ours_wall / bound_wall, lock_wall / bound_wall
    figure = Figure(
        number=1, name="scheduling", title="Rollout scheduling",
        measures=[
            Measure("makespan_over_lower_bound", "ours: makespan / lower bound", ours_ratio, 1.15, "<=", "x"),
            Measure("speedup_over_lockstep", "speed-up over lock-step rounds", lock_wall / ours_wall, 1.5, ">=", "x"),
            Measure("lockstep_makespan_over_lower_bound", "lock-step: makespan / lower bound", lock_ratio, unit="x"),
            Measure("virtual_makespan_over_lower_bound", "ours, virtual time (no CPU): / lower bound",
                    virtual["ours"] / bound.value, unit="x", digits=3),
            Measure("virtual_speedup_over_lockstep", "speed-up, virtual time (no CPU)",
                    virtual["lockstep"] / virtual["ours"], unit="x"),
            Measure("engine_cpu_share", "ours: engine CPU / makespan (wall)",
                    100.0 * median(cpus["ours"]) / ours_wall, unit="%", digits=0),
        ],
        details={
            "workload": {**dataclasses.asdict(spec), **summarize_counts(ours)},
            "latency_model": dataclasses.asdict(model),
            "search_concurrency": setup.search_concurrency,
            "sampling_concurrency": workload.config.sampling_concurrency,
            "lower_bound_model_seconds": {
                "value": bound.value, "binding": bound.binding,
                "longest_trajectory": bound.longest_trajectory,
                "sampling_total_over_concurrency": bound.sampling_cap,
                "search_total_over_concurrency": bound.search_cap,
            },
            "lower_bound_wall_seconds": bound_wall,
            "repetitions": repetitions,
            "wall_seconds": walls,
            "process_cpu_seconds": cpus,
            "virtual_model_seconds": virtual,
            "lockstep_rounds": rounds,
            "identical_trajectories": True,
        },
        notes=[
            (f"step of {len(ours)} trajectories, latencies x{scale:g} (1 model s = {scale * 1000:g} ms); "
            f"lower bound {bound.value:.1f} model s ({bound.binding}); medians of {repetitions} interleaved run(s); "
            "both schedulers produced identical trajectories"),
        ],
    )
    figure.seconds = time.perf_counter() - started
    return figure
