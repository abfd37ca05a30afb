"""The per-token losses the twin computes, as Tinker documents them (PyTRIO mirrors its names).

Source: the Tinker documentation's loss pages (tinker-docs.thinkingmachines.ai, ``tinker/losses``,
``losses/ppo``, ``losses/cispo``, ``losses/dro``; read 2026-12). PyTRIO 0.2.9 accepts the same
names and sends ``loss_fn_config`` unchanged; what its server computes is not published, which
is why ``python cli.py probe-loss`` checks these definitions live.

Per active position (target ``!= -100``), with ``logp`` the learner's logprob of the target,
``q`` the sampler's logprob sent as ``logprobs``, ``A`` the advantage and the ratio
``r = exp(logp - q)``:

``importance_sampling``  term ``-r * A``; ``d term / d logp = -r * A``.

``ppo``                   term ``-min(r * A, clip(r, lo, hi) * A)`` with ``lo =
                          clip_low_threshold`` (default 0.8) and ``hi = clip_high_threshold``
                          (default 1.2): the thresholds are bounds on the *ratio*, not
                          epsilons. The gradient is ``-r * A`` where the unclipped objective
                          is the minimum, and 0 where the clipped one is (``A > 0`` and
                          ``r > hi``, or ``A < 0`` and ``r < lo``): such a token teaches
                          nothing more. With ``r == 1`` it equals ``importance_sampling``.

``cispo``                 term ``-sg(clip(r, lo, hi)) * A * logp``, same thresholds and
                          defaults: the clipped ratio is a stop-gradient *weight*, so every
                          token keeps a gradient ``-clip(r, lo, hi) * A`` (its size capped,
                          never zeroed, unlike ``ppo``).

``dro``                   term ``-(logp * A - beta / 2 * (logp - q) ** 2)``: a quadratic
                          penalty on the log-ratio, gradient ``-(A - beta * (logp - q))``.
                          Tinker does not state a default ``beta``; the twin assumes 0.05 (the
                          value of its documentation's example) and ``probe-loss`` measures
                          the live one.

``cross_entropy``         term ``-w * logp`` (supervised; ``weights`` default 1).

Every term is summed over the active positions of a call and divided by the call's
denominator (the twin's reduction switch, :mod:`searchr1.twin.policy`), exactly as before.
A loss name or ``loss_fn_config`` key not listed in :data:`LOSS_CONFIG_DEFAULTS` is refused by
:func:`resolve_loss_config` with the keys that loss does take.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

# The documented keys of each loss and the twin's defaults for them.
LOSS_CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
    "cross_entropy": {},
}
POLICY_LOSSES = ("importance_sampling", "ppo", "cispo", "dro")


class LossConfigError(ValueError):
    """A loss name or ``loss_fn_config`` the twin cannot compute; the message says what it takes."""


def resolve_loss_config(loss_fn: str, config: Mapping[str, object] | None, *, strict: bool = True) -> dict[str, float]:
    """The full configuration of ``loss_fn``: its defaults overridden by ``config``.

    Raises :class:`LossConfigError` for an unknown loss, a value that is not a finite number,
    clip thresholds with ``lo > hi`` or ``lo < 0``, a negative ``beta``, and (``strict``) a key
    the loss does not take; without ``strict`` unknown keys are ignored, as a lenient server
    would.
    """
    name = loss_fn.strip().lower()
    if name not in LOSS_CONFIG_DEFAULTS:
        raise LossConfigError(f"loss_fn {loss_fn!r} is not one the twin computes; choose one of "
                              f"{', '.join(LOSS_CONFIG_DEFAULTS)}")
    defaults = LOSS_CONFIG_DEFAULTS[name]
    resolved = dict(defaults)
    for key, value in (config or {}).items():
        if key not in defaults:
            if strict:
                takes = ", ".join(defaults) if defaults else "no keys"
                raise LossConfigError(f"loss_fn_config key {key!r} is not one {name!r} takes ({takes}; "
                                      "Tinker's documented names)")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise LossConfigError(f"loss_fn_config {key}={value!r} for {name!r} must be a finite number")
        resolved[key] = float(value)
    if "clip_low_threshold" in resolved:
        low, high = resolved["clip_low_threshold"], resolved["clip_high_threshold"]
        if not 0.0 <= low <= high:
            raise LossConfigError(f"{name!r} needs 0 <= clip_low_threshold <= clip_high_threshold "
                                  f"(ratio bounds such as 0.8 and 1.2), got {low} and {high}")
    if resolved.get("beta", 0.0) < 0.0:
        raise LossConfigError(f"'dro' needs beta >= 0, got {resolved['beta']}")
    return resolved


def loss_terms(
    loss_fn: str,
    config: Mapping[str, float],
    logp: np.ndarray,
    old_logprobs: np.ndarray,
    advantages: np.ndarray,
    weights: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-position ``(term, d term / d logp)`` of one loss (see the module docstring).

    ``config`` is the output of :func:`resolve_loss_config`; the arrays are the active
    positions of one datum (or any aligned selection). Pure.
    """
    logp = np.asarray(logp, dtype=np.float64)
    if loss_fn == "cross_entropy":
        w = np.asarray(weights, dtype=np.float64)
        return -w * logp, -w
    advantage = np.asarray(advantages, dtype=np.float64)
    log_ratio = logp - np.asarray(old_logprobs, dtype=np.float64)
    ratio = np.exp(log_ratio)
    if loss_fn == "importance_sampling":
        terms = -ratio * advantage
        return terms, terms
    if loss_fn == "ppo":
        low, high = config["clip_low_threshold"], config["clip_high_threshold"]
        unclipped = ratio * advantage
        clipped = np.clip(ratio, low, high) * advantage
        # The clipped branch is constant in logp outside [lo, hi]; it is the minimum exactly
        # when clipping moved the ratio against the advantage's sign.
        frozen = ((advantage > 0) & (ratio > high)) | ((advantage < 0) & (ratio < low))
        return -np.minimum(unclipped, clipped), np.where(frozen, 0.0, -unclipped)
    if loss_fn == "cispo":
        weight = np.clip(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
        return -weight * advantage * logp, -weight * advantage
    if loss_fn == "dro":
        beta = config["beta"]
        return -(logp * advantage - 0.5 * beta * log_ratio**2), -(advantage - beta * log_ratio)
    raise LossConfigError(f"loss_fn {loss_fn!r} is not one the twin computes")
