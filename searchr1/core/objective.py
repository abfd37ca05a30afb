"""The objective: what ``forward_backward`` optimises per trained token, for every loss the service
computes, with each term's gradient and the documented defaults of its settings.

Source: Tinker's loss pages (tinker-docs.thinkingmachines.ai: ``tinker/losses``, ``losses/ppo``,
``losses/cispo``, ``losses/dro``; read 2026-12). PyTRIO 0.2.9 mirrors their names and sends
``loss_fn_config`` unchanged; what its server computes is not published, so ``python cli.py
probe-loss`` checks these definitions on it. The offline twin computes its losses here.

Per active position (target ``!= -100``), with ``logp`` the learner's logprob of the target, ``q``
the sampler's (sent as ``logprobs``), ``A`` the advantage, ``r = exp(logp - q)`` and ``lo``, ``hi``
the ``clip_low_threshold`` and ``clip_high_threshold`` (bounds on the ratio, not epsilons); the
gradient is ``d term / d logp``:

* ``importance_sampling``: term ``-r * A``, gradient ``-r * A``.
* ``ppo``: term ``-min(r * A, clip(r, lo, hi) * A)``. The gradient is ``-r * A`` where the
  unclipped objective is the minimum and 0 where the clipped one is (``A > 0`` and ``r > hi``, or
  ``A < 0`` and ``r < lo``): such a token teaches nothing more. At ``r == 1`` it is
  ``importance_sampling``.
* ``cispo``: term ``-sg(clip(r, lo, hi)) * A * logp``: the clipped ratio is a stop-gradient
  weight, so every token keeps a gradient, ``-clip(r, lo, hi) * A`` (capped, never zeroed).
* ``dro``: term ``-(logp * A - beta / 2 * (logp - q) ** 2)``, a quadratic pull toward the
  sampler; gradient ``-(A - beta * (logp - q))``.
* ``cross_entropy``: term ``-w * logp`` (supervised, ``w`` the ``weights``), gradient ``-w``.

A call's terms are summed over its active positions and divided by the call's denominator (the
service's reduction). The defaults are :data:`LOSS_CONFIG_DEFAULTS`: Tinker's bounds 0.8 and 1.2;
Tinker states no ``beta``, so 0.05, its example's, stands in (``probe-loss`` reads the live one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, get_args

import numpy as np

LossFn = Literal["importance_sampling", "ppo", "cispo", "dro"]  # the policy losses PyTRIO accepts
POLICY_LOSS_FNS: tuple[LossFn, ...] = get_args(LossFn)
DEFAULT_LOSS_FN: LossFn = "importance_sampling"  # the lab port's

# Every loss defined here: the loss_fn_config keys it takes (Tinker's names), with their defaults.
LOSS_CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
    "cross_entropy": {},
}


class LossConfigError(ValueError):
    """A loss name or ``loss_fn_config`` not defined here; the message says what is."""


def resolve_loss_config(loss_fn: str, config: Mapping[str, object] | None, *,
                        strict: bool = True) -> dict[str, float]:
    """The full configuration of ``loss_fn``: its defaults overridden by ``config``.

    Raises :class:`LossConfigError` for an unknown loss, a value that is not a finite number,
    clip thresholds with ``lo > hi`` or ``lo < 0``, a negative ``beta``, and (``strict``) a key
    the loss does not take; without ``strict`` such a key is ignored, as a lenient server would.
    """
    name = loss_fn.strip().lower()
    if name not in LOSS_CONFIG_DEFAULTS:
        raise LossConfigError(f"loss_fn {loss_fn!r} is not one the objective defines; choose one "
                              f"of {', '.join(LOSS_CONFIG_DEFAULTS)}")
    defaults = LOSS_CONFIG_DEFAULTS[name]
    resolved = dict(defaults)
    for key, value in (config or {}).items():
        if key not in defaults:
            if strict:
                takes = ", ".join(defaults) if defaults else "no keys"
                raise LossConfigError(f"loss_fn_config key {key!r} is not one {name!r} takes "
                                      f"({takes}; Tinker's documented names)")
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(float(value))):
            raise LossConfigError(f"loss_fn_config {key}={value!r} for {name!r} must be a finite "
                                  "number")
        resolved[key] = float(value)
    if "clip_low_threshold" in resolved:
        low, high = resolved["clip_low_threshold"], resolved["clip_high_threshold"]
        if not 0.0 <= low <= high:
            raise LossConfigError(f"{name!r} needs 0 <= clip_low_threshold <= clip_high_threshold "
                                  f"(ratio bounds such as 0.8 and 1.2), got {low} and {high}")
    if resolved.get("beta", 0.0) < 0.0:
        raise LossConfigError(f"'dro' needs beta >= 0, got {resolved['beta']}")
    return resolved


def loss_terms(loss_fn: str, config: Mapping[str, float], logp: np.ndarray,
               old_logprobs: np.ndarray, advantages: np.ndarray,
               weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position, ``(term, d term / d logp)`` of ``loss_fn`` (the definitions above).

    ``config`` is what :func:`resolve_loss_config` returns; the arrays are aligned (the active
    positions of a datum, or any selection of them). Pure.
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
    raise LossConfigError(f"loss_fn {loss_fn!r} is not one the objective defines")
