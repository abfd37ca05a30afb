"""The rollout pipeline of a training run: where each step's batch comes from. On-policy, it is
the core's own source (:class:`searchr1.core.trainer.OnPolicy`), metered for usage and progress;
the alternatives this module plugs in are the off-policy schedule and dynamic sampling: one
sampler per weights version, one rollout per batch, launched ahead of training as
:mod:`searchr1.training.off_policy` schedules them.

With ``--max-steps-off-policy K`` the batches of steps ``b .. b + K`` may be rolling out while
step ``b`` waits for its own; each batch samples on the weights after ``sampler_version(b, K)``
finished steps. Which questions, seeds and weights a batch uses depend on its index alone, so a
resumed run redoes its in-flight batches exactly (the samplers of K >= 1 are saved under a name
of the run and recorded with each checkpoint). The sampler of version ``v`` is saved before step
``v`` updates the weights (:meth:`RolloutPipeline.before_update` waits for it), so it holds the
weights after ``v`` steps however the steps and rollouts interleave; a step that skips its
update (every group degenerate) changes nothing about that. With ``--dynamic-sampling``
(on-policy only) a batch draws questions at the data cursor until enough groups carry a signal,
and the cursor, recorded with each checkpoint, says where the next batch starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from searchr1.data.dataset import take_batch
from searchr1.core.types import (
    SamplingClient,
    SearchExample,
    Tokenizer,
    TrainingClient,
    Trajectory,
)
from searchr1.training.checkpoints import checkpoint_name
from searchr1.training.off_policy import batches_in_flight, sampler_version, step_batch
from searchr1.run.reporting import Reporter
from searchr1.core.reward import score_trajectories
from searchr1.core.rollout import rollout_batch_async
from searchr1.search.tool import SearchBackend, with_search
from searchr1.core.tools import ToolBackend
from searchr1.core.trainer import OnPolicy, RolloutBatch
from searchr1.training.config import TrainConfig
from searchr1.training.partial import PartialRollouts
from searchr1.run.usage import MeteredSampler, MeteredSearch, Usage, metered_tools

SAMPLER_TTL_SECONDS = 24 * 3600  # named samplers of off-policy runs (resume reuses them)


class BatchProgress:
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


class RolloutPipeline:
    """Samplers (a task per weights version) and rollouts (a task per batch index) of one run."""

    def __init__(self, config: TrainConfig, *, training_client: TrainingClient, tokenizer: Tokenizer,
                 search: SearchBackend,
                 examples: Sequence[SearchExample], reporter: Reporter, session: int,
                 sampler_paths: dict[int, str], weights_version: int, cursor: int = 0,
                 tools: Mapping[str, ToolBackend] | None = None,
                 questions: Callable[[int], list[SearchExample]] | None = None) -> None:
        self.config = config
        self.training_client = training_client
        self.tokenizer = tokenizer
        self.search = search
        self.tools = dict(tools or {})  # the declared tools other than search, by name
        self.examples = examples
        # the questions of each batch: the data's next run of them, or the curriculum's draw
        self.questions = questions or (lambda index: step_batch(examples, index, config.questions_per_batch))
        self.reporter = reporter
        self.session = session  # part of the samplers' names (checkpoint naming)
        self.sampler_paths = sampler_paths  # version -> saved sampler path (K >= 1; recorded with checkpoints)
        self.weights_version = weights_version  # finished steps of the training client's current weights
        self.first_version = weights_version  # the checkpoint's (or the base) weights: nothing older can be saved
        self.cursor = cursor  # data cursor after the rolled-out batches (moved only by dynamic sampling)
        self.progress = BatchProgress(reporter)
        self._samplers: dict[int, asyncio.Future[tuple[SamplingClient, int]]] = {}
        self._rollouts: dict[int, asyncio.Future[RolloutBatch]] = {}
        self._drawn: dict[int, list[SearchExample]] = {}  # each launched batch's questions
        self._usage: dict[int, Usage] = {}  # each rolled-out batch's usage, until its step takes it
        self.sampling_slots = asyncio.Semaphore(config.rollout.sampling_concurrency)  # one cap for all batches
        # On-policy without dynamic sampling, each batch comes from the core's own source, watched
        # for usage and progress; otherwise from this pipeline's samplers and rollouts.
        self.on_policy: OnPolicy | None = None
        # --partial-rollouts: groups, not batches, and each turn on its own sampler (searchr1.training.partial)
        self.partial = PartialRollouts(self) if config.partial_rollouts else None
        if config.max_steps_off_policy == 0 and not config.dynamic_sampling:
            self.on_policy = OnPolicy(training_client, tokenizer, with_search(search, self.tools),
                                      self.questions,
                                      config.rollout, watch=self._watch, sampling_slots=self.sampling_slots)
        moved = [b for b in batches_in_flight(weights_version, config.max_steps, config.max_steps_off_policy)
                 if self.version_for(b) != sampler_version(b, config.max_steps_off_policy)]
        if moved:
            reporter.note(f"the checkpoint of step {weights_version} records no sampler for the weights batches "
                          f"{moved[0]}..{moved[-1]} would sample on (a restart with a larger "
                          "--max-steps-off-policy): they sample on the checkpoint's weights")

    @property
    def in_flight(self) -> int:
        return self.partial.in_flight if self.partial is not None else len(self._rollouts)

    async def batch(self, step: int) -> RolloutBatch:
        """Launch the batches the schedule allows while ``step`` waits, and wait for its own."""
        self.progress.focus(step)
        if self.on_policy is not None:
            return await self.on_policy.batch(step)
        if self.partial is not None:
            return await self.partial.batch(step)
        for index in batches_in_flight(step, self.config.max_steps, self.config.max_steps_off_policy):
            if index not in self._rollouts:
                if not self.config.dynamic_sampling:
                    self._drawn[index] = self.questions(index)  # drawn in batch order, before it rolls out
                self._rollouts[index] = asyncio.ensure_future(self._roll_out(index))
        return await self._rollouts.pop(step)

    async def before_update(self, step: int) -> None:
        """Step ``step`` is about to change the weights (or to skip its update): with K >= 1
        the sampler of version ``step`` is saved first and waited for. Later batches, and the
        batches a resume from any checkpoint up to ``max_steps`` redoes, sample on it, so it
        is saved even when this run's own batches no longer need it."""
        if step != self.weights_version:
            raise RuntimeError(f"step {step} updates the weights after {self.weights_version} steps")
        if self.config.max_steps_off_policy and step not in self.sampler_paths:
            await self._sampler(step)

    def weights_updated(self, step: int) -> None:
        """Step ``step`` updated the weights: start saving the sampler a later batch will need
        (it overlaps with the step's bookkeeping; :meth:`before_update` of the next step waits
        for it)."""
        self.weights_version = step + 1
        if self.on_policy is None and step + 1 < self.config.max_steps:
            self._sampler(step + 1)
        if self.partial is not None:
            self.partial.published()  # turns waiting for this version go on

    def version_for(self, batch_index: int) -> int:
        """The weights version batch ``batch_index`` samples on: ``sampler_version(b, K)``,
        except for the batches of a resumed run whose version lies before the checkpoint and
        was not recorded with it (a restart with a larger --max-steps-off-policy): those sample
        on the checkpoint's weights. Both depend on the step index and the checkpoint alone."""
        return self.usable_version(sampler_version(batch_index, self.config.max_steps_off_policy))

    def usable_version(self, version: int) -> int:
        """``version``, or the checkpoint's weights for a version before them that the checkpoint
        does not record (:meth:`version_for`)."""
        if version < self.first_version and version not in self.sampler_paths:
            return self.first_version
        return version

    def drop_from(self, first_batch: int) -> int:
        """Cancel rollouts of batches ``>= first_batch`` (a stop or the end of the run); returns
        how many were still running."""
        dropped = self.partial.drop_all() if self.partial is not None else 0
        for index in sorted(self._rollouts):
            if index >= first_batch:
                self._drawn.pop(index, None)
                task = self._rollouts.pop(index)
                dropped += not task.done()
                task.cancel()
        return dropped

    def close(self) -> None:
        self.drop_from(0)
        for task in self._samplers.values():
            task.cancel()

    # -- samplers (one per weights version) ------------------------------------------------------

    def progress_of(self, batch_index: int) -> Callable[[int], None]:
        """What to tell as each trajectory of batch ``batch_index`` ends."""
        return self.progress.callback(batch_index)

    def sampler(self, version: int) -> asyncio.Future[tuple[SamplingClient, int]]:
        """The sampler of version ``version`` (made once; see :meth:`_sampler`)."""
        return self._sampler(version)

    def _sampler(self, version: int) -> asyncio.Future[tuple[SamplingClient, int]]:
        """The sampling client on the weights after ``version`` finished steps (a task, made
        once per version). On-policy (K=0) it is PyTRIO's temporary sampler; with K >= 1 the
        weights are saved under a name of this run, so that a resumed run can roll out its
        in-flight batches on exactly the weights the uninterrupted run used."""
        if version not in self._samplers:
            self._samplers[version] = asyncio.ensure_future(self._make_sampler(version))
        return self._samplers[version]

    async def _make_sampler(self, version: int) -> tuple[SamplingClient, int]:
        """The sampler of version ``version`` and that version. A version saved by this run or
        recorded with the checkpoint is opened by its path; otherwise it is the current
        weights, which by construction hold exactly ``version`` steps (the task starts no later
        than the step that would change them, :meth:`before_update`)."""
        client = self.training_client
        if version in self.sampler_paths:  # recorded before a resume
            return await client.create_sampling_client_async(self.sampler_paths[version]), version
        if version != self.weights_version:
            raise RuntimeError(f"the sampler of version {version} is made while the weights hold "
                               f"{self.weights_version} steps")
        if self.config.max_steps_off_policy == 0:
            return await client.save_weights_and_get_sampling_client_async(), version
        name = f"{checkpoint_name(self.config, version, self.session)}-sampler"
        saved = await (await client.save_weights_for_sampler_async(name=name, ttl_seconds=SAMPLER_TTL_SECONDS))
        self.sampler_paths[version] = saved.path
        return await client.create_sampling_client_async(saved.path), version

    # -- rollouts ------------------------------------------------------------------------------

    def _watch(self, batch_index: int, sampler: SamplingClient,
               tools: Mapping[str, ToolBackend]) -> tuple[SamplingClient, dict[str, ToolBackend], Callable[[int],
                                                                                                           None]]:
        """An on-policy batch as this run meters it: its sampler, search and other tools counted
        into the batch's usage (with the save of the weights it samples on), and its progress."""
        usage = Usage()
        usage.weight_saves = 1  # each on-policy batch saves the weights it samples on
        self._usage[batch_index] = usage
        metered = with_search(MeteredSearch(self.search, usage), metered_tools(self.tools, usage))
        return MeteredSampler(sampler, usage), metered, self.progress.callback(batch_index)

    async def _roll_out(self, batch_index: int) -> RolloutBatch:
        """Roll out the batch trained in step ``batch_index``, on the sampler of
        ``sampler_version(batch_index, K)``: seeds, questions and weights are fixed by the
        step index alone, whenever the rollout actually runs."""
        config = self.config
        sampler, version = await self._sampler(self.version_for(batch_index))
        usage = Usage()
        wanted = sampler_version(batch_index, config.max_steps_off_policy)
        # a sampler's save counts with the first batch that samples on it (however many resumes lie between)
        usage.weight_saves = int(batch_index == (0 if wanted == 0 else wanted + config.max_steps_off_policy))
        sampler, search = MeteredSampler(sampler, usage), MeteredSearch(self.search, usage)
        tools = metered_tools(self.tools, usage)
        started = time.perf_counter()
        if config.dynamic_sampling:
            trajectories, surplus, metrics = await self._roll_out_until_signal(sampler, search, tools, batch_index,
                                                                               version)
            batch = RolloutBatch(batch_index, version, trajectories, time.perf_counter() - started, metrics, surplus)
            self._usage[batch_index] = usage
            return batch
        questions = self._drawn.pop(batch_index)
        trajectories = await rollout_batch_async(
            sampler, self.tokenizer, with_search(search, tools), questions, config.rollout,
            self.progress.callback(batch_index), step=batch_index, sampling_slots=self.sampling_slots,
            sampler_version=version,
        )
        self._usage[batch_index] = usage
        return RolloutBatch(batch_index, version, trajectories, time.perf_counter() - started)

    def add_usage(self, step: int, usage: Usage) -> None:
        """Count ``usage`` with step ``step`` (partial rollouts: a batch whose last group it trains)."""
        self._usage.setdefault(step, Usage()).add(usage)

    def take_usage(self, batch_index: int) -> Usage:
        """What rolling out batch ``batch_index`` used (its sampling, searches and the save of its
        sampler), once: the step that trains the batch counts it (:mod:`searchr1.run.usage`)."""
        usage = self._usage.pop(batch_index, Usage())
        config = self.config
        if batch_index == config.max_steps - 1 and config.max_steps_off_policy:
            # the samplers saved for versions no batch of the run samples on (a longer resume could)
            usage.weight_saves += len(range(max(1, config.max_steps - config.max_steps_off_policy), config.max_steps))
        return usage

    async def _roll_out_until_signal(self, sampler: SamplingClient, search: SearchBackend,
                                     tools: Mapping[str, ToolBackend], batch_index: int,
                                     version: int) -> tuple[list[Trajectory], frozenset[int], dict[str, float]]:
        """--dynamic-sampling (searchr1.training.dynamic_sampling): draw batches at the data cursor until
        ``questions_per_batch`` groups carry a signal or the oversampling budget is spent. The
        cursor moves by every batch drawn (on-policy only, so batches never overlap). Each draw
        is scored here to decide whether to draw again (scoring is pure: the step scores the
        batch again before its advantages)."""
        from searchr1.training.dynamic_sampling import signal_groups, surplus_groups

        config = self.config
        size = config.questions_per_batch
        trajectories: list[Trajectory] = []
        draws = 0
        while draws <= config.max_oversample_batches:
            batch = take_batch(self.examples, self.cursor, size)
            drawn = await rollout_batch_async(
                sampler, self.tokenizer, with_search(search, tools), batch, config.rollout,
                self.progress.callback(batch_index), step=batch_index, sampling_slots=self.sampling_slots,
                first_question_index=draws * size, sampler_version=version,
            )
            score_trajectories(drawn, reward=config.reward)
            trajectories += drawn
            self.cursor += size
            draws += 1
            if signal_groups(trajectories, keep_env_failures=config.keep_env_failures) >= size:
                break
        surplus, metrics = surplus_groups(trajectories, size, keep_env_failures=config.keep_env_failures)
        return trajectories, surplus, {**metrics, "dynamic/draws": float(draws)}
