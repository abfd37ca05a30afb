"""One step's weights update: ``--num-substeps N`` mini-batches (default 1), each its own
``forward_backward`` (one call, or one per micro-batch) and ``optim_step``, refusing non-finite
values before the optimiser sees them.

Substeps. The step's datums are put in an order drawn from the run's seed and the step index
(a resumed run repeats it) and divided into N near-equal mini-batches, each one update normalised
by its own totals (``sdk``) or packed into its own weighted micro-batches (``manual``). The first
trains on the weights that sampled it (ratio 1 on-policy), every later one on weights the earlier
updates moved, so the ratio leaves 1 and ppo's and cispo's clipping engages (Search-R1's
mini-batch updates, tinker-cookbook's ``num_substeps``).

The loss is the run's ``--loss-fn`` with its ``--loss-fn-config``, sent as they are; the learner's
logprobs of the trained tokens come back in :class:`UpdateResult` (the sampler-learner mismatch
of every metrics line compares them with the sampler's).
"""

from __future__ import annotations

import math
import random
from statistics import fmean
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from searchr1.core.datum import NonFiniteValues, TrainingDatum
from searchr1.core.objective import DEFAULT_LOSS_FN, LossFn
from searchr1.core.objective import POLICY_LOSS_FNS as POLICY_LOSS_FNS  # importable from here too
from searchr1.core.types import TrainingClient

if TYPE_CHECKING:
    from pytrio.types import Datum, TensorData


# What forward_backward optimises per trained token, each loss as code: searchr1.core.objective.
# --accumulation manual: one mini-batch packed into the lab port's weighted micro-batches, one call each
MicroBatcher = Callable[[list[TrainingDatum]], list[list[TrainingDatum]]]


@dataclass(frozen=True)
class UpdateConfig:
    """What one update needs of a run's settings."""

    learning_rate: float
    beta1: float
    beta2: float
    loss_fn: LossFn = DEFAULT_LOSS_FN
    loss_fn_config: Mapping[str, float | int | str | bool] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainedTokens:
    """One datum's trained positions: the sampler's and the learner's logprobs and the advantages."""

    sampled: np.ndarray
    learned: np.ndarray
    advantages: np.ndarray

    @classmethod
    def of_datum(cls, sampled: Sequence[float], learned: Sequence[float], advantages: Sequence[float]) -> TrainedTokens:
        """Keep the positions with a non-zero advantage (the policy's own, trained tokens)."""
        sampled_array = np.asarray(sampled, dtype=np.float64)
        learned_array = np.asarray(learned, dtype=np.float64)
        advantage_array = np.asarray(advantages, dtype=np.float64)
        if not sampled_array.shape == learned_array.shape == advantage_array.shape:
            raise ValueError(f"logprob and advantage arrays differ in shape: {sampled_array.shape}, "
                             f"{learned_array.shape}, {advantage_array.shape}")
        mask = advantage_array != 0
        return cls(sampled_array[mask], learned_array[mask], advantage_array[mask])


@dataclass(frozen=True)
class UpdateResult:
    """What the service said: each forward_backward call's metrics, the optimiser's, and the
    trained tokens with the learner's logprobs."""

    outputs: list[dict[str, float]]
    optim_metrics: dict[str, float]
    tokens: list[TrainedTokens]
    substep_tokens: list[list[TrainedTokens]] = field(default_factory=list)  # with N > 1, per mini-batch
    sent: list[list[TrainingDatum]] = field(default_factory=list)  # the datums of each forward_backward call

    @property
    def calls(self) -> int:
        return len(self.outputs)


def learner_tokens(data: Sequence[Datum], outputs: Sequence[Mapping[str, TensorData]] | None) -> list[TrainedTokens]:
    """Per datum sent, its trained positions with the sampler's logprobs and the learner's
    (``loss_fn_outputs[i]["logprobs"]``, as pytrio returns them). Datums whose output has no
    logprobs of the same length (a server that returns none) are left out."""
    tokens = []
    for datum, output in zip(data, outputs or ()):
        learned = output.get("logprobs") if hasattr(output, "get") else None
        if learned is None:
            continue
        values = list(getattr(learned, "data", learned))
        sampled = datum.loss_fn_inputs["logprobs"].data
        advantages = datum.loss_fn_inputs["advantages"].data
        if len(values) == len(sampled) == len(advantages):
            tokens.append(TrainedTokens.of_datum(sampled, values, advantages))
    return tokens


def _first_non_finite(values: npt.ArrayLike) -> int | None:
    bad = np.flatnonzero(~np.isfinite(np.asarray(values, dtype=np.float64)))
    return int(bad[0]) if bad.size else None


def non_finite_inputs(datums: Sequence[TrainingDatum]) -> str | None:
    """An advantage that is NaN or infinite (the KL penalty changes them after the datums are
    built, whose logprobs :func:`searchr1.core.datum.datum_arrays` checked), naming the
    trajectory and the position; None when all is finite."""
    for item in datums:
        values = item.datum.loss_fn_inputs["advantages"].data
        position = _first_non_finite(values)
        if position is not None:
            return f"trajectory q{item.question_index}/g{item.group_index}: advantages[{position}] is {values[position]!r}"
    return None


def non_finite_outputs(metrics: Sequence[Mapping[str, float]],
                       learned: Sequence[np.ndarray | Sequence[float] | None]) -> str | None:
    """What is wrong with the ``forward_backward`` results (a loss, or a learner logprob of a
    trained position, that is NaN or infinite); None when all is finite."""
    for call, values in enumerate(metrics):
        for key in sorted(values):
            value = values[key]
            if isinstance(value, (int, float)) and not math.isfinite(value):
                return f"forward_backward call {call + 1} returned {key} = {value!r}"
    for index, logprobs in enumerate(learned):
        position = None if logprobs is None else _first_non_finite(logprobs)
        if logprobs is not None and position is not None:
            return f"forward_backward returned logprobs[{position}] = {float(logprobs[position])!r} for datum {index}"
    return None


async def apply_update(client: TrainingClient, calls: Sequence[Sequence[TrainingDatum]],
                       config: UpdateConfig) -> UpdateResult:
    """One ``forward_backward`` per entry of ``calls`` (one call with every datum by default;
    the lab port's weighted micro-batches with ``--accumulation manual``), then one ``optim_step``.
    A non-finite input or result raises :class:`NonFiniteValues` before optim_step (the weights
    stay as they were)."""
    import pytrio as trio

    loss_fn_config: dict[str, object] | None = dict(config.loss_fn_config) or None
    problem = non_finite_inputs([item for call in calls for item in call])
    if problem:
        raise NonFiniteValues(f"{problem} (nothing was sent to forward_backward)")
    outputs, tokens = [], []
    for call in calls:
        data = [item.datum for item in call]
        options = {"loss_fn_config": loss_fn_config} if loss_fn_config else {}  # PyTRIO's defaults otherwise
        result = await (await client.forward_backward_async(data, loss_fn=config.loss_fn, **options))
        outputs.append(dict(result.metrics))
        tokens += learner_tokens(data, getattr(result, "loss_fn_outputs", None))
    problem = non_finite_outputs(outputs, [t.learned for t in tokens])
    if problem:
        raise NonFiniteValues(f"{problem}; optim_step was not called, so the weights are unchanged")
    adam = trio.AdamParams(learning_rate=config.learning_rate, beta1=config.beta1, beta2=config.beta2)
    optim = await (await client.optim_step_async(adam))
    return UpdateResult(outputs, {f"optim/{k}": float(v) for k, v in dict(optim.metrics).items()}, tokens,
                        sent=[list(call) for call in calls])


def substep_batches(num_datums: int, num_substeps: int, *, seed: int, step: int) -> list[list[int]]:
    """The datum indices of each mini-batch of step ``step``: with one substep all datums in
    order; otherwise a permutation drawn from ``(seed, step)`` divided into ``num_substeps`` parts
    whose sizes differ by at most one (empty parts left out)."""
    if num_substeps == 1:
        return [list(range(num_datums))] if num_datums else []
    order = list(range(num_datums))
    random.Random(f"substeps:{seed}:{step}").shuffle(order)
    size, extra = divmod(num_datums, num_substeps)
    bounds = [index * size + min(index, extra) for index in range(num_substeps + 1)]
    return [order[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


async def apply_substeps(client: TrainingClient, datums: list[TrainingDatum],
                         micro_batcher: MicroBatcher | None,
                         config: UpdateConfig, *, num_substeps: int, seed: int, step: int) -> UpdateResult:
    """One :func:`apply_update` per mini-batch (``micro_batcher``: how ``--accumulation manual``
    packs one into calls); the calls' metrics and trained tokens together, the optimiser's
    metrics averaged."""
    parts = substep_batches(len(datums), num_substeps, seed=seed, step=step)
    results: list[UpdateResult] = []
    for index, part in enumerate(parts):
        mini_batch = [datums[i] for i in part]
        calls = micro_batcher(mini_batch) if micro_batcher else [mini_batch]
        try:
            results.append(await apply_update(client, calls, config))
        except NonFiniteValues as error:
            if index == 0:
                raise
            raise NonFiniteValues(f"{error} (in mini-batch {index + 1} of {len(parts)}; the weights hold the "
                                  f"updates of the first {index})") from None
    keys = sorted({key for result in results for key in result.optim_metrics})
    optim = {key: fmean(r.optim_metrics[key] for r in results if key in r.optim_metrics) for key in keys}
    return UpdateResult([o for r in results for o in r.outputs], {**optim, "train/optimizer_steps": float(len(results))},
                        [t for r in results for t in r.tokens],
                        [r.tokens for r in results] if len(results) > 1 else [],
                        sent=[call for r in results for call in r.sent])
