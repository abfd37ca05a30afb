"""Partial rollouts (``--partial-rollouts``): trajectories in flight move on to newer samplers, and
a step does not wait for the long tail of its own batch.

With ``--max-steps-off-policy K``, turn quantum ``T`` (``--turns-per-version``) and staleness
bound ``S`` (``--max-version-lag``), a trajectory of batch ``b`` takes turn ``j`` on the sampler of
version ``turn_version(b, j) = max(0, b - K + j // T)``, waiting for that sampler when training
has not published it yet. Each group (the ``group_size`` trajectories of one question) is trained
by step ``training_step(b, j) = b + j // T``, ``j`` the last turn any of its trajectories asked
for: a group that ends within T turns is trained by its own step (the bounded schedule exactly),
a longer one by a later step, which takes it beside that step's own batch. A trajectory ends on
its turn budget after ``(S - K + 1) * T`` turns, so its oldest turn lags the step that trains it
by at most ``S`` versions. All of it follows from indices and from each group's own turn counts, never from timing:
a resume rolls out again every batch that may hold a group not yet trained
(:func:`~searchr1.training.off_policy.batches_to_redo`), on the samplers recorded with the
checkpoint, and trains exactly the groups the uninterrupted run trained after it.

No deadlock: step ``s`` waits for a group of batch ``b <= s`` only until it ends or asks for a turn
of quantum ``s - b + 1``, on version at most ``max(0, s - K + 1) <= s``: published before step
``s`` started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from searchr1.core.protocol import template_boundaries
from searchr1.core.rollout import BatchRollout, SamplerFailureError, TurnSampler
from searchr1.core.trainer import RolloutBatch
from searchr1.core.tools import ToolBackend
from searchr1.core.types import SamplingClient, SearchExample, Termination, Tokenizer, Trajectory
from searchr1.run.usage import MeteredSampler, MeteredSearch, Usage, metered_tools
from searchr1.search.tool import SearchBackend, with_search
from searchr1.training.config import TrainConfig
from searchr1.training.off_policy import (
    batches_in_flight,
    batches_to_redo,
    partial_metrics,
    sampler_version,
    training_step,
    turn_cap,
    turn_version,
)



class Pipeline(Protocol):
    """What partial rollouts use of their :class:`~searchr1.training.pipeline.RolloutPipeline`."""

    config: TrainConfig
    tokenizer: Tokenizer
    search: SearchBackend
    tools: dict[str, ToolBackend]
    questions: Callable[[int], list[SearchExample]]
    sampling_slots: asyncio.Semaphore
    weights_version: int

    def progress_of(self, batch_index: int) -> Callable[[int], None]: ...

    def usable_version(self, version: int) -> int: ...

    def sampler(self, version: int) -> asyncio.Future[tuple[SamplingClient, int]]: ...

    def add_usage(self, step: int, usage: Usage) -> None: ...


@dataclass
class Group:
    """One question's trajectories of one batch, rolling out: the last turn its trajectories asked
    for (the logical clock that decides which step trains it) and its task."""

    batch_index: int
    question_index: int
    turns_per_version: int
    last_turn: int = 0
    task: asyncio.Future[list[Trajectory]] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def ended(self, _: asyncio.Future[list[Trajectory]]) -> None:
        self.changed.set()

    def reach(self, turn: int) -> None:
        if turn > self.last_turn:
            self.last_turn = turn
            self.changed.set()

    async def trained_by(self, step: int) -> int | None:
        """The step that trains this group once that is known to be ``step`` or earlier (it has
        ended), or None as soon as it is known to be later (it asked for a later quantum's turn)."""
        while True:
            trained = training_step(self.batch_index, self.last_turn, self.turns_per_version)
            if trained > step:
                return None
            assert self.task is not None
            if self.task.done():
                self.task.result()  # a failure that is no sampler's propagates
                return trained
            self.changed.clear()
            await self.changed.wait()


@dataclass
class BatchLedger:
    """What one launched batch still owes: its groups not yet trained, the latest step that
    trained one, and its usage (counted by the step that trains its last group)."""

    usage: Usage
    groups_left: int
    last_step: int = -1


class PartialRollouts:
    """The groups of the launched batches and the steps that train them, for one rollout pipeline
    (its samplers, questions and tools)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        config = pipeline.config
        self.k, self.t, self.s = config.max_steps_off_policy, config.turns_per_version, config.max_version_lag
        cap = turn_cap(self.k, self.t, self.s)
        turns = min(cap, config.rollout.max_assistant_turns)
        self.budgets = dataclasses.replace(config.rollout, max_assistant_turns=turns)
        self.cap = cap if cap < config.rollout.max_assistant_turns else None  # the bound binds below the budget
        self.groups: dict[tuple[int, int], Group] = {}
        self.ledgers: dict[int, BatchLedger] = {}
        self.tasks: dict[int, list[asyncio.Future[list[Trajectory]]]] = {}
        self.first_step: int | None = None
        self._published: asyncio.Future[None] | None = None

    @property
    def in_flight(self) -> int:
        """Launched batches with a group not yet trained."""
        return len(self.ledgers)

    # -- launching ---------------------------------------------------------------------------

    def launch(self, step: int) -> None:
        """Launch what step ``step`` may have in flight: after a resume, first the earlier batches
        that may hold a group trained from here on; then batches ``step .. step + K``."""
        pipeline = self.pipeline
        if self.first_step is None:
            self.first_step = step
            for index in batches_to_redo(step, self.k, self.s):
                self._launch(index)
        for index in batches_in_flight(step, pipeline.config.max_steps, self.k):
            if index not in self.ledgers and index >= step and index not in self.tasks:
                self._launch(index)

    def _launch(self, index: int) -> None:
        pipeline, config = self.pipeline, self.pipeline.config
        questions = pipeline.questions(index)  # drawn in batch order, before it rolls out
        usage = Usage()
        wanted = sampler_version(index, self.k)
        usage.weight_saves = int(index == (0 if wanted == 0 else wanted + self.k))  # as the bounded pipeline counts
        self.ledgers[index] = BatchLedger(usage, len(questions))
        search = with_search(MeteredSearch(pipeline.search, usage), metered_tools(pipeline.tools, usage))
        template_boundaries(pipeline.tokenizer, thinking=config.rollout.thinking)  # once, before any task
        rollout = BatchRollout(_NO_SAMPLER, pipeline.tokenizer, search, budgets=self.budgets, runtime=config.rollout,
                               step=index, progress=pipeline.progress_of(index),
                               sampling_slots=pipeline.sampling_slots, turn_sampler=self._turn_sampler(index, usage))
        tasks: list[asyncio.Future[list[Trajectory]]] = []
        for question_index, example in enumerate(questions):
            group = Group(index, question_index, self.t)
            group.task = asyncio.ensure_future(rollout.run_question(question_index, example))
            group.task.add_done_callback(group.ended)
            self.groups[(index, question_index)] = group
            tasks.append(group.task)
        self.tasks[index] = tasks

    def _turn_sampler(self, batch_index: int, usage: Usage) -> TurnSampler:
        async def sampler_of(trajectory: Trajectory, turn: int) -> tuple[SamplingClient, int]:
            group = self.groups.get((batch_index, trajectory.question_index))
            if group is None:  # dropped (a stop, the end of the run) while this trajectory was running
                raise asyncio.CancelledError
            group.reach(turn)
            version = self.pipeline.usable_version(turn_version(batch_index, turn, self.k, self.t))
            while version > self.pipeline.weights_version or version >= self.pipeline.config.max_steps:
                await self.publication()  # training has not made it yet (past max_steps: never)
            sampler, version = await self.pipeline.sampler(version)
            return MeteredSampler(sampler, usage), version

        return sampler_of

    def publication(self) -> asyncio.Future[None]:
        """A future that resolves when the next weights version is published."""
        if self._published is None or self._published.done():
            self._published = asyncio.get_running_loop().create_future()
        return self._published

    def published(self) -> None:
        if self._published is not None and not self._published.done():
            self._published.set_result(None)

    # -- a step's batch ------------------------------------------------------------------------

    async def batch(self, step: int) -> RolloutBatch:
        """The groups step ``step`` trains: its own batch's that ended within their quanta and the
        earlier batches' whose last quantum lands here, numbered ``(step - b) * Q + q`` so that no
        two share a question index; groups a resume rolled out again that an earlier step trained
        are left out."""
        started = time.perf_counter()
        self.launch(step)
        taken: list[Group] = []
        for key in sorted(self.groups):
            group = self.groups[key]
            if group.batch_index > step:
                continue
            trained = await group.trained_by(step)
            if trained is None:
                continue
            del self.groups[key]
            if trained == step:
                taken.append(group)
            self._settle(group.batch_index, trained, step)
        size = self.pipeline.config.questions_per_batch
        taken.sort(key=lambda g: ((step - g.batch_index) * size + g.question_index))
        trajectories: list[Trajectory] = []
        for group in taken:
            assert group.task is not None
            for trajectory in group.task.result():
                trajectory.question_index = (step - group.batch_index) * size + group.question_index
                trajectories.append(trajectory)
        self._check_failures(trajectories)
        metrics = partial_metrics(step, [[turn.sampler for turn in t.turns] for t in trajectories],
                                  carried=sum(g.batch_index < step for g in taken),
                                  cut=sum(self._cut(t) for t in trajectories), in_flight=self.in_flight,
                                  max_version_lag=self.s)
        oldest = min((turn.sampler for t in trajectories for turn in t.turns), default=sampler_version(step, self.k))
        return RolloutBatch(step, oldest, trajectories, time.perf_counter() - started, metrics)

    def _settle(self, batch_index: int, trained: int, step: int) -> None:
        """One more group of ``batch_index`` is resolved: when it was the last, the batch's usage
        counts with this step if this step trained one of its groups (else a run before the
        resume counted it)."""
        ledger = self.ledgers[batch_index]
        ledger.groups_left -= 1
        ledger.last_step = max(ledger.last_step, trained)
        if ledger.groups_left:
            return
        del self.ledgers[batch_index]
        self.tasks.pop(batch_index, None)
        if ledger.last_step == step:
            self.pipeline.add_usage(step, ledger.usage)

    def _cut(self, trajectory: Trajectory) -> bool:
        return (self.cap is not None and trajectory.termination == Termination.TURN_BUDGET
                and len(trajectory.turns) >= self.cap)

    def _check_failures(self, trajectories: Sequence[Trajectory]) -> None:
        failed = sum(t.sampler_error for t in trajectories)
        fraction = self.pipeline.config.rollout.max_sampler_failure_fraction
        if trajectories and failed / len(trajectories) > fraction:
            raise SamplerFailureError(f"{failed} of {len(trajectories)} trajectories could not be sampled (more than "
                                      f"max_sampler_failure_fraction={fraction}); the sampling service looks unhealthy")

    def drop_all(self) -> int:
        """Cancel the groups of every launched batch (a stop or the end of the run: a resume redoes
        those it needs); returns how many were still running."""
        dropped = 0
        for index in sorted(self.tasks):
            for task in self.tasks.pop(index):
                dropped += not task.done()
                task.cancel()
        self.groups.clear()
        self.ledgers.clear()
        return dropped


class _NoSampler:
    """The default sampler of a partial rollout's batch, never asked: each turn has its own."""

    async def sample_async(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError("a partial rollout samples each turn on its own sampler")


_NO_SAMPLER: SamplingClient = _NoSampler()

