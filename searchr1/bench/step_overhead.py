"""Figure 5: the local CPU of one offline training step against the lab port's way, whose it is, and
what the wire costs.

The real :class:`~searchr1.core.trainer.Trainer` runs a few steps of 8 questions x 8 samples with the
real pytrio client against the offline twin (in a process of its own, serving the workload's
script) and an in-memory search backend, all with zero latency, so every CPU second this
process spends is local, as it would be live: the service's work happens in the other process.

CPU is read per thread (:mod:`.thread_cpu`: what each thread actually ran, so a thread that
waits or blocks in a poll adds nothing): our main thread (the engine, the protocol, the
trainer, and the pytrio calls made on our event loop) and pytrio's own event-loop thread (its
transport: request validation, serialisation, HTTP, futures). Their sum is the step's local
CPU. The twin's process is read too and reported, never counted.

Every step's rollout is measured three times, seconds apart, so that they see the same
machine: as it runs (the real sampling client over HTTP); once more with an in-memory sampler
that replays the answers the first rollout got (no pytrio, no HTTP); and that replay again
the lab port's way, fitting every observation as the lab port did (a whole next prompt, four
chat-template renders, per candidate item: :func:`searchr1.bench.protocol_cpu.lab_port_fit_tool_content`).
Both replays must give the same trajectories as the step. The in-memory step is the real step
with its rollout swapped for the replay (datums and training calls are the same work for the
same trajectories), so ``wire / in-memory`` is what the sampling wire itself costs; the lab port's
step is the real step with our replayed rollout swapped for the lab port's (the wire does the same
requests either way). The target is a ratio of the two ways, measured side by side, so it does
not move with the machine's speed as seconds do: ``ours / the lab port's way`` of the step's local
CPU, which is also the ratio of their shares of the modelled service time (the same for both).
The rest of the lab port's step costs about the same local CPU either way (its lock-step rounds
and hand packing are figures 1 and 3). Runs are repeated; a run's sample is its mean over the
steps after the first (the same steps in every run), and figures print the median of the runs
with the lowest and highest.

Breakdown (seconds per step): on the main thread during rollout, fitting and stitching
observations (``add_observation``: tokenizer, template), parsing turns (``record_turn``),
building requests and reading answers (``make_request``, ``read_sequence``, pytrio's request
types), and the rest (asyncio, and pytrio's cross-thread futures on our loop); pytrio's thread
during rollout (also per sampling request); datums (``build_training_datums``); outside the
rollout, the main thread (the trainer's bookkeeping, metrics, run directory, and its pytrio
calls) and pytrio's thread (training calls, the sampler checkpoint).

Scaling rows (:mod:`.client_scaling`): one rollout of the whole batch, with the real client
against a twin of its own, at 64, 256 and 1,024 trajectories (and, with ``bench
--paper-sizes``, at 2,560, the paper's 512 prompts x 5, and 4,096): the local
CPU per trajectory at each size, the last size's over 64's (target: at most 1.25), and the growth
of this process's resident memory during the largest rollout, whole and per 1,000 trajectories.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from searchr1.twin.scripted_search import ScriptedSearch
from searchr1.bench.client_scaling import client_scaling, settled_heap as heap_settled
from searchr1.bench.lockstep import DEFAULT_SEARCH_CONCURRENCY
from searchr1.bench.protocol_cpu import lab_port_fit_tool_content
from searchr1.bench.report import LAB_PORT, Figure, Measure
from searchr1.bench.samplers import Answers, CountingSampler, InMemorySampler
from searchr1.core.budgets import RolloutBudgets
from searchr1.core.datum import TrainingDatum
from searchr1.core.observation.fit import FittedObservation
from searchr1.core.types import Message, SamplingClient, SearchResult, ServiceClient, Tokenizer, Trajectory
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.core.observation.tokens import forget_remembered_texts
from searchr1.basics.wording import plural
from searchr1.bench.served import served_twin
from searchr1.bench.thread_cpu import CpuInterval, CpuSnapshot, ThreadCpuMeter, client_thread_roles
from searchr1.bench.workload import (
    LatencyModel,
    Workload,
    WorkloadSpec,
    build_workload,
    fingerprint,
    lower_bound,
    quick_spec,
)

if TYPE_CHECKING:
    from searchr1.core.trainer import BatchSource, StepRecord as TrainerStepRecord, Trainer

P = ParamSpec("P")
R = TypeVar("R")
# searchr1.core.rollout.rollout_batch_async, as the pipeline and the trainer call it (and its stand-ins)
Rollout = Callable[..., Awaitable[list[Trajectory]]]

SPREAD_BOUND = 0.15  # (highest - lowest) / median of the runs, documented in docs/benchmarks.md
# Our step's local CPU at most this share of the same step done the lab port's way: the former
# absolute targets restated (1.5 s against the lab port's 7.8 s of local CPU per step, and 0.035x
# against its 0.17x of the modelled service time, are both 0.2 on the machine that measured
# them); documented in docs/benchmarks.md.
LAB_PORT_RATIO_TARGET = 0.2
LOCAL_ROLES = ("main", "client")  # threads whose CPU is the step's local CPU
MAIN_PIECES = {
    "fit": "fitting and stitching observations (tokenizer, template)",
    "parse": "parsing assistant turns",
    "requests": "building requests, reading answers",
}


@dataclass
class StepRecord:
    local: float = 0.0  # the step as it ran, both threads, the replay left out
    roles: dict[str, float] = field(default_factory=dict)
    twin: float = 0.0
    rollout_main: float = 0.0
    rollout_client: float = 0.0
    pieces: dict[str, float] = field(default_factory=dict)
    replay_main: float = 0.0
    replay_client: float = 0.0
    replay_pieces: dict[str, float] = field(default_factory=dict)
    lab_port_main: float = 0.0  # the replay again, observations fitted the lab port's way
    lab_port_client: float = 0.0
    lab_port_pieces: dict[str, float] = field(default_factory=dict)
    datums: float = 0.0
    bench_main: float = 0.0  # the bench's own main-thread work inside the step (collections, checks)
    requests: int = 0
    turns: int = 0

    def leave_out(self, seconds: float) -> None:
        """Main-thread seconds the bench itself spent inside the step: no part of the step."""
        self.local -= seconds
        self.bench_main += seconds

    @property
    def in_memory(self) -> float:
        """The same step with the replayed rollout in place of the wire's."""
        return self.local - self.rollout_main - self.rollout_client + self.replay_main + self.replay_client

    @property
    def lab_port_way(self) -> float:
        """The same step with the lab port's observation fitting: our replayed rollout swapped for
        the lab port's replay of it."""
        return self.local - self.replay_main - self.replay_client + self.lab_port_main + self.lab_port_client


class StepProbe:
    """Per-thread CPU of each step and of its phases, for one run."""

    def __init__(self) -> None:
        self.meter: ThreadCpuMeter | None = None
        self.twin_pid: int | None = None
        self.steps: list[StepRecord] = []
        self.current = StepRecord()
        self.replaying: str | None = None  # None: the step itself; "memory" or LAB_PORT: a replay
        self.trajectories: list[list[Trajectory]] = []

    def attach(self, service: ServiceClient) -> None:
        self.meter = ThreadCpuMeter(client_thread_roles(service), [self.twin_pid] if self.twin_pid else [])

    def snapshot(self) -> CpuSnapshot:
        assert self.meter is not None, "attach() first"
        return self.meter.snapshot()

    def interval(self, start: CpuSnapshot) -> CpuInterval:
        assert self.meter is not None
        return self.meter.interval(start, self.meter.snapshot())

    def piece(self, name: str, function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                record = self.current
                pieces = {None: record.pieces, "memory": record.replay_pieces,
                          LAB_PORT: record.lab_port_pieces}[self.replaying]
                pieces[name] = pieces.get(name, 0.0) + time.thread_time() - start
        return wrapper


@contextlib.contextmanager
def patched(target: object, name: str, value: object) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def lab_port_fit(tokenizer: Tokenizer, messages_before_assistant: list[Message], assistant_text: str | Message,
                 previous_prompt_tokens: Sequence[int], completion_tokens: Sequence[int], call_id: str,
                 result: SearchResult, config: RolloutBudgets, tool: str = "search", *,
                 whole: int | None = None) -> FittedObservation | None:
    """:func:`searchr1.core.observation.fit.fit_tool_content` done the lab port's way (figure 2's
    :func:`lab_port_fit_tool_content`), in the engine's own return type (the lab port has search alone,
    and one context that only grows: its length is the whole trajectory's, ``whole`` adds nothing)."""
    fitted = lab_port_fit_tool_content(tokenizer, messages_before_assistant, assistant_text, previous_prompt_tokens,
                                   completion_tokens, call_id, result, config)
    return None if fitted is None else FittedObservation(fitted[0], fitted[1], False)


@contextlib.contextmanager
def settled_heap(record: StepRecord) -> Iterator[None]:
    """A measured rollout starts on a collected heap, frozen (figure 5's scaling rows'
    :func:`~searchr1.bench.client_scaling.settled_heap`): the garbage of what ran before is not its
    cost, and neither is scanning what earlier steps and runs keep alive, so the third run's
    rollout is measured like the first's. The collection is left out of the step's CPU."""
    cleared = time.thread_time()
    with heap_settled():
        record.leave_out(time.thread_time() - cleared)
        yield


class _StepTimers:
    """What one training run's steps are timed with, into ``probe``: each step's CPU per thread,
    its rollout (replayed from memory right after it, ours and the lab port's way, both required to
    roll out the same trajectories) and its datums. ``rollout`` and ``build_datums`` are the
    functions they time."""

    def __init__(self, probe: StepProbe, rollout: Rollout,
                 build_datums: Callable[..., list[TrainingDatum]]) -> None:
        self.probe = probe
        self._rollout = rollout
        self._build_datums = build_datums

    async def _replayed(self, mode: str, answers: Answers, tokenizer: Tokenizer, args: list[object],
                        kwargs: dict[str, object], trajectories: list[Trajectory]) -> CpuInterval:
        """The CPU of the rollout once more, answered from memory, in ``mode``; it must roll out
        ``trajectories`` again."""
        probe = self.probe
        probe.replaying = mode
        forget_remembered_texts(tokenizer)  # each replay encodes its texts from cold, as the other does
        with settled_heap(probe.current):
            start = probe.snapshot()
            try:
                again = await self._rollout(InMemorySampler(answers), tokenizer, *args, **kwargs)
            finally:
                probe.replaying = None
        spent = probe.interval(start)
        checked = time.thread_time()
        if fingerprint(again) != fingerprint(trajectories):
            raise AssertionError(f"figure 5: the {mode} replay rolled out different trajectories")
        probe.current.leave_out(time.thread_time() - checked)
        return spent

    async def rollout(self, sampler: SamplingClient, tokenizer: Tokenizer, *args: object,
                      **kwargs: object) -> list[Trajectory]:
        """The rollout as it runs, timed, then replayed from memory ours and the lab port's way."""
        from searchr1.core.observation import fit as fit_module

        probe = self.probe
        answers: Answers = {}
        counted = CountingSampler(sampler, answers)
        with settled_heap(probe.current):
            start = probe.snapshot()
            trajectories = await self._rollout(counted, tokenizer, *args, **kwargs)
            spent = probe.interval(start)
        # The same rollout, answered from memory (no progress display, the same seeds and step):
        # the arguments after the tokenizer are the tools, the questions, the config and the progress.
        replay_args = list(args)
        if len(replay_args) > 3:
            replay_args[3] = None
        replay = await self._replayed("memory", answers, tokenizer, replay_args, kwargs, trajectories)
        with patched(fit_module, "fit_tool_content", lab_port_fit):
            theirs = await self._replayed(LAB_PORT, answers, tokenizer, replay_args, kwargs, trajectories)
        record = probe.current
        record.rollout_main += spent.roles.get("main", 0.0)
        record.rollout_client += spent.roles.get("client", 0.0)
        record.replay_main += replay.roles.get("main", 0.0)
        record.replay_client += replay.roles.get("client", 0.0)
        record.lab_port_main += theirs.roles.get("main", 0.0)
        record.lab_port_client += theirs.roles.get("client", 0.0)
        record.local -= replay.total(LOCAL_ROLES) + theirs.total(LOCAL_ROLES)  # taken out of the step's own CPU below
        record.requests += counted.requests
        record.turns += sum(len(t.turns) for t in trajectories)
        probe.trajectories.append(trajectories)
        return trajectories

    def datums(self, *args: object, **kwargs: object) -> list[TrainingDatum]:
        start = time.thread_time()
        try:
            return self._build_datums(*args, **kwargs)
        finally:
            self.probe.current.datums += time.thread_time() - start

    def step(self, trainer: Trainer) -> Callable[[int, BatchSource], Awaitable[TrainerStepRecord]]:
        """``trainer.step``, each step's CPU recorded in a :class:`StepRecord` of its own."""
        original = trainer.step
        probe = self.probe

        async def step(number: int, batches: BatchSource) -> TrainerStepRecord:
            if probe.meter is None:
                probe.attach(trainer.service)
            probe.current = StepRecord()
            start = probe.snapshot()
            metrics = await original(number, batches)
            spent = probe.interval(start)
            probe.current.roles = dict(spent.roles)
            probe.current.local += spent.total(LOCAL_ROLES)
            probe.current.twin = sum(spent.processes.values())
            probe.steps.append(probe.current)
            return metrics
        return step


def _run(service: ServiceClient, tokenizer: Qwen35Tokenizer, workload: Workload, spec: WorkloadSpec, steps: int,
         probe: StepProbe) -> None:
    """One training run of ``steps`` steps, every step recorded (and its rollout replayed) in ``probe``."""
    from searchr1.training import pipeline as pipeline_module
    from searchr1.core import rollout as rollout_module
    from searchr1.core import trainer as trainer_module
    from searchr1.run.directory import RunDir
    from searchr1.training.config import TrainConfig
    from searchr1.training.loop import TrainingRun

    timers = _StepTimers(probe, pipeline_module.rollout_batch_async, trainer_module.build_training_datums)
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-") as home, contextlib.ExitStack() as stack:
        stack.enter_context(patched(pipeline_module, "rollout_batch_async", timers.rollout))
        stack.enter_context(patched(trainer_module, "rollout_batch_async", timers.rollout))  # on-policy batches
        stack.enter_context(patched(trainer_module, "build_training_datums", timers.datums))
        stack.enter_context(patched(rollout_module, "add_observation",
                                    probe.piece("fit", rollout_module.add_observation)))
        stack.enter_context(patched(rollout_module, "record_turn",
                                    probe.piece("parse", rollout_module.record_turn)))
        stack.enter_context(patched(rollout_module, "make_request",
                                    probe.piece("requests", rollout_module.make_request)))
        stack.enter_context(patched(rollout_module, "read_sequence",
                                    probe.piece("requests", rollout_module.read_sequence)))
        config = TrainConfig(max_steps=steps, data="bench", run_name="bench", questions_per_batch=spec.questions,
                             save_every=0, rollout=workload.config, offline=True)
        run = RunDir(Path(home) / "run")
        run.create(config.to_json())
        training = TrainingRun(config, run, service=service, tokenizer=tokenizer,
                          search=ScriptedSearch(workload.results), examples=workload.examples)
        stack.enter_context(patched(training.trainer, "step", timers.step(training.trainer)))
        asyncio.run(training.run_steps(None))


class _RunSamples:
    """The measured steps of every run (each run's first step left out when it has more than one:
    it loads tokenizers and warms caches), made into one sample per run."""

    def __init__(self, runs: list[StepProbe], steps: int) -> None:
        skip = 1 if steps > 1 else 0  # the first step of a run loads tokenizers and warms caches
        self.per_run = [[(index, record) for index, record in enumerate(probe.steps) if index >= skip]
                        for probe in runs]
        self.steps = [item for run in self.per_run for item in run]

    def per_step(self, values: Callable[[StepRecord], float]) -> list[float]:
        """One sample per run: the mean over the run's measured steps (every run measures the same
        steps, so the spread is the runs' disagreement, not the difference between steps)."""
        return [sum(values(r) for _, r in run) / len(run) for run in self.per_run if run]

    def ratio(self, numerator: Callable[[StepRecord], float],
              denominator: Callable[[int, StepRecord], float]) -> list[float]:
        return [sum(numerator(r) for _, r in run) / max(1e-12, sum(denominator(i, r) for i, r in run))
                for run in self.per_run if run]


def _rest_main(r: StepRecord) -> float:
    """The main thread during rollout outside the timed pieces: asyncio, pytrio calls on our loop."""
    return max(0.0, r.rollout_main - sum(r.pieces.values()))


def _main_outside(r: StepRecord) -> float:
    """The main thread outside the rollout: the trainer's bookkeeping and its pytrio calls."""
    return max(0.0, r.roles.get("main", 0.0) - r.rollout_main - r.replay_main - r.lab_port_main - r.datums
               - r.bench_main)


def _client_outside(r: StepRecord) -> float:
    """pytrio's thread outside the rollout: training calls and the sampler checkpoint."""
    return max(0.0, r.roles.get("client", 0.0) - r.rollout_client - r.replay_client - r.lab_port_client)


def step_overhead_figure(tokenizer: Qwen35Tokenizer, *, seed: int = 0, quick: bool = False, steps: int | None = None,
                         spec: WorkloadSpec | None = None, repetitions: int | None = None,
                         paper_sizes: bool = False) -> Figure:
    started = time.perf_counter()
    steps = steps if steps is not None else (2 if quick else 4)
    repetitions = repetitions if repetitions is not None else (1 if quick else 3)
    spec = spec or (quick_spec() if quick else WorkloadSpec())
    workload = build_workload(spec, seed + 505)
    runs: list[StepProbe] = []
    twin_pid: list[int] = []
    with served_twin(workload.raw, in_process=quick, tokenizer=tokenizer, on_process=twin_pid.append,
                     sampling_concurrency=workload.config.sampling_concurrency) as service:
        for _ in range(repetitions):
            probe = StepProbe()
            probe.twin_pid = twin_pid[0] if twin_pid else None
            _run(service, tokenizer, workload, spec, steps, probe)
            runs.append(probe)
    scaling_measures, scaling = client_scaling(tokenizer, seed=seed, quick=quick, paper_sizes=paper_sizes)

    model = LatencyModel(seed=seed)
    service_seconds = [
        lower_bound(trajectories, model, sampling_concurrency=workload.config.sampling_concurrency,
                    search_concurrency=DEFAULT_SEARCH_CONCURRENCY).value
        for trajectories in runs[0].trajectories
    ]
    samples = _RunSamples(runs, steps)
    wire_steps = samples.steps
    requests = statistics.median([float(r.requests) for _, r in wire_steps])
    turns = statistics.median([float(r.turns) for _, r in wire_steps])
    measures = [*_step_measures(samples, service_seconds), *scaling_measures]
    trajectories = runs[0].trajectories[-1]
    figure = Figure(
        number=5, name="step_overhead", title="Local overhead of a step",
        measures=measures,
        details={
            "steps_per_run": steps, "runs": repetitions, "steps_measured": len(wire_steps),
            "trajectories_per_step": len(trajectories),
            "sampling_requests_per_step": requests, "assistant_turns_per_step": turns,
            "modelled_service_seconds": service_seconds,
            # "seed_*": the lab port's way, as bench.json already names it (report.LAB_PORT)
            "per_step": [{"step": i, "local": r.local, "in_memory": r.in_memory, "roles": r.roles, "twin": r.twin,
                          "seed_way": r.lab_port_way, "pieces": r.pieces, "replay_pieces": r.replay_pieces,
                          "seed_pieces": r.lab_port_pieces, "rollout_main": r.rollout_main,
                          "rollout_client": r.rollout_client, "replay_main": r.replay_main,
                          "replay_client": r.replay_client, "seed_main": r.lab_port_main,
                          "seed_client": r.lab_port_client, "datums": r.datums, "requests": r.requests,
                          "turns": r.turns} for i, r in wire_steps],
            "latency_model": {"sample_base": model.sample_base, "sample_per_token": model.sample_per_token,
                              "search_median": model.search_median, "search_sigma": model.search_sigma},
            "cpu_clock": "per-thread schedstat" if runs and runs[0].meter and runs[0].meter.proc else "process_time",
            "scaling": scaling,
        },
        notes=[(f"{plural(repetitions, 'run')} x {plural(steps, 'step')}, the first step of each run left out (a "
                f"sample is a run's mean over the same steps), each step's rollout replayed from memory right after "
                f"it, ours and the lab port's observation fitting; {len(trajectories)} trajectories, "
                f"{requests:.0f} sampling requests and "
                f"{turns:.0f} assistant turns per step; CPU per thread (waiting adds nothing); the twin served from "
                f"another process{' (in this process: --quick)' if quick else ''}"),
               "scaling rows: one whole rollout per size (" + ", ".join(f"{size['trajectories']:,}" for size in scaling)
               + " trajectories), each on a twin of its own; bench --paper-sizes measures 64 to 4,096 "
               "(not with --quick)"],
    )
    figure.seconds = time.perf_counter() - started
    return figure


def _piece_seconds(key: str) -> Callable[[StepRecord], float]:
    """A step's main-thread seconds in the piece ``key`` (:data:`MAIN_PIECES`)."""
    return lambda r: r.pieces.get(key, 0.0)


def _step_measures(samples: _RunSamples, service_seconds: list[float]) -> list[Measure]:
    """The figure's rows from the runs' samples: the step's local CPU against the lab port's way, the
    wire and the modelled service time, then where it goes (threads, pieces, datums, per request
    and per turn)."""
    per_step, ratio = samples.per_step, samples.ratio
    over_lab_port = ratio(lambda r: r.local, lambda i, r: r.lab_port_way)
    pairs = ratio(lambda r: r.local, lambda i, r: r.in_memory)
    over_service = ratio(lambda r: r.local, lambda i, r: service_seconds[i])
    lab_port_over_service = ratio(lambda r: r.lab_port_way, lambda i, r: service_seconds[i])
    client_per_request = [1000.0 * v for v in ratio(lambda r: r.rollout_client, lambda i, r: r.requests)]
    glue_per_request = [1000.0 * v for v in ratio(
        lambda r: max(0.0, _rest_main(r) - max(0.0, r.replay_main - sum(r.replay_pieces.values()))),
        lambda i, r: r.requests)]
    per_turn = [1000.0 * v for v in ratio(lambda r: r.rollout_main + r.rollout_client, lambda i, r: r.turns)]

    measures = [
        Measure.of_samples("local_cpu_over_seed_way", "local CPU per step, ours / the lab port's observation fitting",
                           over_lab_port, LAB_PORT_RATIO_TARGET, "<=", "x", target_source="bench",
                           spread_bound=SPREAD_BOUND),
        # Rows in CPU seconds (over a fixed modelled time or not) carry no spread bound: they also
        # measure the machine's speed, which drifts between runs minutes apart; the ratios
        # measured side by side cancel it.
        Measure.of_samples("local_overhead_over_service_time", "local CPU / modelled service time of the step",
                           over_service, unit="x", digits=3),
        Measure.of_samples("seed_way_over_service_time", "  the lab port's way / modelled service time",
                           lab_port_over_service, unit="x", digits=3),
        Measure.of_samples("local_cpu_seconds_per_step", "local CPU per step (main + pytrio threads)",
                           per_step(lambda r: r.local), unit="s"),
        Measure.of_samples("seed_way_cpu_seconds_per_step", "  the same step, the lab port's observation fitting",
                           per_step(lambda r: r.lab_port_way), unit="s"),
        Measure.of_samples("wire_over_in_memory", "local CPU, real client / in-memory sampler", pairs,
                           unit="x", spread_bound=SPREAD_BOUND),
        Measure.of_samples("in_memory_cpu_seconds_per_step", "  the same step, in-memory sampler",
                           per_step(lambda r: r.in_memory), unit="s"),
    ]
    for key, label in MAIN_PIECES.items():
        measures.append(Measure.of_samples(f"main_{key}_seconds", f"  main thread: {label}",
                                           per_step(_piece_seconds(key)), unit="s"))
    return measures + [
        Measure.of_samples("main_rest_seconds", "  main thread: asyncio, pytrio calls on our loop",
                           per_step(_rest_main), unit="s"),
        Measure.of_samples("client_rollout_seconds", "  pytrio thread during rollout",
                           per_step(lambda r: r.rollout_client),
                           unit="s"),
        Measure.of_samples("datums_seconds", "  datums",
                           per_step(lambda r: r.datums), unit="s"),
        Measure.of_samples("main_outside_rollout_seconds", "  main thread outside rollout: trainer, metrics, "
                           "run dir, pytrio calls", per_step(_main_outside), unit="s"),
        Measure.of_samples("client_outside_rollout_seconds", "  pytrio thread outside rollout: training calls, "
                           "sampler checkpoint", per_step(_client_outside), unit="s"),
        Measure.of_samples("client_ms_per_sampling_request", "pytrio thread per sampling request",
                           client_per_request, unit="ms", digits=2),
        Measure.of_samples("main_glue_ms_per_sampling_request", "main thread per sampling request (wire - in-memory)",
                           glue_per_request, unit="ms", digits=2),
        Measure.of_samples("rollout_ms_per_turn", "rollout CPU per assistant turn (both threads)", per_turn,
                           unit="ms", digits=2),
        Measure.of_samples("twin_seconds_per_step", "the twin's process per step (not counted)",
                           per_step(lambda r: r.twin), unit="s"),
    ]
