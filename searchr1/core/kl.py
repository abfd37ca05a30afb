"""A KL penalty toward the base model, carried in the per-token advantages.

PyTRIO's built-in losses take no reference-model input, so the penalty goes where
tinker-cookbook puts it (its ``kl_penalty_coef``): into the advantages of the policy's own
tokens, which makes it work with every loss function. Per action token ``t`` (a position whose
advantage is not 0) with ``d_t = logp_sampler(t) - logp_base(t)``:

* ``k1``: ``kl_t = d_t`` (unbiased, can be negative);
* ``k3``: ``kl_t = exp(-d_t) + d_t - 1`` (non-negative, low variance; verl's ``low_var_kl``);

and the advantage becomes ``A_t - beta * (kl_t - mean_kl)``, where ``mean_kl`` is the mean of
``kl_t`` over every action token of the step: centred as tinker-cookbook centres it, so the
penalty moves probability between tokens instead of shifting the whole batch's advantages.

``logp_base`` comes from a sampler of the *base* weights (created once per run, and again on
resume, by :mod:`searchr1.training.base_model`) asked for prompt logprobs: one request per datum,
``max_tokens=1``, whose prompt is the datum's whole sequence (:func:`base_prompt`); ``prompt_logprobs[i]`` is the base model's logprob of token ``i``
given the tokens before it. ``logp_sampler`` is the datum's own ``logprobs`` (what the sampler
returned), so no extra request is paid for it.

Only datums the step sends are penalised (a degenerate group sends none); positions with
advantage 0 (prompt, observations) stay 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from searchr1.core.datum import TrainingDatum

KlEstimator = Literal["k1", "k3"]
KL_ESTIMATORS: tuple[KlEstimator, ...] = get_args(KlEstimator)


def kl_estimate(sampler_logprobs: np.ndarray, base_logprobs: np.ndarray, estimator: KlEstimator) -> np.ndarray:
    """Per-token estimate of ``KL(policy || base)`` from tokens the policy sampled (pure)."""
    d = np.asarray(sampler_logprobs, dtype=np.float64) - np.asarray(base_logprobs, dtype=np.float64)
    if estimator == "k1":
        return d
    if estimator == "k3":
        return np.expm1(-d) + d
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def _arrays(item: TrainingDatum) -> tuple[np.ndarray, np.ndarray]:
    inputs = item.datum.loss_fn_inputs
    return inputs["logprobs"].to_numpy().astype(np.float64), inputs["advantages"].to_numpy().astype(np.float64)


def penalize(
    datums: Sequence[TrainingDatum],
    base_logprobs: Sequence[np.ndarray],
    *,
    coef: float,
    estimator: KlEstimator,
) -> tuple[list[TrainingDatum], dict[str, float]]:
    """The datums with ``A_t - coef * (kl_t - mean_kl)`` on action tokens, and the metrics
    ``kl/policy_base`` (mean over action tokens, the chosen estimator), ``kl/policy_base_k1``,
    ``kl/policy_base_k3`` and ``kl/penalty_share`` (sum of |penalty| over sum of |A| on action
    tokens). ``base_logprobs[i]`` is aligned with datum ``i``'s positions. Pure."""
    from pytrio.types import Datum, TensorData

    if len(datums) != len(base_logprobs):
        raise ValueError(f"{len(datums)} datums but {len(base_logprobs)} base logprob arrays")
    masks, estimates, k1s, k3s = [], [], [], []
    for item, base in zip(datums, base_logprobs):
        sampler, advantages = _arrays(item)
        mask = advantages != 0.0
        if len(base) != len(sampler):
            raise ValueError(f"datum q{item.question_index}/g{item.group_index}: {len(base)} base logprobs for "
                             f"{len(sampler)} positions")
        masks.append(mask)
        estimates.append(kl_estimate(sampler[mask], base[mask], estimator))
        k1s.append(kl_estimate(sampler[mask], base[mask], "k1"))
        k3s.append(kl_estimate(sampler[mask], base[mask], "k3"))
    tokens = sum(len(e) for e in estimates)
    if tokens == 0:
        return list(datums), {}
    mean_kl = math.fsum(float(v) for e in estimates for v in e) / tokens
    out: list[TrainingDatum] = []
    penalty_sum = advantage_sum = 0.0
    for item, mask, estimate in zip(datums, masks, estimates):
        _, advantages = _arrays(item)
        penalty = coef * (estimate - mean_kl)
        penalty_sum += float(np.abs(penalty).sum())
        advantage_sum += float(np.abs(advantages[mask]).sum())
        updated = advantages.copy()
        updated[mask] = advantages[mask] - penalty
        inputs = dict(item.datum.loss_fn_inputs)
        inputs["advantages"] = TensorData.from_numpy(updated.astype(np.float32))
        datum = Datum(model_input=item.datum.model_input, loss_fn_inputs=inputs)
        out.append(dataclasses.replace(item, datum=datum, loss_tokens=int(np.count_nonzero(updated))))
    metrics = {
        "kl/policy_base": mean_kl,
        "kl/policy_base_k1": math.fsum(float(v) for e in k1s for v in e) / tokens,
        "kl/policy_base_k3": math.fsum(float(v) for e in k3s for v in e) / tokens,
        "kl/penalty_share": penalty_sum / advantage_sum,  # > 0: an action token's advantage is not 0
        "kl/action_tokens": float(tokens),
    }
    return out, metrics


def base_prompt(item: TrainingDatum) -> list[int]:
    """The datum's whole token sequence (its input plus the last target)."""
    tokens = item.datum.model_input.to_ints()
    targets = item.datum.loss_fn_inputs["target_tokens"].data
    return [*tokens, int(targets[-1])]


def aligned_base_logprobs(prompt_logprobs: Sequence[float | None], positions: int) -> np.ndarray:
    """Datum position ``j`` predicts sequence token ``j + 1``: its base logprob is
    ``prompt_logprobs[j + 1]`` (``None``, which a service may send for any position, reads as 0)."""
    if len(prompt_logprobs) < positions + 1:
        raise ValueError(f"the base sampler returned {len(prompt_logprobs)} prompt logprobs for a sequence of "
                         f"{positions + 1} tokens")
    return np.asarray([0.0 if v is None else float(v) for v in prompt_logprobs[1: positions + 1]], dtype=np.float64)
