"""One step's weights update: ``--num-substeps N`` mini-batches (default 1), each its own
``forward_backward`` (one call, or one per micro-batch with n_k/N weights) and ``optim_step``,
refusing non-finite values before the optimiser sees them.

Substeps. The step's datums are put in an order drawn from the run's seed and the step index
(so a resumed run repeats it exactly) and cut into N mini-batches of near-equal size (fewer when
there are fewer datums than N). Each mini-batch is one update: ``sdk`` accumulation sends it in
one ``forward_backward``, which PyTRIO normalises by that mini-batch's own totals; ``manual``
packs the mini-batch into its own first-fit-decreasing micro-batches, weighted by n_k over the
mini-batch's datum count, so each mini-batch is its own mean too. The first mini-batch trains on
the weights that sampled it (ratio 1 on-policy); every later one trains on weights the earlier
updates moved, so its importance ratio leaves 1 and the clipping of ``ppo`` and ``cispo``
engages, as with Search-R1's several mini-batch updates per rollout batch and tinker-cookbook's
``num_substeps``.

The loss is the run's ``--loss-fn`` with its ``--loss-fn-config``, sent as they are. The
learner's per-token logprobs that come back are compared with the sampler's
(:mod:`searchr1.health.diagnostics`): the sampler-learner mismatch of every metrics line, and
with N > 1 the clipped fraction of each mini-batch (``health/clipped_fraction/substep_<i>``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from statistics import fmean
from typing import Any

from searchr1.core.datum import TrainingDatum
from searchr1.health.diagnostics import (
    NonFiniteValues,
    TrainedTokens,
    learner_tokens,
    mismatch_metrics,
    non_finite_inputs,
    non_finite_outputs,
)
from searchr1.training.packing import pack_micro_batches, weight_micro_batch_for_global_mean


def substep_batches(num_datums: int, num_substeps: int, *, seed: int, step: int) -> list[list[int]]:
    """The datum indices of each mini-batch of step ``step``: with one substep all datums in
    their order; otherwise a permutation drawn from ``(seed, step)`` cut into ``num_substeps``
    parts whose sizes differ by at most one (empty parts left out)."""
    if num_substeps < 1:
        raise ValueError(f"num_substeps must be >= 1, got {num_substeps}")
    if num_substeps == 1:
        return [list(range(num_datums))] if num_datums else []
    order = list(range(num_datums))
    random.Random(f"substeps:{seed}:{step}").shuffle(order)
    size, extra = divmod(num_datums, num_substeps)
    parts, start = [], 0
    for index in range(num_substeps):
        end = start + size + (index < extra)
        if end > start:
            parts.append(order[start:end])
        start = end
    return parts


def _calls(mini_batch: list[TrainingDatum], micro_batches: Sequence[Sequence[TrainingDatum]] | None) -> list[list[Any]]:
    """The forward_backward calls of one mini-batch: one call (sdk), or one per micro-batch with
    advantages scaled by n_k over the mini-batch's datum count (manual)."""
    if micro_batches is None:
        return [[item.datum for item in mini_batch]]
    return [[item.datum for item in weight_micro_batch_for_global_mean(batch, len(mini_batch))]
            for batch in micro_batches]


async def apply_update(client: Any, datums: list[TrainingDatum], micro_batches: list[list[TrainingDatum]] | None,
                       config: Any, *, step: int = 0) -> tuple[list[dict[str, float]], dict[str, float], int]:
    """Returns each call's metrics, the optimiser's, mismatch and substep metrics, and the number
    of forward_backward calls. ``micro_batches`` (manual accumulation) is the packing of all
    ``datums``, used as it is with one substep. A non-finite input or result raises
    :class:`NonFiniteValues` before that mini-batch's optim_step (the weights keep the earlier
    mini-batches' updates only)."""
    import pytrio as trio

    loss_fn = getattr(config, "loss_fn", "importance_sampling")
    loss_fn_config = getattr(config, "loss_fn_config", None) or None
    num_substeps = int(getattr(config, "num_substeps", 1))
    problem = non_finite_inputs(datums)
    if problem:
        raise NonFiniteValues(f"{problem} (nothing was sent to forward_backward)")
    parts = substep_batches(len(datums), num_substeps, seed=int(getattr(config, "seed", 0)), step=step)
    adam = trio.AdamParams(learning_rate=config.learning_rate, beta1=config.beta1, beta2=config.beta2)
    options = {"loss_fn_config": loss_fn_config} if loss_fn_config else {}
    outputs: list[dict[str, float]] = []
    tokens: list[TrainedTokens] = []
    optimiser: list[dict[str, float]] = []
    substeps: dict[str, float] = {}
    calls = 0
    for index, part in enumerate(parts):
        mini_batch = [datums[i] for i in part]
        packed: Sequence[Sequence[TrainingDatum]] | None = micro_batches
        if num_substeps > 1 and micro_batches is not None:  # manual: this mini-batch's own micro-batches
            packed = pack_micro_batches(
                mini_batch, max_datum_tokens=config.rollout.max_trajectory_tokens,
                max_items=config.max_micro_batch_items, max_padded_tokens=config.max_micro_batch_padded_tokens)
        part_outputs, part_tokens = [], []
        for data in _calls(mini_batch, packed):
            result = await (await client.forward_backward_async(data, loss_fn=loss_fn, **options))
            part_outputs.append(dict(result.metrics))
            part_tokens += learner_tokens(data, getattr(result, "loss_fn_outputs", None))
            calls += 1
        problem = non_finite_outputs(part_outputs, [t.learned for t in part_tokens])
        if problem:
            kept = ("so the weights are unchanged" if index == 0 else
                    f"so the weights hold the updates of the first {index} of {len(parts)} mini-batches")
            where = f" in mini-batch {index + 1} of {len(parts)}" if len(parts) > 1 else ""
            raise NonFiniteValues(f"{problem}{where}; optim_step was not called, {kept}")
        optim = await (await client.optim_step_async(adam))
        optimiser.append({key: float(value) for key, value in dict(optim.metrics).items()})
        outputs += part_outputs
        tokens += part_tokens
        if num_substeps > 1:
            clipped = mismatch_metrics(part_tokens, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
            if "health/clipped_fraction" in clipped:
                substeps[f"health/clipped_fraction/substep_{index}"] = clipped["health/clipped_fraction"]
    keys = sorted({key for entry in optimiser for key in entry})
    metrics = {f"optim/{key}": fmean(entry[key] for entry in optimiser if key in entry) for key in keys}
    metrics["train/optimizer_steps"] = float(len(optimiser))
    metrics.update(mismatch_metrics(tokens, loss_fn=loss_fn, loss_fn_config=loss_fn_config))
    metrics.update(substeps)
    return outputs, metrics, calls
