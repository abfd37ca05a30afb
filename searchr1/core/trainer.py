"""The training loop: one Search-R1 step at a time, on PyTRIO or on its offline twin.

Per step ``b``::

    questions  <- batch b of the data cursor
    sampler    <- the weights after b - K steps (K = --max-steps-off-policy; 0: the current
                  weights, PyTRIO's save_weights_and_get_sampling_client)
    trajectories <- rollout (score, group advantages); with K >= 1 the batches of steps
                  b+1..b+K are already rolling out meanwhile (searchr1.training.off_policy)
    datums     <- one Datum per trajectory that carries signal
    forward_backward(importance_sampling) -> optim_step(AdamParams), once per --num-substeps
                  mini-batch (searchr1.core.update)
    metrics line, transcripts, checkpoint when due, run state

Before the first step, :meth:`Trainer.connect` creates the training client and checks the
service's tokenizer (searchr1.runtime.preflight): nothing is sampled before the run can finish a step.

Accumulation. ``sdk`` (default) sends every datum of the step in ONE ``forward_backward``
call: PyTRIO splits it itself and normalises every chunk by batch-global totals, so the
update is the full-batch one whatever the server's reduction. ``manual`` is the seed's way:
first-fit-decreasing micro-batches, advantages scaled by n_k/N, one call per micro-batch.
That is exact only if the server averages per sample (``python cli.py probe-loss`` tells);
here N is the number of datums sent, so both modes agree under a per-sample mean (the seed
used all trajectories, which rescales each step by datums/trajectories).

Where the rest lives: the settings and checkpoint names in :mod:`searchr1.core.config`, the
samplers and the batches rolling out ahead of training in :mod:`searchr1.training.pipeline`, which
errors are the service's in :mod:`searchr1.core.failures`.

Failures. A finished step is on disk before the next one starts. A broken training client,
a failed event, too many sampler failures or Ctrl-C stop the run with :class:`TrainingStopped`,
whose message says how to resume; ``--resume`` restarts at the last checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from searchr1.core.advantage import summarize_groups
from searchr1.data.dataset import SearchExample
from searchr1.core.datum import TrainingDatum, build_training_datums, drop_out_of_vocab
from searchr1.health.diagnostics import NonFiniteValues, non_finite_sampled, policy_diagnostics
from searchr1.core.failures import describe_failure, is_service_failure
from searchr1.health.rules import CollapseGuard, collapse_report, configured_rules, last_healthy_checkpoint
from searchr1.core.kl import BaseModelPenalty
from searchr1.health.metrics import datum_metrics, rollout_metrics, trainer_metrics
from searchr1.training.off_policy import off_policy_metrics, versions_to_record
from searchr1.training.packing import pack_micro_batches
from searchr1.training.pipeline import RolloutPipeline
from searchr1.runtime.preflight import PreflightError, check_service_tokenizer
from searchr1.core.protocol import check_template
from searchr1.core.reporting import MetricsLogger, Reporter, SilentReporter
from searchr1.core.rollout import SamplerFailureError
from searchr1.run.directory import ResumePoint, RunDir
from searchr1.search.types import SearchBackend
from searchr1.core.config import TrainConfig
from searchr1.core.types import Trajectory
from searchr1.run.transcripts import append_transcripts, select_transcripts, transcript_record
from searchr1.core.update import apply_update


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


@dataclass(frozen=True)
class StepResult:
    """What one step produced: its metrics line and the trajectories it trained on."""

    metrics: dict[str, float]
    trajectories: list[Trajectory]


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
        self.sampler_paths: dict[int, str] = {}  # recorded samplers of in-flight batches (K >= 1)
        self.pipeline: RolloutPipeline | None = None  # made by run_steps, inside the event loop
        self.first_cursor = 0  # the data cursor at the first step (a resume point's)
        self._base_penalty: BaseModelPenalty | None = None  # --kl-coef: the base weights' sampler

    # -- set-up ------------------------------------------------------------------------------

    def connect(self, resume: ResumePoint | None) -> int:
        """Create the training client (fresh or from the resume point) and check, before any
        sample is paid for, that the service's tokenizer is the one the protocol was built
        with (:mod:`searchr1.runtime.preflight`). Returns the first step; idempotent."""
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
        self.first_cursor = 0 if resume is None else resume.cursor
        self.sampler_paths = {} if resume is None else dict(resume.sampler_paths)
        return self.first_step

    def request_stop(self) -> None:
        """Finish the current step, save a checkpoint and stop (the first Ctrl-C)."""
        self.stop_requested = True

    # -- one step ----------------------------------------------------------------------------

    async def step(self, step: int) -> StepResult:
        """Train step ``step``: wait for its batch (the pipeline rolls out later batches
        meanwhile when K >= 1), build the datums, update, and start the next sampler."""
        config = self.config
        assert self.pipeline is not None, "run_steps makes the pipeline"
        started = time.perf_counter()
        self.reporter.start_step(step, config.questions_per_batch * config.rollout.group_size)
        rollout = await self.pipeline.batch(step)
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
        algorithm_metrics = dict(rollout.metrics)
        if datums and config.kl_coef:
            datums, kl_metrics = await self._kl_penalty(datums)
            algorithm_metrics.update(kl_metrics)
        micro_batches = None
        if config.accumulation == "manual":  # the seed's first-fit-decreasing micro-batches
            micro_batches = pack_micro_batches(
                datums, max_datum_tokens=config.rollout.max_trajectory_tokens,
                max_items=config.max_micro_batch_items, max_padded_tokens=config.max_micro_batch_padded_tokens)
        metrics: dict[str, float] = {}
        metrics.update(rollout_metrics(trajectories, groups))
        metrics.update(policy_diagnostics(trajectories))
        metrics.update(datum_metrics(datums, micro_batches))
        metrics["train/datums_dropped_out_of_vocab"] = float(dropped)
        metrics.update(algorithm_metrics)
        if config.dynamic_sampling:
            metrics["train/groups_trained"] = algorithm_metrics["dynamic/groups_kept"]
        train_started = time.perf_counter()
        calls = 0
        await self.pipeline.before_update(step)  # later batches' sampler holds the weights before this update
        if datums:
            outputs, optim_metrics, calls = await self._update(datums, micro_batches, step=step)
            metrics.update(trainer_metrics(outputs))
            metrics.update(optim_metrics)
        metrics.setdefault("train/optimizer_steps", 0.0)
        self.pipeline.weights_updated(step)  # saving the new weights overlaps with the bookkeeping
        metrics["train/forward_backward_calls"] = float(calls)
        metrics["train/tokens_sent"] = float(sum(d.num_tokens for d in datums))
        metrics["train/update_skipped"] = float(not datums)
        if config.max_steps_off_policy or stale:
            metrics.update(off_policy_metrics(staleness, config.max_steps_off_policy, len(trajectories),
                                              discarded=len(trajectories) if stale else 0,
                                              in_flight=self.pipeline.in_flight))
        stats = getattr(self.search, "stats", None)
        if stats is not None and hasattr(stats, "drain"):
            metrics.update(stats.drain())
        metrics["time/rollout_seconds"] = rollout.seconds
        metrics["time/rollout_wait_seconds"] = waited
        metrics["time/train_seconds"] = time.perf_counter() - train_started
        metrics["time/step_seconds"] = time.perf_counter() - started
        return StepResult(metrics, trajectories)

    async def _update(self, datums: list[TrainingDatum], micro_batches: list[list[TrainingDatum]] | None, *,
                      step: int = 0) -> tuple[list[dict[str, float]], dict[str, float], int]:
        """forward_backward and optim_step per substep on the training client
        (:func:`searchr1.core.update.apply_update`)."""
        return await apply_update(self.training_client, datums, micro_batches, self.config, step=step)

    async def _kl_penalty(self, datums: list[TrainingDatum]) -> tuple[list[TrainingDatum], dict[str, float]]:
        """--kl-coef: the base model's logprobs of every datum, the penalty in its advantages (searchr1.core.kl)."""
        if self._base_penalty is None:  # one base sampler per run (and per resume)
            self._base_penalty = BaseModelPenalty(self.service, self.config)
        return await self._base_penalty.apply(datums)

    def _cursor_after(self, completed: int) -> int:
        """The data cursor once ``completed`` steps are done (dynamic sampling moves it by each draw)."""
        if self.config.dynamic_sampling and self.pipeline is not None:
            return self.pipeline.cursor
        return completed * self.config.questions_per_batch

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
            "cursor": self._cursor_after(completed),
            "state_path": state.path,
            "weights_path": weights.path,
            # samplers of the batches in flight (off-policy runs): a resume redoes them exactly
            "sampler_paths": {str(v): self.sampler_paths[v] for v in sorted(
                versions_to_record(completed, self.config.max_steps_off_policy))
                if v in self.sampler_paths},
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
        self.pipeline = RolloutPipeline(
            config, training_client=self.training_client, tokenizer=self.tokenizer, search=self.search,
            examples=self.examples, reporter=self.reporter, session=self.session, sampler_paths=self.sampler_paths,
            weights_version=first, cursor=self.first_cursor)
        guard = CollapseGuard(configured_rules(config.health_rules), stop_after=config.stop_on_collapse,
                              history=self.run.metrics())
        self.reporter.start(config.max_steps, first)
        completed = first
        try:
            for step in range(first, config.max_steps):
                result = await self.step(step)
                completed = step + 1
                verdict = guard.observe(result.metrics)
                result.metrics.update(verdict.metrics())
                if verdict.unhealthy:  # texts: in metrics.jsonl, not on the dashboards (numbers only)
                    result.metrics["health/warnings"] = verdict.warnings()  # type: ignore[assignment]
                    self.reporter.note(f"warning: step {step} unhealthy: {'; '.join(verdict.warnings())}. "
                                       f"What the model did: python cli.py show {self.run.path} --step {step}")
                self._record(step, result)
                stopping = self.stop_requested and completed < config.max_steps
                if stopping:
                    self.pipeline.drop_from(completed)  # in flight; redone exactly on resume
                if (config.save_every and completed % config.save_every == 0) or stopping:
                    await self.save(completed)
                self.run.write_state({
                    "step": completed,
                    "cursor": self._cursor_after(completed),
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
            self.pipeline.close()
            self.reporter.close()
        return completed

    def _record(self, step: int, result: StepResult) -> None:
        """A finished step on disk (metrics line, transcripts), then in the dashboards and on screen."""
        self.run.append_metrics({"step": step, **result.metrics})
        if self.config.transcripts_per_step:
            chosen = select_transcripts(result.trajectories, self.config.transcripts_per_step)
            append_transcripts(self.run.path, step, [transcript_record(t, step) for t in chosen])
        if self.logger is not None:
            self.logger.log(step, result.metrics)
        self.reporter.end_step(step, result.metrics)

    async def _stop_on_collapse(self, completed: int, streak: int) -> None:
        """Save what the run has, then raise :class:`CollapseDetected` naming the last healthy
        checkpoint and the command that restarts from it."""
        assert self.pipeline is not None
        self.pipeline.drop_from(completed)
        if self.last_saved_step != completed:
            await self.save(completed)
        self.run.write_state({**self.run.state(), "last_checkpoint": self.last_saved_step})
        healthy = last_healthy_checkpoint(self.run.checkpoints(), self.run.metrics(), before_step=completed - streak,
                                          max_steps_off_policy=self.config.max_steps_off_policy)
        message, restart = collapse_report(self.run.path, completed=completed, streak=streak,
                                           stop_on_collapse=self.config.stop_on_collapse, healthy=healthy)
        raise CollapseDetected(message, step=completed, run_dir=str(self.run.path), restart_step=restart)
