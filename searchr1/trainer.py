"""The training loop: one Search-R1 step at a time, on PyTRIO or on its offline twin.

Per step::

    questions  <- next batch from the data cursor
    sampler    <- training_client.save_weights_and_get_sampling_client()   (on-policy)
    trajectories <- rollout (score, group advantages)
    datums     <- one Datum per trajectory that carries signal
    forward_backward(importance_sampling) -> optim_step(AdamParams)
    metrics line, checkpoint when due, run state

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

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import __version__
from .advantage import summarize_groups
from .data import SearchExample, take_batch
from .datum import TrainingDatum, build_training_datums
from .metrics import datum_metrics, rollout_metrics, trainer_metrics
from .packing import pack_micro_batches, weight_micro_batch_for_global_mean
from .preflight import PreflightError, check_service_tokenizer
from .protocol import check_template
from .rollout import RolloutConfig, SamplerFailureError, rollout_batch_async
from .run_dir import ResumePoint, RunDir
from .search.types import SearchBackend

ACCUMULATION_MODES = ("sdk", "manual")
CHECKPOINT_NAME = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?$"


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int
    data: str
    run_name: str = "search-r1-qwen35-4b"
    base_model: str = "Qwen/Qwen3.5-4B"
    lora_rank: int = 32
    questions_per_batch: int = 8
    max_train_samples: int = 0
    learning_rate: float = 4e-5
    beta1: float = 0.9
    beta2: float = 0.95
    save_every: int = 50
    seed: int = 42
    accumulation: str = "sdk"
    advantage_mode: str = "mean"
    keep_env_failures: bool = False
    max_micro_batch_items: int = 32
    max_micro_batch_padded_tokens: int = 64_000
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

    def __post_init__(self) -> None:
        import re

        if self.max_steps < 1:
            raise ValueError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.questions_per_batch < 1:
            raise ValueError(f"--questions-per-batch must be >= 1, got {self.questions_per_batch}")
        if self.accumulation not in ACCUMULATION_MODES:
            raise ValueError(f"--accumulation must be one of {ACCUMULATION_MODES}, got {self.accumulation!r}")
        if self.save_every < 0:
            raise ValueError(f"--save-every must be >= 0, got {self.save_every}")
        if not re.match(CHECKPOINT_NAME, self.run_name) or len(self.run_name) > 150:
            raise ValueError(
                f"--run-name {self.run_name!r} cannot prefix PyTRIO checkpoint names: use letters, "
                "digits, '.', '_' and '-' (at most 150 characters, not ending with '.')"
            )

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
        logger: Callable[[int, dict[str, float]], None] | None = None,
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
        optim_step; returns metrics and the number of forward_backward calls."""
        import pytrio as trio

        client = self.training_client
        config = self.config
        if micro_batches is None:
            calls = [[item.datum for item in datums]]
        else:
            calls = [[item.datum for item in weight_micro_batch_for_global_mean(batch, len(datums))]
                     for batch in micro_batches]
        outputs = []
        for data in calls:
            future = await client.forward_backward_async(data, loss_fn="importance_sampling")
            outputs.append(dict((await future).metrics))
        adam = trio.AdamParams(learning_rate=config.learning_rate, beta1=config.beta1, beta2=config.beta2)
        optim = await (await client.optim_step_async(adam))
        return outputs, {f"optim/{k}": float(v) for k, v in dict(optim.metrics).items()}, len(calls)

    async def step(self, step: int) -> dict[str, float]:
        config = self.config
        started = time.perf_counter()
        batch = take_batch(self.examples, step * config.questions_per_batch, config.questions_per_batch)
        self.reporter.start_step(step, len(batch) * config.rollout.group_size)
        sampler = await self.training_client.save_weights_and_get_sampling_client_async()
        rollout_started = time.perf_counter()
        trajectories = await rollout_batch_async(
            sampler, self.tokenizer, self.search, batch, config.rollout, self.reporter.trajectory_done,
            step=step, advantage_mode=config.advantage_mode, keep_env_failures=config.keep_env_failures,
        )
        rollout_seconds = time.perf_counter() - rollout_started
        groups = summarize_groups(trajectories, keep_env_failures=config.keep_env_failures)
        datums = build_training_datums(trajectories, max_tokens=config.rollout.max_trajectory_tokens)
        datums, dropped = drop_out_of_vocab(datums, len(self.tokenizer))
        micro_batches = self._micro_batches(datums) if config.accumulation == "manual" else None
        metrics: dict[str, float] = {}
        metrics.update(rollout_metrics(trajectories, groups))
        metrics.update(datum_metrics(datums, micro_batches))
        metrics["train/datums_dropped_out_of_vocab"] = float(dropped)
        train_started = time.perf_counter()
        if datums:
            outputs, optim_metrics, calls = await self._update(datums, micro_batches)
            metrics.update(trainer_metrics(outputs))
            metrics.update(optim_metrics)
        else:
            calls = 0
        metrics["train/forward_backward_calls"] = float(calls)
        metrics["train/tokens_sent"] = float(sum(d.num_tokens for d in datums))
        metrics["train/update_skipped"] = float(not datums)
        stats = getattr(self.search, "stats", None)
        if stats is not None and hasattr(stats, "drain"):
            metrics.update(stats.drain())
        metrics["time/rollout_seconds"] = rollout_seconds
        metrics["time/train_seconds"] = time.perf_counter() - train_started
        metrics["time/step_seconds"] = time.perf_counter() - started
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
            "time": time.time(),
        }
        self.run.record_checkpoint(entry)
        self.last_saved_step = completed
        self.reporter.note(f"checkpoint {name}: state {state.path}  weights {weights.path}")
        return entry

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
        self.reporter.start(config.max_steps, first)
        completed = first
        try:
            for step in range(first, config.max_steps):
                metrics = await self.step(step)
                completed = step + 1
                self.run.append_metrics({"step": step, **metrics})
                if self.logger is not None:
                    self.logger(step, metrics)
                self.reporter.end_step(step, metrics)
                if config.save_every and completed % config.save_every == 0:
                    await self.save(completed)
                self.run.write_state({
                    "step": completed,
                    "cursor": completed * config.questions_per_batch,
                    "seed": config.seed,
                    "last_checkpoint": self.last_saved_step,
                    "max_steps": config.max_steps,
                    "session": self.session,
                })
                if self.stop_requested and completed < config.max_steps:
                    break
            if self.last_saved_step != completed:
                await self.save(completed, final=completed >= config.max_steps)
                self.run.write_state({**self.run.state(), "last_checkpoint": completed})
        except SamplerFailureError as error:
            raise TrainingStopped(f"stopped in step {completed}: {error}", step=completed,
                                  run_dir=str(self.run.path)) from error
        except Exception as error:
            if not is_service_failure(error):
                raise
            raise TrainingStopped(
                f"stopped in step {completed}: the training service failed ({describe_failure(error)})",
                step=completed, run_dir=str(self.run.path),
            ) from error
        finally:
            self.reporter.close()
        return completed
