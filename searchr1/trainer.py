"""The training loop: one Search-R1 step at a time, on PyTRIO or on its offline twin.

Per step ``b``::

    questions  <- batch b of the data cursor
    sampler    <- the weights after b - K steps (K = --max-steps-off-policy; 0: the current
                  weights, PyTRIO's save_weights_and_get_sampling_client)
    trajectories <- rollout (score, group advantages); with K >= 1 the batches of steps
                  b+1..b+K are already rolling out meanwhile (searchr1.off_policy)
    datums     <- one Datum per trajectory that carries signal
    forward_backward(importance_sampling) -> optim_step(AdamParams)
    metrics line, transcripts, checkpoint when due, run state

Before the first step, :meth:`Trainer.connect` creates the training client and checks the
service's tokenizer (searchr1.preflight): nothing is sampled before the run can finish a step.

Accumulation. ``sdk`` (default) sends every datum of the step in ONE ``forward_backward``
call: PyTRIO splits it itself and normalises every chunk by batch-global totals, so the
update is the full-batch one whatever the server's reduction. ``manual`` is the seed's way:
first-fit-decreasing micro-batches, advantages scaled by n_k/N, one call per micro-batch.
That is exact only if the server averages per sample (``python cli.py probe-loss`` tells);
here N is the number of datums sent, so both modes agree under a per-sample mean (the seed
used all trajectories, which rescales each step by datums/trajectories).

Failures. A finished step is on disk before the next one starts. A broken training client,
a failed event, too many sampler failures or Ctrl-C stop the run with :class:`TrainingStopped`,
whose message says how to resume; ``--resume`` restarts at the last checkpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import __version__
from .advantage import ADVANTAGE_MODES, summarize_groups
from .data import SearchExample, take_batch
from .datum import TrainingDatum, build_training_datums
from .diagnostics import (
    NonFiniteValues,
    learner_tokens,
    mismatch_metrics,
    non_finite_inputs,
    non_finite_outputs,
    non_finite_sampled,
    policy_diagnostics,
)
from .health import CollapseGuard, configured_rules, last_healthy_checkpoint
from .metrics import datum_metrics, rollout_metrics, trainer_metrics
from .off_policy import off_policy_metrics, sampler_version, versions_to_record
from .packing import pack_micro_batches, weight_micro_batch_for_global_mean
from .preflight import PreflightError, check_service_tokenizer
from .protocol import check_template
from .rollout import RolloutConfig, SamplerFailureError, rollout_batch_async
from .run_dir import ResumePoint, RunDir
from .search.types import SearchBackend
from .settings import SettingError, check_settings, setting
from .trajectory import Trajectory
from .transcripts import append_transcripts, select_transcripts, transcript_record

ACCUMULATION_MODES = ("sdk", "manual")
SAMPLER_TTL_SECONDS = 24 * 3600  # named samplers of off-policy runs (resume reuses them)
CHECKPOINT_NAME = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?$"


def _checkpoint_prefix_rule(name: str) -> str | None:
    if re.match(CHECKPOINT_NAME, name) and len(name) <= 150:
        return None
    return (f"{name!r} cannot prefix PyTRIO checkpoint names: use letters, digits, '.', '_' and '-' "
            "(at most 150 characters, not ending with '.')")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is started with; ``config.json`` is this object. Each user setting is
    declared once here (:mod:`searchr1.settings`), and the flags of ``train`` are made from it."""

    max_steps: int = setting(help="Training steps [required live; with --offline default 20 for the learning "
                                  "policy, 4 for the scripted one].", at_least=1)
    data: str = setting(metavar="PATH", help="Training JSONL [default: datasets/train.jsonl; the shipped offline "
                                             "set with --offline].")
    run_name: str = setting("search-r1-qwen35-4b", check=_checkpoint_prefix_rule,
                            help="Also the checkpoint name prefix.")
    base_model: str = setting("Qwen/Qwen3.5-4B", help="The model trained (LoRA on it) and sampled.")
    lora_rank: int = setting(32, at_least=4, at_most=64, help="LoRA rank.")
    questions_per_batch: int = setting(8, at_least=1, help="Questions per step (each sampled --group-size times).")
    max_train_samples: int = setting(0, at_least=0, help="Use only the first N shuffled examples (0 = all).")
    learning_rate: float = setting(4e-5, above=0.0, default_text="4e-05; 0.2 for --offline-policy learning",
                                   help="Adam learning rate.")
    beta1: float = setting(0.9, at_least=0.0, below=1.0, help="Adam beta1.")
    beta2: float = setting(0.95, at_least=0.0, below=1.0, help="Adam beta2.")
    save_every: int = setting(50, at_least=0, help="Checkpoint every N steps (0 = only the final save).")
    seed: int = setting(42, help="Data order, LoRA init and sampling seeds.")
    accumulation: str = setting("sdk", choices=ACCUMULATION_MODES,
                                help="sdk: one forward_backward per step (exact whatever the server's reduction); "
                                     "manual: the seed's micro-batches with n_k/N weights.")
    advantage_mode: str = setting("mean", flag="--advantage", choices=ADVANTAGE_MODES,
                                  help="Group-relative advantage: reward minus group mean (seed), z-score, or raw "
                                       "reward.")
    keep_env_failures: bool = setting(False, help="Train on groups hit by search or sampler failures (default: "
                                                  "leave them out and count them).")
    max_micro_batch_items: int = setting(32, at_least=1, cli=False)
    max_micro_batch_padded_tokens: int = setting(64_000, at_least=1, cli=False)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    search: dict[str, Any] = field(default_factory=dict)  # backend settings, recorded as given
    offline: bool = False
    data_sha256: str = ""
    code_version: str = __version__
    # A random id drawn when the run starts and kept by --resume: it is part of every
    # checkpoint name, so two runs with the same --run-name never save under the same name.
    run_id: str = ""
    # What the service reported for base_model when the run started (searchr1.preflight).
    server_limits: dict[str, Any] | None = None
    # Rollouts for step b run on the weights after b - K steps (searchr1.off_policy); 0 = on-policy.
    max_steps_off_policy: int = setting(
        0, at_least=0, help="Roll out the batches of the next K steps while a step trains, on weights up to K "
                            "steps old (the importance ratio corrects for it); 0 = on-policy. Worth it when steps "
                            "are long or training calls are expensive.")
    transcripts_per_step: int = setting(
        4, at_least=0, help="Trajectories per step written to <run-dir>/transcripts.jsonl (read them with `show`).")
    # Offline runs: the policy the twin serves ("learning" or "scripted"); None for live runs.
    offline_policy: str | None = None
    # The collapse guard (searchr1.health): stop after N consecutive unhealthy steps (0: only
    # warn), and thresholds that replace the defaults (None turns a rule off).
    stop_on_collapse: int = setting(
        0, at_least=0, metavar="N",
        help="Stop (exit code 3) after N consecutive unhealthy steps, saving a checkpoint and printing the "
             "last healthy one and the command that restarts from it; 0: only warn.")
    health_rules: dict[str, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.rollout.group_size < 2:
            raise SettingError("--group-size", f"{self.rollout.group_size}: group advantages compare a question's "
                               "samples with each other, so a group of one always has advantage 0 and no step "
                               "could ever update; use at least 2")
        configured_rules(self.health_rules)  # names a rule that does not exist

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def checkpoint_prefix(self) -> str:
        """What every checkpoint name of this run starts with: ``<run-name>-<run-id>-``."""
        return f"{self.run_name}-{self.run_id}-" if self.run_id else f"{self.run_name}-"

    def checkpoint_name(self, completed_steps: int, session: int = 0) -> str:
        """The name of the checkpoint taken after ``completed_steps`` steps in the run's
        ``session``-th start (0 fresh, 1 after the first ``--resume``...). One start saves at
        most once per step count, and the session tells apart a save that a crash left half
        written from its retry after the resume, so no name is ever reused (no ``overwrite``)."""
        name = f"{self.checkpoint_prefix}step-{completed_steps:06d}"
        return f"{name}-resume{session}" if session else name

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> TrainConfig:
        values = dict(payload)
        values.pop("segments", None)  # the run's history of flag changes (commands/train.py)
        values["rollout"] = RolloutConfig(**values.get("rollout", {}))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"config.json holds unknown fields {unknown}; written by another version?")
        return cls(**values)


def new_run_id() -> str:
    """Eight random hex digits: the part of checkpoint names that tells runs apart."""
    import secrets

    return secrets.token_hex(4)


class TrainingStopped(RuntimeError):
    """The run stopped before ``max_steps``; every finished step is saved."""

    def __init__(self, message: str, *, step: int, run_dir: str) -> None:
        super().__init__(f"{message}\nFinished steps are saved in {run_dir}; resume with: "
                         f"python cli.py train --resume {run_dir}")
        self.step = step
        self.run_dir = run_dir


class CollapseDetected(RuntimeError):
    """``--stop-on-collapse``: the run stopped after that many unhealthy steps in a row; what it
    had is saved, and the message names the last healthy checkpoint and how to restart there."""

    def __init__(self, message: str, *, step: int, run_dir: str, restart_step: int | None) -> None:
        super().__init__(message)
        self.step = step
        self.run_dir = run_dir
        self.restart_step = restart_step


class MetricsLogger(Protocol):
    """Where each finished step's metrics also go (SwanLab, W&B, TensorBoard: searchr1.loggers)."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...


class Reporter(Protocol):
    def start(self, total_steps: int, first_step: int) -> None: ...
    def start_step(self, step: int, trajectories: int) -> None: ...
    def trajectory_done(self, count: int = 1) -> None: ...
    def end_step(self, step: int, metrics: dict[str, float]) -> None: ...
    def note(self, text: str) -> None: ...
    def close(self) -> None: ...


class SilentReporter:
    def start(self, total_steps: int, first_step: int) -> None: ...
    def start_step(self, step: int, trajectories: int) -> None: ...
    def trajectory_done(self, count: int = 1) -> None: ...
    def end_step(self, step: int, metrics: dict[str, float]) -> None: ...
    def note(self, text: str) -> None: ...
    def close(self) -> None: ...


# Where an exception comes from when it is a failure of the remote service or the network
# rather than of this program: pytrio itself, and what pytrio lets through from below it.
SERVICE_MODULES = ("pytrio", "httpx", "httpcore", "h11", "modelscope", "modelscope_hub", "requests", "urllib3")


def is_service_failure(error: BaseException) -> bool:
    """True for errors of the service or the network (PyTrioError, httpx and ModelScope
    errors, timeouts, dropped connections): they end a run with one line and a resumable run
    directory. Anything else is a bug and keeps its traceback."""
    if isinstance(error, (TimeoutError, ConnectionError, concurrent.futures.TimeoutError)):
        return True
    return any(cls.__module__.split(".")[0] in SERVICE_MODULES for cls in type(error).__mro__)


def describe_failure(error: BaseException) -> str:
    """``code or class: first line of the message`` (bounded; never a traceback)."""
    code = getattr(error, "code", None) or type(error).__name__
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else "no message"
    return f"{code}: {text}"


def drop_out_of_vocab(datums: Sequence[TrainingDatum], vocab_size: int) -> tuple[list[TrainingDatum], int]:
    """PyTRIO rejects any token id >= len(tokenizer) (the embedding has 243 spare rows the
    sampler can in principle emit); drop such datums instead of failing the step."""
    kept = []
    for item in datums:
        ids = item.datum.model_input.to_ints()
        targets = item.datum.loss_fn_inputs["target_tokens"].data
        if max(ids, default=0) < vocab_size and max(targets, default=0) < vocab_size:
            kept.append(item)
    return kept, len(datums) - len(kept)


@dataclass(frozen=True)
class BatchRollout:
    """One step's batch, rolled out (possibly while earlier steps trained)."""

    batch_index: int
    sampler_version: int
    trajectories: list[Trajectory]
    seconds: float


class _BatchProgress:
    """Routes per-trajectory progress to the reporter for the batch being waited on; batches
    rolling out ahead of time are counted and shown when their step starts."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.current: int | None = None
        self.pending: dict[int, int] = {}

    def focus(self, batch_index: int) -> None:
        self.current = batch_index
        done = self.pending.pop(batch_index, 0)
        if done:
            self.reporter.trajectory_done(done)

    def callback(self, batch_index: int) -> Callable[[int], None]:
        def advance(count: int = 1) -> None:
            if batch_index == self.current:
                self.reporter.trajectory_done(count)
            else:
                self.pending[batch_index] = self.pending.get(batch_index, 0) + count

        return advance


class Trainer:
    """Runs steps ``[start_step, max_steps)`` of one run against any PyTRIO-shaped service."""

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        *,
        service: Any,
        tokenizer: Any,
        search: SearchBackend,
        examples: Sequence[SearchExample],
        reporter: Reporter | None = None,
        logger: MetricsLogger | None = None,
    ) -> None:
        if not examples:
            raise ValueError(f"no training examples in {config.data}")
        self.config = config
        self.run = run
        self.service = service
        self.tokenizer = tokenizer
        self.search = search
        self.examples = list(examples)
        self.reporter = reporter or SilentReporter()
        self.logger = logger
        self.training_client: Any = None
        self.first_step = 0
        self.last_saved_step: int | None = None
        self.session = 0  # how many times this run was resumed (part of checkpoint names)
        self.stop_requested = False
        self.weights_version = 0  # finished steps of the training client's current weights
        # The pipeline: samplers per weights version, rollouts per batch (step) index.
        self.sampler_paths: dict[int, str] = {}
        self._samplers: dict[int, asyncio.Future[tuple[Any, int]]] = {}
        self._rollouts: dict[int, asyncio.Future[BatchRollout]] = {}
        self._progress = _BatchProgress(self.reporter)
        self._sampling_slots: asyncio.Semaphore | None = None  # one cap for every batch in flight
        self._last_trajectories: list[Trajectory] = []

    # -- set-up ------------------------------------------------------------------------------

    def connect(self, resume: ResumePoint | None) -> int:
        """Create the training client (fresh or from the resume point) and check, before any
        sample is paid for, that the service's tokenizer is the one the protocol was built
        with (:mod:`searchr1.preflight`). Returns the first step; idempotent."""
        if self.training_client is not None:
            return self.first_step
        check_template(self.tokenizer)  # before anything that costs money
        try:
            if resume is None:
                client = self.service.create_lora_training_client(
                    base_model=self.config.base_model, rank=self.config.lora_rank, seed=self.config.seed
                )
            else:
                client = self.service.create_training_client_from_state_with_optimizer(resume.state_path)
        except Exception as error:
            if not is_service_failure(error):
                raise
            raise PreflightError(f"cannot create the training run: {describe_failure(error)}") from None
        check_service_tokenizer(self.tokenizer, client)
        self.training_client = client
        self.last_saved_step = None if resume is None else resume.step
        self.first_step = 0 if resume is None else resume.step
        self.sampler_paths = {} if resume is None else dict(resume.sampler_paths)
        self.weights_version = self.first_step
        return self.first_step

    def request_stop(self) -> None:
        """Finish the current step, save a checkpoint and stop (the first Ctrl-C)."""
        self.stop_requested = True

    # -- one step ----------------------------------------------------------------------------

    def _micro_batches(self, datums: list[TrainingDatum]) -> list[list[TrainingDatum]]:
        """The seed's first-fit-decreasing micro-batches (manual accumulation only)."""
        config = self.config
        return pack_micro_batches(
            datums, max_datum_tokens=config.rollout.max_trajectory_tokens,
            max_items=config.max_micro_batch_items, max_padded_tokens=config.max_micro_batch_padded_tokens,
        )

    async def _update(
        self, datums: list[TrainingDatum], micro_batches: list[list[TrainingDatum]] | None,
    ) -> tuple[list[dict[str, float]], dict[str, float], int]:
        """forward_backward (one call, or one per micro-batch with n_k/N weights) and one
        optim_step; returns metrics and the number of forward_backward calls. The metrics
        include the sampler-learner mismatch (searchr1.diagnostics); a non-finite input or
        result raises :class:`NonFiniteValues` before optim_step."""
        import pytrio as trio

        client = self.training_client
        config = self.config
        loss_fn = getattr(config, "loss_fn", "importance_sampling")
        loss_fn_config = getattr(config, "loss_fn_config", None) or None
        problem = non_finite_inputs(datums)
        if problem:
            raise NonFiniteValues(f"{problem} (nothing was sent to forward_backward)")
        if micro_batches is None:
            calls = [[item.datum for item in datums]]
        else:
            calls = [[item.datum for item in weight_micro_batch_for_global_mean(batch, len(datums))]
                     for batch in micro_batches]
        outputs, tokens = [], []
        for data in calls:
            options = {"loss_fn_config": loss_fn_config} if loss_fn_config else {}
            future = await client.forward_backward_async(data, loss_fn=loss_fn, **options)
            result = await future
            outputs.append(dict(result.metrics))
            tokens += learner_tokens(data, getattr(result, "loss_fn_outputs", None))
        problem = non_finite_outputs(outputs, [t.learned for t in tokens])
        if problem:
            raise NonFiniteValues(f"{problem}; optim_step was not called, so the weights are unchanged")
        adam = trio.AdamParams(learning_rate=config.learning_rate, beta1=config.beta1, beta2=config.beta2)
        optim = await (await client.optim_step_async(adam))
        metrics = {f"optim/{k}": float(v) for k, v in dict(optim.metrics).items()}
        metrics.update(mismatch_metrics(tokens, loss_fn=loss_fn, loss_fn_config=loss_fn_config))
        return outputs, metrics, len(calls)

    # -- samplers (one per weights version) ----------------------------------------------

    def _sampler(self, version: int) -> asyncio.Future[tuple[Any, int]]:
        """The sampling client on the weights after ``version`` finished steps (a task, made
        once per version). On-policy (K=0) it is PyTRIO's temporary sampler; with K >= 1 the
        weights are saved under a name of this run, so that a resumed run can roll out its
        in-flight batches on exactly the weights the uninterrupted run used."""
        if version not in self._samplers:
            self._samplers[version] = asyncio.ensure_future(self._make_sampler(version))
        return self._samplers[version]

    async def _make_sampler(self, version: int) -> tuple[Any, int]:
        """The sampler and the version it really holds: a version older than the current
        weights that was not recorded (a finished run resumed with a larger --max-steps)
        is no longer available, and the current weights stand in for it."""
        client = self.training_client
        if version in self.sampler_paths:  # recorded before a resume
            return await client.create_sampling_client_async(self.sampler_paths[version]), version
        if version < self.weights_version:
            self.reporter.note(f"the sampler of the weights after {version} steps was not recorded; "
                               f"sampling on the current weights (after {self.weights_version} steps)")
            version = self.weights_version
        if self.config.max_steps_off_policy == 0:
            return await client.save_weights_and_get_sampling_client_async(), version
        name = f"{self.config.checkpoint_name(version, self.session)}-sampler"
        saved = await (await client.save_weights_for_sampler_async(name=name, ttl_seconds=SAMPLER_TTL_SECONDS))
        self.sampler_paths[version] = saved.path
        return await client.create_sampling_client_async(saved.path), version

    # -- rollouts, possibly ahead of training -----------------------------------------------

    def _launch(self, batch_index: int) -> asyncio.Future[BatchRollout]:
        if batch_index not in self._rollouts:
            self._rollouts[batch_index] = asyncio.ensure_future(self._roll_out(batch_index))
        return self._rollouts[batch_index]

    async def _roll_out(self, batch_index: int) -> BatchRollout:
        """Roll out the batch trained in step ``batch_index``, on the sampler of
        ``sampler_version(batch_index, K)``: seeds, questions and weights are fixed by the
        step index alone, whenever the rollout actually runs."""
        config = self.config
        sampler, version = await self._sampler(sampler_version(batch_index, config.max_steps_off_policy))
        batch = take_batch(self.examples, batch_index * config.questions_per_batch, config.questions_per_batch)
        started = time.perf_counter()
        trajectories = await rollout_batch_async(
            sampler, self.tokenizer, self.search, batch, config.rollout, self._progress.callback(batch_index),
            step=batch_index, advantage_mode=config.advantage_mode, keep_env_failures=config.keep_env_failures,
            sampling_slots=self._sampling_slots,
        )
        return BatchRollout(batch_index, version, trajectories, time.perf_counter() - started)

    def _drop_rollouts_from(self, first_batch: int) -> int:
        """Cancel rollouts of batches ``>= first_batch`` (a stop or the end of the run)."""
        dropped = 0
        for index in sorted(self._rollouts):
            if index >= first_batch:
                task = self._rollouts.pop(index)
                dropped += not task.done()
                task.cancel()
        return dropped

    # -- one step ----------------------------------------------------------------------------

    async def step(self, step: int) -> dict[str, float]:
        """Train step ``step``: launch the rollouts of steps ``step .. step + K`` that are not
        running yet, wait for this step's batch, update, and start the sampler the batch
        ``step + 1 + K`` will need."""
        config = self.config
        started = time.perf_counter()
        self.reporter.start_step(step, config.questions_per_batch * config.rollout.group_size)
        self._progress.focus(step)
        for index in range(step, min(step + config.max_steps_off_policy + 1, config.max_steps)):
            self._launch(index)
        rollout = await self._rollouts.pop(step)
        waited = time.perf_counter() - started
        trajectories = rollout.trajectories
        groups = summarize_groups(trajectories, keep_env_failures=config.keep_env_failures)
        staleness = step - rollout.sampler_version
        stale = staleness > config.max_steps_off_policy  # never by construction; guarded all the same
        problem = non_finite_sampled(trajectories)
        if problem:
            raise NonFiniteValues(f"{problem} (nothing was sent to forward_backward)")
        datums = [] if stale else build_training_datums(trajectories, max_tokens=config.rollout.max_trajectory_tokens)
        datums, dropped = drop_out_of_vocab(datums, len(self.tokenizer))
        micro_batches = self._micro_batches(datums) if config.accumulation == "manual" else None
        metrics: dict[str, float] = {}
        metrics.update(rollout_metrics(trajectories, groups))
        metrics.update(policy_diagnostics(trajectories))
        metrics.update(datum_metrics(datums, micro_batches))
        metrics["train/datums_dropped_out_of_vocab"] = float(dropped)
        train_started = time.perf_counter()
        if datums:
            outputs, optim_metrics, calls = await self._update(datums, micro_batches)
            metrics.update(trainer_metrics(outputs))
            metrics.update(optim_metrics)
        else:
            calls = 0
        self.weights_version = step + 1
        if step + 1 + config.max_steps_off_policy < config.max_steps:
            self._sampler(step + 1)  # saving the new weights overlaps with this step's bookkeeping
        metrics["train/forward_backward_calls"] = float(calls)
        metrics["train/tokens_sent"] = float(sum(d.num_tokens for d in datums))
        metrics["train/update_skipped"] = float(not datums)
        if config.max_steps_off_policy or stale:
            metrics.update(off_policy_metrics(staleness, config.max_steps_off_policy, len(trajectories),
                                              discarded=len(trajectories) if stale else 0,
                                              in_flight=len(self._rollouts)))
        stats = getattr(self.search, "stats", None)
        if stats is not None and hasattr(stats, "drain"):
            metrics.update(stats.drain())
        metrics["time/rollout_seconds"] = rollout.seconds
        metrics["time/rollout_wait_seconds"] = waited
        metrics["time/train_seconds"] = time.perf_counter() - train_started
        metrics["time/step_seconds"] = time.perf_counter() - started
        self._last_trajectories = trajectories
        return metrics

    # -- checkpoints -------------------------------------------------------------------------

    async def save(self, completed: int, *, final: bool = False) -> dict[str, Any]:
        client = self.training_client
        name = self.config.checkpoint_name(completed, self.session)
        state = await (await client.save_state_async(name=f"{name}-state", overwrite=False))
        weights = await (await client.save_weights_for_sampler_async(name=f"{name}-weights"))
        entry = {
            "name": name,
            "final": final,
            "step": completed,
            "cursor": completed * self.config.questions_per_batch,
            "state_path": state.path,
            "weights_path": weights.path,
            # samplers of the batches in flight (off-policy runs): a resume redoes them exactly
            "sampler_paths": {str(v): self.sampler_paths[v] for v in sorted(
                versions_to_record(completed, self.config.max_steps, self.config.max_steps_off_policy))
                if v in self.sampler_paths},
            "time": time.time(),
        }
        self.run.record_checkpoint(entry)
        self.last_saved_step = completed
        self.reporter.note(f"checkpoint {name}: state {state.path}  weights {weights.path}")
        return entry

    # -- the collapse guard ------------------------------------------------------------------

    async def _stop_on_collapse(self, completed: int, streak: int) -> None:
        """Save what the run has, then raise :class:`CollapseDetected` naming the last healthy
        checkpoint and the command that restarts from it."""
        config = self.config
        self._drop_rollouts_from(completed)
        if self.last_saved_step != completed:
            await self.save(completed)
        self.run.write_state({**self.run.state(), "last_checkpoint": self.last_saved_step})
        first_bad = completed - streak
        healthy = last_healthy_checkpoint(self.run.checkpoints(), self.run.metrics(), before_step=first_bad,
                                          max_steps_off_policy=config.max_steps_off_policy)
        message = (f"collapse guard: steps {first_bad}..{completed - 1} were unhealthy ({streak} in a row, "
                   f"--stop-on-collapse {config.stop_on_collapse}); stopped after step {completed - 1} and saved "
                   f"a checkpoint of step {completed} in {self.run.path}.\n"
                   f"What the model did: python cli.py show {self.run.path} --step {first_bad}\n")
        if healthy is None:
            message += ("no checkpoint before the unhealthy steps was saved (a smaller --save-every keeps more); "
                        "start a new run with other settings")
            restart = None
        else:
            restart = int(healthy["step"])
            message += (f"last healthy checkpoint: {healthy['name']} (step {restart}); continue from it "
                        f"(add flags to change, e.g. --learning-rate) with:\n"
                        f"python cli.py train --resume {self.run.path} --from-step {restart}")
        raise CollapseDetected(message, step=completed, run_dir=str(self.run.path), restart_step=restart)

    # -- the loop ----------------------------------------------------------------------------

    async def run_steps(self, resume: ResumePoint | None) -> int:
        """Run to ``max_steps`` (or, after :meth:`request_stop`, to the end of the current step,
        then checkpoint); returns the number of completed steps."""
        config = self.config
        first = self.connect(resume)
        if resume is not None:
            self.session = int(self.run.state().get("session", 0)) + 1
            self.run.write_state({**self.run.state(), "session": self.session})
        rewound = self.run.rewind_to(first)
        if rewound:
            self.reporter.note(f"resuming at step {first}: {rewound} later metrics line(s) moved to metrics.rewound.jsonl")
        self._sampling_slots = asyncio.Semaphore(config.rollout.sampling_concurrency)
        guard = CollapseGuard(configured_rules(config.health_rules), stop_after=config.stop_on_collapse,
                              history=self.run.metrics())
        self.reporter.start(config.max_steps, first)
        completed = first
        try:
            for step in range(first, config.max_steps):
                metrics = await self.step(step)
                completed = step + 1
                verdict = guard.observe(metrics)
                metrics.update(verdict.metrics())
                if verdict.unhealthy:  # texts: in metrics.jsonl, not on the dashboards (numbers only)
                    metrics["health/warnings"] = verdict.warnings()  # type: ignore[assignment]
                    self.reporter.note(f"warning: step {step} unhealthy: {'; '.join(verdict.warnings())}. "
                                       f"What the model did: python cli.py show {self.run.path} --step {step}")
                self.run.append_metrics({"step": step, **metrics})
                if config.transcripts_per_step:
                    chosen = select_transcripts(self._last_trajectories, config.transcripts_per_step)
                    append_transcripts(self.run.path, step, [transcript_record(t, step) for t in chosen])
                if self.logger is not None:
                    self.logger.log(step, metrics)
                self.reporter.end_step(step, metrics)
                stopping = self.stop_requested and completed < config.max_steps
                if stopping:
                    self._drop_rollouts_from(completed)  # in flight; redone exactly on resume
                if (config.save_every and completed % config.save_every == 0) or stopping:
                    await self.save(completed)
                self.run.write_state({
                    "step": completed,
                    "cursor": completed * config.questions_per_batch,
                    "seed": config.seed,
                    "last_checkpoint": self.last_saved_step,
                    "max_steps": config.max_steps,
                    "session": self.session,
                })
                if verdict.stop:
                    await self._stop_on_collapse(completed, verdict.streak)
                if stopping:
                    break
            if self.last_saved_step != completed:
                await self.save(completed, final=completed >= config.max_steps)
                self.run.write_state({**self.run.state(), "last_checkpoint": completed})
        except SamplerFailureError as error:
            raise TrainingStopped(f"stopped in step {completed}: {error}", step=completed,
                                  run_dir=str(self.run.path)) from error
        except NonFiniteValues as error:
            raise TrainingStopped(f"stopped in step {completed}: a non-finite value: {error}", step=completed,
                                  run_dir=str(self.run.path)) from error
        except Exception as error:
            if not is_service_failure(error):
                raise
            raise TrainingStopped(
                f"stopped in step {completed}: the training service failed ({describe_failure(error)})",
                step=completed, run_dir=str(self.run.path),
            ) from error
        finally:
            self._drop_rollouts_from(0)
            for task in self._samplers.values():
                task.cancel()
            self.reporter.close()
        return completed
