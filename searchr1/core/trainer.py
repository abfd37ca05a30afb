"""One Search-R1 training step on PyTRIO (or its offline twin), in the order the algorithm runs::

    sampler      <- save the weights about to be trained, and a sampling client of them
    trajectories <- the step's questions rolled out on it (sample, parse, call, stitch: core.rollout)
    score        <- the final answer of each against the references (core.reward); with
                    --judge-weight mixed with a judge's verdict (core.shaping)
    advantage    <- reward minus its group's mean, carried by every turn; groups without a signal
                    are left out (core.advantage); --credit gigpo adds each turn's own (core.credit)
    datums       <- one Datum per context of each trajectory that carries signal (core.datum)
    (kl)         <- --kl-coef: the base model's penalty in the advantages (core.kl)
    (correction) <- --correction: one forward call, the learner/sampler ratio in the advantages
                    (core.correction)
    update       <- forward_backward(importance_sampling) -> optim_step(AdamParams), once per
                    --num-substeps mini-batch (core.update)

The first two lines are :class:`OnPolicy`, the lab port's source of batches; the harness may plug in
another :class:`BatchSource` (the off-policy pipeline, dynamic sampling:
:mod:`searchr1.training.pipeline`), with ``--accumulation manual`` how to pack the lab port's weighted
micro-batches, with ``--kl-coef`` the base model's penalty, and with ``--judge-weight`` the judge. A step returns a
:class:`StepRecord`; metrics, health guard, transcripts, checkpoints and the run directory are the
run loop's (:mod:`searchr1.training.loop`).

Accumulation. ``sdk`` (default) sends every datum of the step in ONE ``forward_backward``
call: PyTRIO splits it itself and normalises every chunk by batch-global totals, so the
update is the full-batch one whatever the server's reduction. ``manual`` is the lab port's way:
first-fit-decreasing micro-batches, advantages scaled by n_k/N, one call per micro-batch.
That is exact only if the server averages per sample (the loss-reduction probe tells); N is
the number of datums sent, so both modes agree under a per-sample mean.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from searchr1.core.advantage import GroupSummary, assign_group_advantages
from searchr1.core.config import StepConfig
from searchr1.core.correction import correct
from searchr1.core.credit import Credit, StepReward, assign_step_advantages, assign_step_rewards
from searchr1.core.datum import TrainingDatum, build_training_datums, drop_out_of_vocab
from searchr1.core.reward import score_trajectories
from searchr1.core.shaping import assign_judge_rewards, assign_length_rewards, assign_overlong_penalties
from searchr1.core.rollout import RolloutConfig, rollout_batch_async
from searchr1.core.tools import ToolBackend
from searchr1.core.types import (SamplingClient, SearchExample, ServiceClient, Tokenizer, TrainingClient,
                                 Trajectory)
from searchr1.core.update import MicroBatcher, UpdateConfig, UpdateResult, apply_substeps


@dataclass(frozen=True)
class RolloutBatch:
    """One step's batch, rolled out (possibly while earlier steps trained), not yet scored."""

    batch_index: int
    sampler_version: int  # finished steps of the weights that sampled it
    trajectories: list[Trajectory]
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # dynamic sampling's counters
    surplus_questions: frozenset[int] = frozenset()  # dynamic sampling: groups beyond the batch


class BatchSource(Protocol):
    """Where each step's batch comes from: :class:`OnPolicy`, or the harness's pipeline."""

    async def batch(self, step: int) -> RolloutBatch: ...

    async def before_update(self, step: int) -> None: ...

    def weights_updated(self, step: int) -> None: ...


# The harness's view of one batch (usage metering, progress): the sampling client and the tools
# as it wraps them for step ``step``, and what to tell as each trajectory ends.
Watch = Callable[[int, SamplingClient, Mapping[str, ToolBackend]],
                 tuple[SamplingClient, Mapping[str, ToolBackend], Callable[[int], None] | None]]


class OnPolicy:
    """The lab port's batches: each step's questions are rolled out on the weights that step trains."""

    def __init__(self, training_client: TrainingClient, tokenizer: Tokenizer, tools: Mapping[str, ToolBackend],
                 questions: Callable[[int], Sequence[SearchExample]], rollout: RolloutConfig, *,
                 watch: Watch | None = None, sampling_slots: asyncio.Semaphore | None = None) -> None:
        self.training_client = training_client
        self.tokenizer = tokenizer
        self.tools = tools  # the backend of each declared tool, search among them
        self.questions = questions  # step -> its questions
        self.rollout = rollout
        self.watch = watch
        self.sampling_slots = sampling_slots

    async def batch(self, step: int) -> RolloutBatch:
        """Save the weights about to be trained, make a sampling client of them, and roll out the
        step's questions on it (unscored)."""
        started = time.perf_counter()
        sampling_client = await self.training_client.save_weights_and_get_sampling_client_async()
        tools, progress = self.tools, None
        if self.watch is not None:
            sampling_client, tools, progress = self.watch(step, sampling_client, tools)
        trajectories = await rollout_batch_async(sampling_client, self.tokenizer, tools, self.questions(step),
                                                 self.rollout, progress, step=step, sampler_version=step,
                                                 sampling_slots=self.sampling_slots)
        return RolloutBatch(step, step, trajectories, time.perf_counter() - started)

    async def before_update(self, step: int) -> None:
        """Nothing to wait for: the next step saves the weights it samples on."""

    def weights_updated(self, step: int) -> None:
        """Nothing to start: the next step saves the weights it samples on."""


# --kl-coef: the datums with the base model's penalty in their advantages, and its metrics
KlPenalty = Callable[[list[TrainingDatum]], Awaitable[tuple[list[TrainingDatum], dict[str, float]]]]
# --judge-weight: set the judge's verdict (or why it failed) on each of the trajectories, all answered
JudgeAnswers = Callable[[list[Trajectory]], Awaitable[None]]


@dataclass(frozen=True)
class StepRecord:
    """Everything one step produced, for the metrics (:func:`searchr1.training.step_metrics.step_metrics`)
    and the transcripts."""

    step: int
    batch: RolloutBatch
    groups: GroupSummary
    datums: list[TrainingDatum]
    dropped_out_of_vocab: int
    micro_batches: list[list[TrainingDatum]] | None
    kl_metrics: dict[str, float]
    credit_metrics: dict[str, float]  # --length-reward, --credit gigpo, --step-reward: rewards shaped, turns credited
    update: UpdateResult | None  # None when no datum carried a signal
    waited_seconds: float
    train_seconds: float
    step_seconds: float
    correction_metrics: dict[str, float] = field(default_factory=dict)  # --correction: empty with none

    @property
    def trajectories(self) -> list[Trajectory]:
        return self.batch.trajectories


class Trainer:
    """The training client of one run and the step that updates it, as ``config`` says (a run's
    :class:`~searchr1.training.config.TrainConfig` is a :class:`StepConfig` with the run's settings
    added)."""

    def __init__(self, config: StepConfig, *, service: ServiceClient, tokenizer: Tokenizer,
                 micro_batcher: MicroBatcher | None = None, kl_penalty: KlPenalty | None = None,
                 judge: JudgeAnswers | None = None) -> None:
        if config.judge_weight and judge is None:
            raise ValueError("--judge-weight needs a judge to ask")
        self.config = config
        self.service = service
        self.tokenizer = tokenizer
        self.micro_batcher = micro_batcher  # --accumulation manual: the lab port's weighted micro-batches
        self.kl_penalty = kl_penalty  # --kl-coef: the base model's logprobs (searchr1.training.base_model)
        self.judge = judge  # --judge-weight: the harness's judge (searchr1.training.judging)
        self.training_client: TrainingClient | None = None
        self.update_config = UpdateConfig(config.learning_rate, config.beta1, config.beta2, config.loss_fn,
                                          config.loss_fn_config)

    def connect(self, state_path: str | None = None) -> TrainingClient:
        """Create the LoRA training client, or restore one (optimizer state included) from
        ``state_path``."""
        config = self.config
        if state_path is None:
            client = self.service.create_lora_training_client(base_model=config.base_model, rank=config.lora_rank,
                                                              seed=config.seed, train_mlp=True, train_attn=True,
                                                              train_unembed=config.train_unembed)
        else:
            client = self.service.create_training_client_from_state_with_optimizer(state_path)
        self.training_client = client
        return client

    async def step(self, step: int, batches: BatchSource) -> StepRecord:
        """Train step ``step`` on its batch from ``batches`` and tell them the weights moved."""
        config, client = self.config, self.training_client
        assert client is not None, "connect() first"
        started = time.perf_counter()
        batch = await batches.batch(step)  # sample (OnPolicy: save weights -> sampling client -> rollout)
        waited = time.perf_counter() - started
        trajectories = batch.trajectories
        score_trajectories(trajectories, reward=config.reward)
        credit: dict[str, float] = {}
        if config.judge_weight and self.judge is not None:  # a judge's verdict on each answer, mixed in
            await self.judge([t for t in trajectories if t.score.answer is not None])
            credit |= assign_judge_rewards(trajectories, config.judge_weight)
        if config.length_reward:  # shorter right answers earn more (Kimi k1.5)
            credit |= assign_length_rewards(trajectories, config.length_reward)
        if config.overlong_buffer:  # a trajectory near its budget loses reward (DAPO)
            credit |= assign_overlong_penalties(trajectories, config.rollout.max_trajectory_tokens,
                                                config.overlong_buffer)
        if config.step_reward == StepReward.EVIDENCE:  # what each turn earns on its own
            credit |= assign_step_rewards(trajectories, evidence_bonus=config.evidence_bonus,
                                          repeat_penalty=config.repeat_penalty).metrics()
        groups = assign_group_advantages(trajectories, mode=config.advantage_mode,
                                         keep_env_failures=config.keep_env_failures,
                                         surplus=batch.surplus_questions)
        if config.credit == Credit.GIGPO:  # each turn's advantage among the turns from its state
            credit |= assign_step_advantages(trajectories, mode=config.advantage_mode, weight=config.step_weight,
                                             discount=config.discount).metrics()
        datums = build_training_datums(trajectories, max_tokens=config.rollout.window)
        datums, dropped = drop_out_of_vocab(datums, len(self.tokenizer))
        kl_metrics: dict[str, float] = {}
        if datums and self.kl_penalty is not None:
            datums, kl_metrics = await self.kl_penalty(datums)
        train_started = time.perf_counter()
        update = None
        await batches.before_update(step)  # a later batch's sampler holds the weights before this update
        datums, correction = await correct(client, config.correction_config, datums, loss_fn=config.loss_fn,
                                           loss_fn_config=config.loss_fn_config)
        if datums:
            update = await apply_substeps(client, datums, self.micro_batcher, self.update_config,
                                          num_substeps=config.num_substeps, seed=config.seed, step=step)
        batches.weights_updated(step)  # saving the new weights overlaps with the bookkeeping
        # The micro-batches recorded are the forward_backward calls sent (manual accumulation only).
        micro_batches = (update.sent if update is not None else []) if self.micro_batcher is not None else None
        return StepRecord(step, batch, groups, datums, dropped, micro_batches, kl_metrics, credit, update,
                          waited_seconds=waited, train_seconds=time.perf_counter() - train_started,
                          step_seconds=time.perf_counter() - started, correction_metrics=correction)
