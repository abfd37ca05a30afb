"""Figure 5: the local overhead of one offline training step, by phase.

The real :class:`~searchr1.core.trainer.Trainer` runs a few steps of 8 questions x 8 samples with the
real pytrio client against the offline twin (in a process of its own, serving the workload's
script) and an in-memory search backend, all with zero latency, so every second this process
spends is local CPU, as it would be live: the service's work happens in the other process. The
bench wraps the trainer's phases to time them (process CPU, every thread of this process):

* rollout: ``rollout_batch_async``: the engine's bookkeeping and the pytrio client's sampling
  calls (building requests, reading answers);
* datums: ``build_training_datums``;
* packing: ``pack_micro_batches`` (manual accumulation only);
* client calls: ``forward_backward`` and ``optim_step`` as the client runs them (batch planning
  and validation, encoding, polling), and the sampler checkpoint of each step;
* other: the rest of the step (group summary, vocabulary check, metrics, run directory).

The headline sets the local overhead against the modelled service time of the same step: the
lower bound of its trajectories under the default latency model (the time the remote sampler
and search need at the very least), so a value of 0.02 means local work adds at most 2 %.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..twin.scripted_search import ScriptedSearch
from .lockstep import DEFAULT_SEARCH_CONCURRENCY
from .report import Figure, Measure
from .served import served_twin
from .workload import (
    LatencyModel,
    WorkloadSpec,
    build_workload,
    lower_bound,
    median,
    quick_spec,
)

PHASES = ("rollout", "datums", "packing", "client", "other")
LABELS = {
    "rollout": "rollout (engine and sampling calls)",
    "datums": "datums",
    "packing": "packing",
    "client": "training calls and sampler checkpoints",
    "other": "other (metrics, run dir)",
}


class PhaseClock:
    """Process-CPU accumulators per phase, reset at the start of every step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self.trajectories: list[list[Any]] = []

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds

    def wrap_sync(self, phase: str, function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(phase, time.process_time() - start)
        return wrapper

    def wrap_async(self, phase: str, function: Any) -> Any:
        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return await function(*args, **kwargs)
            finally:
                self.add(phase, time.process_time() - start)
        return wrapper


@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def step_overhead_figure(tokenizer: Any, *, seed: int = 0, quick: bool = False, steps: int | None = None,
                         spec: WorkloadSpec | None = None) -> Figure:
    from ..core import pipeline as pipeline_module
    from ..core import trainer as trainer_module
    from ..core.pipeline import RolloutPipeline
    from ..run_dir import RunDir
    from ..core.train_config import TrainConfig
    from ..core.trainer import Trainer

    started = time.perf_counter()
    steps = steps if steps is not None else (2 if quick else 4)
    spec = spec or (quick_spec() if quick else WorkloadSpec())
    workload = build_workload(spec, seed + 505)
    clock = PhaseClock()
    rollout = pipeline_module.rollout_batch_async

    async def timed_rollout(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        trajectories = await rollout(*args, **kwargs)
        clock.add("rollout_total", time.process_time() - start)
        clock.trajectories.append(trajectories)
        return trajectories

    def timed_step(trainer: Any) -> Any:
        original = trainer.step

        async def step(number: int) -> Any:
            clock.current = {}
            start = time.process_time()
            metrics = await original(number)
            clock.add("step_total", time.process_time() - start)
            clock.steps.append(clock.current)
            return metrics
        return step

    with tempfile.TemporaryDirectory(prefix="searchr1-bench-") as home, contextlib.ExitStack() as stack:
        stack.enter_context(patched(pipeline_module, "rollout_batch_async", timed_rollout))
        stack.enter_context(patched(trainer_module, "build_training_datums",
                                    clock.wrap_sync("datums", trainer_module.build_training_datums)))
        stack.enter_context(patched(trainer_module, "pack_micro_batches",
                                    clock.wrap_sync("packing", trainer_module.pack_micro_batches)))
        stack.enter_context(patched(Trainer, "_update", clock.wrap_async("client", Trainer._update)))
        stack.enter_context(patched(RolloutPipeline, "_make_sampler", clock.wrap_async("client", RolloutPipeline._make_sampler)))
        config = TrainConfig(max_steps=steps, data="bench", run_name="bench", questions_per_batch=spec.questions,
                             save_every=0, rollout=workload.config, offline=True)
        run = RunDir(Path(home) / "run")
        run.create(config.to_json())
        service = stack.enter_context(served_twin(workload.raw, in_process=quick, tokenizer=tokenizer))
        trainer = Trainer(config, run, service=service, tokenizer=tokenizer,
                          search=ScriptedSearch(workload.results), examples=workload.examples)
        trainer.step = timed_step(trainer)  # type: ignore[method-assign]
        asyncio.run(trainer.run_steps(None))

    measured = clock.steps[1:] if len(clock.steps) > 1 else clock.steps  # the first step warms caches
    per_step: dict[str, float] = {}
    for record in measured:
        pieces = {
            "rollout": record.get("rollout_total", 0.0),
            "datums": record.get("datums", 0.0),
            "packing": record.get("packing", 0.0),
            "client": record.get("client", 0.0),
        }
        pieces["other"] = max(0.0, record.get("step_total", 0.0) - sum(pieces.values()))
        pieces["local_total"] = sum(pieces.values())
        for key, value in pieces.items():
            per_step.setdefault(key, []).append(value)  # type: ignore[arg-type]
    phase = {key: median(values) for key, values in per_step.items()}  # type: ignore[arg-type]
    total = phase["local_total"]
    model = LatencyModel(seed=seed)
    trajectories = clock.trajectories[-1]
    service = lower_bound(trajectories, model, sampling_concurrency=workload.config.sampling_concurrency,
                          search_concurrency=DEFAULT_SEARCH_CONCURRENCY).value
    tool_turns = sum(t.search_calls for t in trajectories)
    measures = [
        Measure("local_overhead_over_service_time", "local CPU / modelled service time of the step",
                total / service, 0.05, "<=", "x", target_source="bench", digits=3),
        Measure("local_cpu_seconds_per_step", "local CPU per step", total, unit="s", digits=2),
    ]
    for name in PHASES:
        measures.append(Measure(f"share_{name}", f"  share: {LABELS[name]}", 100.0 * phase[name] / total,
                                unit="%", digits=1))
    figure = Figure(
        number=5, name="step_overhead", title="Local overhead of a step",
        measures=measures,
        details={
            "steps_run": steps, "steps_measured": len(measured),
            "trajectories_per_step": len(trajectories), "tool_turns_last_step": tool_turns,
            "cpu_seconds_per_step": phase,
            "per_step": per_step,
            "modelled_service_seconds": service,
            "latency_model": {"sample_base": model.sample_base, "sample_per_token": model.sample_per_token,
                              "search_median": model.search_median, "search_sigma": model.search_sigma},
            "accumulation": config.accumulation,
        },
        notes=[(f"median of {len(measured)} step(s) of {len(trajectories)} trajectories: {total:.2f} s local CPU "
               f"(engine and pytrio client) against {service:.0f} s modelled service time; the twin served "
               "from another process")],
    )
    figure.seconds = time.perf_counter() - started
    return figure
