"""One weights update: ``forward_backward`` (one call, or one per micro-batch with n_k/N weights)
and one ``optim_step``, refusing non-finite values before the optimiser sees them.

The loss is the run's ``--loss-fn`` with its ``--loss-fn-config``, sent as they are. The
learner's per-token logprobs that come back are compared with the sampler's
(:mod:`searchr1.health.diagnostics`): the sampler-learner mismatch of every metrics line.
"""

from __future__ import annotations

from typing import Any

from searchr1.core.datum import TrainingDatum
from searchr1.health.diagnostics import NonFiniteValues, learner_tokens, mismatch_metrics, non_finite_inputs, non_finite_outputs
from searchr1.training.packing import weight_micro_batch_for_global_mean


async def apply_update(client: Any, datums: list[TrainingDatum], micro_batches: list[list[TrainingDatum]] | None,
                       config: Any) -> tuple[list[dict[str, float]], dict[str, float], int]:
    """Returns each call's metrics, the optimiser's and mismatch metrics, and the number of
    forward_backward calls; a non-finite input or result raises :class:`NonFiniteValues`
    before optim_step (the weights stay as they were)."""
    import pytrio as trio

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
