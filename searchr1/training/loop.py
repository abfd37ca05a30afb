"""The run loop around the core's step: steps ``[start, max_steps)`` of one run, each one on disk
before the next starts.

Per step: the core's :meth:`~searchr1.core.trainer.Trainer.step` (its batch from the rollout
pipeline, :mod:`searchr1.training.pipeline`), then its metrics line
(:func:`searchr1.training.step_metrics.step_metrics`), the collapse guard's verdict
(:mod:`searchr1.health.rules`), the transcripts, a checkpoint when one is due, and the run state.

Before the first step, :meth:`TrainingRun.connect` checks the chat template, creates the training
client and checks the service's tokenizer (:mod:`searchr1.runtime.preflight`): nothing is sampled
before the run can finish a step.

Failures. A finished step is on disk before the next one starts. A broken training client,
a failed event, too many sampler failures or Ctrl-C stop the run with :class:`TrainingStopped`,
whose message says how to resume; ``--resume`` restarts at the last checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from searchr1.training.config import TrainConfig
from searchr1.core.datum import NonFiniteValues, TrainingDatum
from searchr1.runtime.failures import describe_failure, is_service_failure
from searchr1.run.reporting import MetricsLogger, Reporter, SilentReporter
from searchr1.core.rollout import SamplerFailureError
from searchr1.core.tools import ToolBackend
from searchr1.core.trainer import MicroBatcher, StepRecord, Trainer
from searchr1.core.types import SearchExample, ServiceClient
from searchr1.search.tool import SearchBackend
from searchr1.training.step_metrics import step_metrics
from searchr1.health.rules import CollapseGuard, collapse_report, configured_rules, last_healthy_checkpoint
from searchr1.run.directory import ResumePoint, RunDir
from searchr1.evaluation.numbers import int_of
from searchr1.evaluation.transcripts import append_transcripts, select_transcripts, transcript_record
from searchr1.runtime.preflight import PreflightError, check_service_tokenizer, check_template
from searchr1.runtime.tokenizer import Qwen35Tokenizer
from searchr1.training.base_model import BaseModelPenalty
from searchr1.training.judging import AnswerJudge
from searchr1.evaluation.judge import Judge
from searchr1.training.checkpoints import checkpoint_name, save_checkpoint
from searchr1.training.curriculum import CurriculumRecord, curriculum_of, group_outcomes, question_metrics
from searchr1.evaluation.probe import read_probe
from searchr1.training.off_policy import off_policy_metrics, partial_versions_to_record, versions_to_record
from searchr1.training.packing import pack_micro_batches, weight_micro_batch_for_global_mean
from searchr1.training.pipeline import RolloutPipeline
from searchr1.run.costs import BudgetReached, BudgetVerdict, RunAccount
from searchr1.run.usage import Usage, count_update
from searchr1.basics.wording import plural
from searchr1.basics import invocation


class TrainingStopped(RuntimeError):
    """The run stopped before ``max_steps``; every finished step is saved."""

    def __init__(self, message: str, *, step: int, run_dir: str) -> None:
        super().__init__(f"{message}\nFinished steps are saved in {run_dir}; resume with: "
                         + invocation.command(f"train --resume {run_dir}"))
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


def manual_micro_batches(config: TrainConfig) -> MicroBatcher:
    """``--accumulation manual``: the lab port's first-fit-decreasing micro-batches, each datum's
    advantages scaled by n_k/N (N: the datums sent)."""

    def cut(datums: list[TrainingDatum]) -> list[list[TrainingDatum]]:
        batches = pack_micro_batches(datums, max_datum_tokens=config.rollout.window,
                                     max_items=config.max_micro_batch_items,
                                     max_padded_tokens=config.max_micro_batch_padded_tokens)
        return [weight_micro_batch_for_global_mean(batch, len(datums)) for batch in batches]

    return cut


class TrainingRun:
    """Runs steps ``[start_step, max_steps)`` of one run against any PyTRIO-shaped service."""

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        *,
        service: ServiceClient,
        tokenizer: Qwen35Tokenizer,
        search: SearchBackend,
        examples: Sequence[SearchExample],
        tools: Mapping[str, ToolBackend] | None = None,
        reporter: Reporter | None = None,
        logger: MetricsLogger | None = None,
        account: RunAccount | None = None,
        judge: Judge | None = None,
    ) -> None:
        if not examples:
            raise ValueError(f"no training examples in {config.data}")
        configured_rules(config.health_rules)  # names a rule that does not exist, before any work
        self.config = config
        self.run = run
        self.search = search
        self.tools = dict(tools or {})
        self.examples = list(examples)
        self.reporter = reporter or SilentReporter()
        self.logger = logger
        self.account = account or RunAccount()  # usage totals, prices and budget (searchr1.run.costs)
        self.base_model = BaseModelPenalty(service, config) if config.kl_coef else None
        self.judge = AnswerJudge(judge) if judge is not None and config.judge_weight else None  # --judge-weight
        self.tokenizer = tokenizer  # the trainer's, checked against the service's on connect
        self.trainer = Trainer(config, service=service, tokenizer=tokenizer,
                               micro_batcher=manual_micro_batches(config) if config.accumulation == "manual" else None,
                               kl_penalty=self.base_model.apply if self.base_model is not None else None,
                               judge=self.judge)
        self.first_step = 0
        self.last_saved_step: int | None = None
        self.session = 0  # how many times this run was resumed (part of checkpoint names)
        self.stop_requested = False
        self.sampler_paths: dict[int, str] = {}  # recorded samplers of in-flight batches (K >= 1)
        self.pipeline: RolloutPipeline | None = None  # made by run_steps, inside the event loop
        # --probe: the pass rates of the training questions; --curriculum: the draw they start
        self.probe = read_probe(config.probe) if config.probe else None
        self.curriculum = curriculum_of(config, self.examples, self.probe)
        self.curriculum_record = CurriculumRecord.of_run(run.path)
        self.first_cursor = 0  # the data cursor at the first step (a resume point's)
        self._connected = False

    # -- set-up ------------------------------------------------------------------------------

    def connect(self, resume: ResumePoint | None) -> int:
        """Create the training client (fresh or from the resume point) and check, before any
        sample is paid for, that the service's tokenizer is the one the protocol was built
        with (:mod:`searchr1.runtime.preflight`). Returns the first step; idempotent."""
        if self._connected:
            return self.first_step
        # before anything that costs money
        check_template(self.trainer.tokenizer, thinking=self.config.rollout.thinking)
        try:
            client = self.trainer.connect(None if resume is None else resume.state_path)
        except Exception as error:
            if not is_service_failure(error):
                raise
            raise PreflightError(f"cannot create the training run: {describe_failure(error)}") from None
        check_service_tokenizer(self.tokenizer, client)
        self._connected = True
        self.last_saved_step = None if resume is None else resume.step
        self.first_step = 0 if resume is None else resume.step
        self.first_cursor = 0 if resume is None else resume.cursor
        self.sampler_paths = {} if resume is None else dict(resume.sampler_paths)
        return self.first_step

    def request_stop(self) -> None:
        """Finish the current step, save a checkpoint and stop (the first Ctrl-C)."""
        self.stop_requested = True

    # -- bookkeeping ---------------------------------------------------------------------------

    def _cursor_after(self, completed: int) -> int:
        """The data cursor once ``completed`` steps are done (dynamic sampling moves it by each draw)."""
        if self.config.dynamic_sampling:
            return self.pipeline.cursor if self.pipeline is not None else self.first_cursor
        return completed * self.config.questions_per_batch

    def _write_state(self, completed: int) -> None:
        """``run_state.json``: where the run stands (the one place it is written)."""
        self.run.write_state({
            "step": completed,
            "cursor": self._cursor_after(completed),
            "seed": self.config.seed,
            "last_checkpoint": self.last_saved_step,
            "max_steps": self.config.max_steps,
            "session": self.session,
        })

    async def save(self, completed: int, *, final: bool = False) -> dict[str, object]:
        name = checkpoint_name(self.config, completed, self.session)
        assert self.trainer.training_client is not None, "connect() first"
        state_path, weights_path = await save_checkpoint(self.trainer.training_client, name)
        entry = {
            "name": name,
            "final": final,
            "step": completed,
            "cursor": self._cursor_after(completed),
            "state_path": state_path,
            "weights_path": weights_path,
            # samplers of the batches in flight (off-policy runs): a resume redoes them exactly
            "sampler_paths": {str(v): self.sampler_paths[v] for v in sorted(self._versions_to_record(completed))
                              if v in self.sampler_paths},
            "time": time.time(),
        }
        self.run.record_checkpoint(entry)
        self.last_saved_step = completed
        self.reporter.note(f"checkpoint {name}: state {state_path}  weights {weights_path}")
        return entry

    def _versions_to_record(self, completed: int) -> set[int]:
        """The samplers a resume from ``completed`` steps needs (the batches it redoes sample on them)."""
        if self.config.partial_rollouts:
            return partial_versions_to_record(completed, self.config.max_version_lag)
        return versions_to_record(completed, self.config.max_steps_off_policy)

    def metrics(self, record: StepRecord) -> dict[str, float]:
        """The step's metrics line: what it produced, the pipeline's state and the search counters."""
        config = self.config
        assert self.pipeline is not None
        metrics = step_metrics(record, config)
        if config.max_steps_off_policy and not config.partial_rollouts:  # partial: the batch's own async/ metrics
            metrics.update(off_policy_metrics(record.step - record.batch.sampler_version, config.max_steps_off_policy,
                                              len(record.trajectories), discarded=0, in_flight=self.pipeline.in_flight))
        if self.probe is not None or self.curriculum is not None:
            metrics.update(question_metrics(record.trajectories, self.probe, config.drop_guessable))
        stats = getattr(self.search, "stats", None)
        if stats is not None and hasattr(stats, "drain"):
            metrics.update(stats.drain())
        return metrics

    def usage(self, record: StepRecord) -> Usage:
        """What the step used: its batch's rollout (sampling, searches, its sampler's save), the
        base model's KL requests, the judge's work and its update (:mod:`searchr1.run.usage`)."""
        assert self.pipeline is not None
        usage = self.pipeline.take_usage(record.step)
        if self.base_model is not None:
            usage.add(self.base_model.take_usage())
        if self.judge is not None:
            usage.add(self.judge.take_usage())
        count_update(usage, record.datums, record.update.calls if record.update is not None else 0,
                     forward_calls=int(record.correction_metrics.get("correction/forward_calls", 0)))
        return usage

    # -- the loop ----------------------------------------------------------------------------

    async def run_steps(self, resume: ResumePoint | None) -> int:
        """Run to ``max_steps`` (or, after :meth:`request_stop`, to the end of the current step,
        then checkpoint); returns the number of completed steps."""
        config = self.config
        first = self._open_session(resume)
        assert self.pipeline is not None
        guard = CollapseGuard(configured_rules(config.health_rules), stop_after=config.stop_on_collapse,
                              history=self.run.metrics())
        self.account.start(self.run.metrics(), first)
        budget = self.account.verdict()
        if budget.stop and first < config.max_steps:  # a resume whose budget is already spent
            self.pipeline.close()
            raise BudgetReached(self.account.stop_message(budget, completed=first, run_dir=str(self.run.path)),
                                step=first, run_dir=str(self.run.path))
        self.reporter.start(config.max_steps, first)
        completed = first
        try:
            for step in range(first, config.max_steps):
                self.reporter.start_step(step, config.questions_per_batch * config.rollout.group_size)
                record = await self.trainer.step(step, self.pipeline)
                metrics = self.metrics(record)
                completed = step + 1
                stopping, budget = await self._end_step(step, record, metrics, guard)
                if stopping:
                    break
            if self.last_saved_step != completed:
                await self.save(completed, final=completed >= config.max_steps)
                self._write_state(completed)
            if budget.stop and completed < config.max_steps and not self.stop_requested:
                raise BudgetReached(self.account.stop_message(budget, completed=completed, run_dir=str(self.run.path)),
                                    step=completed, run_dir=str(self.run.path))
        except Exception as error:
            stopped = self._stopped(error, completed)
            if stopped is None:
                raise
            raise stopped from error
        finally:
            self.pipeline.close()
            self.reporter.close()
        return completed

    def _open_session(self, resume: ResumePoint | None) -> int:
        """Connect, count a resume as a new session, set aside the metrics lines after the resume
        point and make the rollout pipeline. Returns the first step."""
        first = self.connect(resume)
        if resume is not None:
            self.session = int_of(self.run.state().get("session", 0), "session") + 1
            self._write_state(first)
        rewound = self.run.rewind_to(first)
        if rewound:
            self.reporter.note(f"resuming at step {first}: {plural(rewound, 'later metrics line')} moved to "
                               f"metrics.rewound.jsonl")
        assert self.trainer.training_client is not None
        if self.curriculum is not None:
            self.curriculum.outcomes = self.curriculum_record.read_before(first)
        self.pipeline = RolloutPipeline(
            self.config, training_client=self.trainer.training_client, tokenizer=self.trainer.tokenizer,
            search=self.search, tools=self.tools, examples=self.examples, reporter=self.reporter, session=self.session,
            sampler_paths=self.sampler_paths, weights_version=first, cursor=self.first_cursor,
            questions=self.curriculum.batch if self.curriculum is not None else None)
        return first

    async def _end_step(self, step: int, record: StepRecord, metrics: dict[str, float],
                        guard: CollapseGuard) -> tuple[bool, BudgetVerdict]:
        """The end of step ``step``: judged by the collapse guard, charged to the account, recorded,
        checkpointed when one is due (every ``save_every`` steps, and before the run stops early:
        on Ctrl-C or before a step projected to pass the budget), the run state written; a
        collapse stops the run here. Returns whether the run stops after this step, and the
        budget's verdict."""
        config = self.config
        assert self.pipeline is not None
        completed = step + 1
        steps_left = completed < config.max_steps
        periodic = bool(config.save_every and completed % config.save_every == 0)
        verdict = guard.observe(metrics)
        metrics.update(verdict.metrics())
        usage = self.usage(record)
        self.account.add_step(usage)
        budget = self.account.verdict()  # before a step projected to pass the budget, stop
        stopping = (self.stop_requested or budget.stop) and steps_left
        due = periodic or stopping or verdict.stop
        metrics.update(self.account.step_metrics(usage, checkpoint=due or not steps_left))
        warnings = verdict.warnings() if verdict.unhealthy else None  # texts: in metrics.jsonl, not the dashboards
        if warnings is not None:
            self.reporter.note(f"warning: step {step} unhealthy: {'; '.join(warnings)}. "
                               "What the model did: "
                               + invocation.command(f"show {self.run.path} --step {step}"))
        self._record(record, metrics, warnings=warnings)
        stopping = stopping or (self.stop_requested and steps_left)  # Ctrl-C meanwhile
        if stopping:
            self.pipeline.drop_from(completed)  # in flight; redone exactly on resume
        if periodic or stopping:
            await self.save(completed)
        self._write_state(completed)
        if verdict.stop:
            await self._stop_on_collapse(completed, verdict.streak)
        return stopping, budget

    def _stopped(self, error: Exception, completed: int) -> TrainingStopped | None:
        """The :class:`TrainingStopped` that a failure in step ``completed`` becomes (too many
        sampler failures, a non-finite value, the training service failing); None for any other."""
        run_dir = str(self.run.path)
        if isinstance(error, SamplerFailureError):
            return TrainingStopped(f"stopped in step {completed}: {error}", step=completed, run_dir=run_dir)
        if isinstance(error, NonFiniteValues):
            return TrainingStopped(f"stopped in step {completed}: a non-finite value: {error}", step=completed,
                                   run_dir=run_dir)
        if not is_service_failure(error):
            return None
        return TrainingStopped(f"stopped in step {completed}: the training service failed ({describe_failure(error)})",
                               step=completed, run_dir=run_dir)

    def _record(self, record: StepRecord, metrics: dict[str, float], *, warnings: list[str] | None = None) -> None:
        """A finished step on disk (metrics line, transcripts), then in the dashboards and on screen.
        An unhealthy step's ``warnings`` (texts) end its metrics line, and only there: the
        dashboards take numbers."""
        step = record.step
        if self.curriculum is not None:  # before the metrics line: a resume replays what it finds
            outcomes = group_outcomes(record.trajectories)
            self.curriculum.record(step, outcomes)
            self.curriculum_record.append(step, outcomes)
        texts = {"health/warnings": warnings} if warnings is not None else {}
        self.run.append_metrics({"step": step, **metrics, **texts})
        if self.config.transcripts_per_step:
            chosen = select_transcripts(record.trajectories, self.config.transcripts_per_step)
            append_transcripts(self.run.path, step, [transcript_record(t, step) for t in chosen])
        if self.logger is not None:
            self.logger.log(step, metrics)
        self.reporter.end_step(step, metrics)

    async def _stop_on_collapse(self, completed: int, streak: int) -> None:
        """Save what the run has, then raise :class:`CollapseDetected` naming the last healthy
        checkpoint and the command that restarts from it."""
        assert self.pipeline is not None
        self.pipeline.drop_from(completed)
        if self.last_saved_step != completed:
            await self.save(completed)
        self._write_state(completed)
        healthy = last_healthy_checkpoint(self.run.checkpoints(), self.run.metrics(), before_step=completed - streak,
                                          max_steps_off_policy=self.config.max_steps_off_policy)
        message, restart = collapse_report(self.run.path, completed=completed, streak=streak,
                                           stop_on_collapse=self.config.stop_on_collapse, healthy=healthy)
        raise CollapseDetected(message, step=completed, run_dir=str(self.run.path), restart_step=restart)
