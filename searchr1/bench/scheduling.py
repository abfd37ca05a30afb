"""Figure 1: rollout scheduling, our per-trajectory engine against lock-step rounds.

One simulated training step (8 questions x 8 samples, 0-4 searches per trajectory) runs through
the real engine (``rollout_batch_async``) and through :mod:`.lockstep`, both sampling with the
real pytrio client from the offline twin (in a process of its own, serving the workload's
script with the :class:`~.workload.LatencyModel`'s sampling latencies) and searching an
in-memory backend that sleeps for the model's search latencies, all played back at ``scale``
(1 model second = 100 ms by default).

Reported against the lower bound (the longest trajectory's own serial latency, raised where
the sampling or search concurrency caps force more), in wall clock, repetitions interleaved
(ours, lock-step, lock-step, ours, ...), medians. This includes the engine's own CPU and the
pytrio client's, which weigh ``1 / scale`` times more against these latencies than against
real ones (10x by default; the reported CPU share shows how much). (An earlier virtual-time
row ran the schedulers on an in-process stand-in of the sampling client; it is gone with the
stand-in: every sample now crosses a socket, and sockets do not run on virtual time.)

Before any timing, both schedulers must produce identical trajectories (terminations, tokens,
rewards, advantages): otherwise the comparison would not be of the same work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Coroutine

from searchr1.core.rollout import rollout_batch_async
from searchr1.core.types import SamplingClient, Trajectory
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.search.tool import with_search
from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.bench.lockstep import DEFAULT_SEARCH_CONCURRENCY, LockstepRollout, LockstepStats
from searchr1.bench.report import Figure, Measure
from searchr1.basics.wording import plural
from searchr1.bench.served import BASE_MODEL, served_twin
from searchr1.bench.workload import (
    LatencyModel,
    Workload,
    WorkloadSpec,
    build_workload,
    fingerprint,
    lower_bound,
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
    sampler: SamplingClient  # a pytrio SamplingClient on the twin


def _coroutine(kind: str, setup: SchedulingSetup, tokenizer: Qwen35Tokenizer, model: LatencyModel,
               info: dict[str, LockstepStats]) -> Coroutine[object, object, list[Trajectory]]:
    workload = setup.workload
    search = ScriptedSearch(workload.results, latency=model.search_latency(),
                            concurrency=setup.search_concurrency)
    if kind == "ours":
        return rollout_batch_async(setup.sampler, tokenizer, with_search(search), workload.examples, workload.config)
    engine = LockstepRollout(setup.sampler, tokenizer, search, workload.config,
                             search_concurrency=setup.search_concurrency)
    info["lockstep"] = engine.stats
    return engine.run(workload.examples)


def run_wall(kind: str, setup: SchedulingSetup, tokenizer: Qwen35Tokenizer,
             model: LatencyModel) -> tuple[list[Trajectory], float, float, dict[str, LockstepStats]]:
    """One run on the real clock: trajectories, wall seconds, process CPU seconds, info."""
    info: dict[str, LockstepStats] = {}
    coroutine = _coroutine(kind, setup, tokenizer, model, info)
    wall, cpu = time.perf_counter(), time.process_time()
    trajectories = asyncio.run(coroutine)
    return trajectories, time.perf_counter() - wall, time.process_time() - cpu, info


def scheduling_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False,
                      repetitions: int | None = None, scale: float | None = None,
                      spec: WorkloadSpec | None = None) -> Figure:
    started = time.perf_counter()
    spec = spec or (quick_spec() if quick else WorkloadSpec())
    repetitions = repetitions if repetitions is not None else (1 if quick else 3)
    scale = scale if scale is not None else (QUICK_SCALE if quick else SCALE)
    workload = build_workload(spec, seed)
    model = LatencyModel(scale=scale, seed=seed)
    with served_twin(workload.raw, model.twin_latencies(), in_process=quick, tokenizer=tokenizer,
                     sampling_concurrency=workload.config.sampling_concurrency) as service:
        setup = SchedulingSetup(workload, model, DEFAULT_SEARCH_CONCURRENCY,
                                service.create_sampling_client(base_model=BASE_MODEL))
        walls, cpus, rounds, reference, ours = _timed_runs(setup, tokenizer, model, repetitions)
    bound = lower_bound(ours, model, sampling_concurrency=workload.config.sampling_concurrency,
                        search_concurrency=setup.search_concurrency)

    bound_wall = bound.value * scale
    figure = Figure(
        number=1, name="scheduling", title="Rollout scheduling",
        measures=[
            Measure.of_samples("makespan_over_lower_bound", "ours: makespan / lower bound",
                               [w / bound_wall for w in walls["ours"]], 1.05, "<=", "x", spread_bound=0.10),
            Measure.of_samples("speedup_over_lockstep", "speed-up over lock-step rounds",
                               [lock / ours for lock, ours in zip(walls["lockstep"], walls["ours"])], 1.5, ">=", "x",
                               spread_bound=0.15),
            Measure.of_samples("lockstep_makespan_over_lower_bound", "lock-step: makespan / lower bound",
                               [w / bound_wall for w in walls["lockstep"]], unit="x"),
            Measure.of_samples("engine_cpu_share", "ours: local CPU (engine, pytrio client) / makespan",
                               [100.0 * c / w for c, w in zip(cpus["ours"], walls["ours"])], unit="%", digits=0),
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
            "sampling": "real pytrio client, offline twin in another process",
            "lockstep_rounds": rounds,
            "identical_trajectories": True,
        },
        notes=[
            (f"step of {len(ours)} trajectories, latencies x{scale:g} (1 model s = {scale * 1000:g} ms); "
            f"lower bound {bound.value:.1f} model s ({bound.binding}); medians of "
             f"{plural(repetitions, 'interleaved run')}; "
            "both schedulers produced identical trajectories"),
        ],
    )
    figure.seconds = time.perf_counter() - started
    return figure


def _timed_runs(setup: SchedulingSetup, tokenizer: Qwen35Tokenizer, model: LatencyModel, repetitions: int) -> tuple[
        dict[str, list[float]], dict[str, list[float]], int, list[tuple[object, ...]], list[Trajectory]]:
    """A warm-up of each scheduler (both must produce the same trajectories), then the
    interleaved timed repetitions."""
    ours, _, _, _ = run_wall("ours", setup, tokenizer, model)
    reference = fingerprint(ours)
    lock, _, _, _ = run_wall("lockstep", setup, tokenizer, model)
    if fingerprint(lock) != reference:
        raise TrajectoryMismatch("lock-step and per-trajectory rollouts produced different trajectories")
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
    return walls, cpus, rounds, reference, ours
