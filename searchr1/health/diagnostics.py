"""What a step tells about the policy's health, computed from what the step produced (pure
functions; :mod:`searchr1.health.rules` judges the numbers).

From the rollouts (every trajectory of the batch, trained or not):

* ``health/entropy``: the sampler's entropy estimate, the mean negative logprob of the
  sampled action tokens (an unbiased per-token estimate of the sampling distribution's
  entropy; a collapsing policy drives it toward 0, gibberish drives it up).
* ``health/action_tokens_mean`` and ``health/action_tokens_p95``: tokens the policy sampled
  per trajectory (all its turns); the 95th percentile is the nearest-rank one (the smallest
  value with at least 95% of the trajectories at or below it).
* ``health/repeated_turn_share``: the share of assistant turns whose completion repeats,
  token for token, an earlier turn of the same trajectory.

From the update, per trained action token (a position of a datum with a non-zero advantage),
with ``q`` the sampler's logprob and ``p`` the learner's (``loss_fn_outputs[i]["logprobs"]`` of
``forward_backward``) and ``ratio = exp(p - q)``:

* ``health/mismatch_k1``: mean of ``q - p`` (k1 estimate of KL(sampler || learner); may be
  negative on a few tokens);
* ``health/mismatch_k3``: mean of ``ratio - 1 - log(ratio)`` (k3: non-negative, low variance);
* ``health/ratio_max_deviation``: max ``|ratio - 1|``;
* ``health/clipped_fraction`` (clipping losses only): the share of tokens the loss clips.
  ``ppo`` clips a token when its ratio leaves ``[clip_low_threshold, clip_high_threshold]``
  on the side its advantage pushes (above with A > 0, below with A < 0); ``cispo`` clips the
  weight of every token outside the bounds. The bounds are ratio bounds, as Tinker documents
  them (``loss_fn_config``); without them :data:`DEFAULT_CLIP_BOUNDS` is assumed.

Non-finite values never reach ``optim_step``: :mod:`searchr1.core.datum` checks the sampler's
logprobs and :mod:`searchr1.core.update` the advantages sent and what ``forward_backward`` returned.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from searchr1.core.kl import kl_estimate  # the same k1/k3 estimators as the KL penalty
from searchr1.core.update import TrainedTokens
from searchr1.core.types import Trajectory

CLIPPING_LOSSES = ("ppo", "cispo")
DEFAULT_CLIP_BOUNDS = (0.8, 1.2)  # Tinker's example ratio bounds; the live service's default is unknown
LossFnConfig = Mapping[str, float | int | str | bool]  # a loss's settings, as StepConfig.loss_fn_config holds them


def mean(values: Iterable[float]) -> float:
    """The exact mean (``math.fsum``: the order of the values cannot matter); 0 when empty."""
    values = list(values)
    return math.fsum(values) / len(values) if values else 0.0


def nearest_rank_percentile(values: Sequence[float], percent: float) -> float:
    """The smallest value with at least ``percent``% of ``values`` at or below it (0 if empty)."""
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], got {percent}")
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[max(math.ceil(percent / 100 * len(ordered)) - 1, 0)])


def action_tokens(trajectory: Trajectory) -> int:
    return sum(len(turn.completion_tokens) for turn in trajectory.turns)


def entropy_estimate(trajectories: Iterable[Trajectory]) -> float:
    """Mean of ``-logprob`` over every sampled action token (0 when nothing was sampled)."""
    values = [-float(v) for t in trajectories for turn in t.turns for v in turn.logprobs]
    return mean(values)


def repeated_turn_share(trajectories: Iterable[Trajectory]) -> float:
    """Share of assistant turns that repeat an earlier turn of their trajectory verbatim."""
    turns = repeats = 0
    for trajectory in trajectories:
        seen: set[tuple[int, ...]] = set()
        for turn in trajectory.turns:
            key = tuple(turn.completion_tokens)
            turns += 1
            repeats += key in seen
            seen.add(key)
    return repeats / turns if turns else 0.0


def policy_diagnostics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The rollout half of a step's health diagnostics (see the module docstring)."""
    counts = [action_tokens(t) for t in trajectories]
    return {
        "health/entropy": entropy_estimate(trajectories),
        "health/action_tokens_mean": mean([float(c) for c in counts]),
        "health/action_tokens_p95": nearest_rank_percentile(counts, 95),
        "health/repeated_turn_share": repeated_turn_share(trajectories),
    }


def clip_bounds(loss_fn: str, loss_fn_config: LossFnConfig | None) -> tuple[float, float] | None:
    """The ratio bounds a clipping loss applies, or None for a loss that does not clip."""
    if loss_fn not in CLIPPING_LOSSES:
        return None
    config = loss_fn_config or {}
    low = float(config.get("clip_low_threshold", DEFAULT_CLIP_BOUNDS[0]))
    high = float(config.get("clip_high_threshold", DEFAULT_CLIP_BOUNDS[1]))
    return low, high


def mismatch_metrics(
    tokens: Sequence[TrainedTokens], *, loss_fn: str = "importance_sampling",
    loss_fn_config: LossFnConfig | None = None,
) -> dict[str, float]:
    """Sampler-learner mismatch over every trained token of the step (empty if none)."""
    if not tokens:
        return {}
    sampled = np.concatenate([t.sampled for t in tokens])
    learned = np.concatenate([t.learned for t in tokens])
    advantages = np.concatenate([t.advantages for t in tokens])
    if sampled.size == 0:
        return {}
    log_ratio = learned - sampled
    ratio = np.exp(log_ratio)
    metrics = {
        "health/mismatch_k1": float(math.fsum(kl_estimate(sampled, learned, "k1")) / sampled.size),
        "health/mismatch_k3": float(math.fsum(kl_estimate(sampled, learned, "k3")) / sampled.size),
        "health/ratio_max_deviation": float(np.max(np.abs(ratio - 1.0))),
    }
    bounds = clip_bounds(loss_fn, loss_fn_config)
    if bounds is not None:
        low, high = bounds
        if loss_fn == "ppo":
            clipped = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
        else:
            clipped = (ratio < low) | (ratio > high)
        metrics["health/clipped_fraction"] = float(np.count_nonzero(clipped) / sampled.size)
    return metrics
